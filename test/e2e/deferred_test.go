package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sandbox-broker/sandbox-broker/internal/devstack"
)

// TestDeferredOutputsStoredBeforeExpiry: with a 60 s idle timeout, a
// release whose copy is capped at 250 files defers most of 4,000 small
// outputs. Reconcile, every 5 s, copies 250 a pass from the next pass on,
// so the copy needs at least 15 passes, over 70 s: longer than the
// provider timer the release set. Reconcile moves that timer (the
// record's expires_at goes past the idle timeout) and destroys the
// sandbox only once every file is in S3.
func TestDeferredOutputsStoredBeforeExpiry(t *testing.T) {
	t.Parallel()
	const files, perPass = 4000, 250
	s := startStackWith(t, stackOptions{provider: "e2b", schedule: 5 * time.Second, env: []string{
		"SANDBOX_REPLICAS=1", "SANDBOX_OVERFLOW_POLICY=reject", "SANDBOX_IDLE_TIMEOUT_SECONDS=60",
		"SYNC_MAX_FILES=" + strconv.Itoa(perPass),
	}})
	a := newAPI(t, s)
	const user, thread = "alice", "many-files"
	r := a.acquire(tokenA, user, thread)
	want(t, "acquire", r, 200)
	c := connOf(r)
	script := fmt.Sprintf(`mkdir -p "$HOME/outputs/many" && cd "$HOME/outputs/many" && for i in $(seq 1 %d); do echo "file $i" > "f$i.txt"; done && ls | wc -l`, files)
	if out, code := run(t, c, script); code != 0 || strings.TrimSpace(out) != strconv.Itoa(files) {
		t.Fatalf("write %d files: exit %d, stdout %q", files, code, out)
	}

	r = a.do("POST", "/v1/sandboxes/"+c.id+"/release", tokenA, "")
	want(t, "release", r, 200)
	sync, _ := r.body["sync"].(map[string]any)
	deferred, _ := sync["deferred"].([]any)
	if str(r.body, "state") != "warm" || sync["complete"] != false || len(deferred) == 0 || sync["uploaded"] != float64(perPass) {
		t.Fatalf("release: %s; want warm, an incomplete sync of %d uploads, the rest deferred", r.raw, perPass)
	}
	prefix := s.Info.S3.Prefix + "/" + tenantA + "/" + user + "/" + thread + "/outputs/many/"
	t.Logf("released at %s: %d objects stored, the rest deferred", time.Now().UTC().Format(time.TimeOnly), countObjects(t, s, prefix))

	rec := waitDestroyed(t, a, c.id)
	if n := countObjects(t, s, prefix); n != files {
		t.Errorf("objects under %s when the sandbox was %s: %d, want %d", prefix, str(rec.body, "state"), n, files)
	}
	if reason := str(rec.body, "end_reason"); reason != "idle_expired" {
		t.Errorf("end_reason %q, want idle_expired (record %s)", reason, rec.raw)
	}
}

// waitDestroyed polls the sandbox's record until it is destroying or gone
// and returns that reply. While it is warm it checks that reconcile moved
// its end past the idle timeout before the end: the copy outlasts the
// timer the release set.
func waitDestroyed(t *testing.T, a api, id string) reply {
	t.Helper()
	var parked, latest time.Time
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		r := a.do("GET", "/v1/sandboxes/"+id, tokenA, "")
		want(t, "get record", r, 200)
		switch st := str(r.body, "state"); st {
		case "destroying", "gone":
			if limit := parked.Add(60 * time.Second); !latest.After(limit) {
				t.Errorf("the record's end stayed at %s, never past the idle timeout (%s): the timer was not moved", latest, limit)
			}
			t.Logf("%s at %s (parked %s, latest end %s)", st, time.Now().UTC().Format(time.TimeOnly), parked.Format(time.TimeOnly), latest.Format(time.TimeOnly))
			return r
		case "warm":
			p, perr := time.Parse(time.RFC3339, str(r.body, "parked_at"))
			e, eerr := time.Parse(time.RFC3339, str(r.body, "expires_at"))
			if perr != nil || eerr != nil {
				t.Fatalf("warm record %s: parked_at %v, expires_at %v", r.raw, perr, eerr)
			}
			parked = p
			if e.After(latest) {
				latest = e
			}
		default:
			t.Fatalf("record %s, want warm until it is destroyed", r.raw)
		}
	}
	t.Fatalf("sandbox %s still warm after 5 minutes", id)
	return reply{}
}

// countObjects counts the S3 objects under prefix.
func countObjects(t *testing.T, s *devstack.Stack, prefix string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := 0
	pages := s3.NewListObjectsV2Paginator(devstack.S3Client(s.Info.S3), &s3.ListObjectsV2Input{
		Bucket: aws.String(s.Info.S3.Bucket), Prefix: aws.String(prefix)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			t.Fatalf("list %s: %v", prefix, err)
		}
		n += len(page.Contents)
	}
	return n
}
