package e2b

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// TestListPageWalksTheInventoryWithACursor: ListPage reads one page per
// call and hands back X-Next-Token as the cursor; following it visits
// every matching sandbox once.
func TestListPageWalksTheInventoryWithACursor(t *testing.T) {
	c, _ := startHost(t, func(o *Options) { o.ListPageSize = 10 })
	ctx := context.Background()
	var want []string
	for i := range 5 {
		dep := "d1"
		if i == 4 {
			dep = "d2"
		}
		ref, err := c.Create(ctx, core.CreateSpec{Timeout: time.Minute, Metadata: map[string]string{core.MetaDeployment: dep}})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		if dep == "d1" {
			want = append(want, ref.ID)
		}
	}
	f := core.ListFilter{Metadata: map[string]string{core.MetaDeployment: "d1"}}
	var got []string
	cursor, pages := "", 0
	for {
		page, next, err := c.ListPage(ctx, f, cursor, 3)
		if err != nil {
			t.Fatalf("ListPage(%q): %v", cursor, err)
		}
		pages++
		if len(page) > 3 {
			t.Fatalf("page of %d, want at most 3", len(page))
		}
		for _, s := range page {
			got = append(got, s.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") || pages != 2 {
		t.Errorf("walked %v in %d pages, want %v in 2", got, pages, want)
	}
}

// TestLocateReadsTheAccessToken: Locate gives a sandbox's envd endpoint
// with the access token its create returned, and ErrSandboxGone for a
// sandbox that is no more.
func TestLocateReadsTheAccessToken(t *testing.T) {
	c, _ := startHost(t, nil)
	ctx := context.Background()
	ref, err := c.Create(ctx, core.CreateSpec{Timeout: time.Minute})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	ep, err := c.Locate(ctx, ref.ID)
	if err != nil || ep != ref.Endpoint || ep.AccessToken == "" {
		t.Errorf("Locate = %+v, %v; want the create's endpoint %+v", ep, err, ref.Endpoint)
	}
	if err := c.Kill(ctx, ref.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Locate(ctx, ref.ID); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Locate of a killed sandbox: %v; want ErrSandboxGone", err)
	}
}
