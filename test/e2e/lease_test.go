package e2e

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sandbox-broker/sandbox-broker/internal/devstack"
	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// leaseSeconds is the active timeout of TestLeaseRenewedOrLost's stack:
// a lease not renewed ends this long after its acquire.
const leaseSeconds = 20

// TestLeaseRenewedOrLost runs two threads at once on a stack whose
// leases last 20 s (SANDBOX_ACTIVE_TIMEOUT_SECONDS), with reconcile every
// few seconds. The first renews through the Go client's KeepAlive and
// keeps its sandbox for 90 s: its background process still runs and its
// file is intact. The second does not renew and loses its sandbox soon
// after its lease ends, long before the provider's timer (two minutes
// later) would end it: a sandbox.expiring event comes first, its outputs
// are in S3, and the thread's next acquire names the sandbox and why it
// ended.
func TestLeaseRenewedOrLost(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, stackOptions{provider: "e2b", schedule: 3 * time.Second, env: []string{
		"SANDBOX_REPLICAS=3", "SANDBOX_OVERFLOW_POLICY=reject", "LOG_LEVEL=DEBUG",
		"SANDBOX_ACTIVE_TIMEOUT_SECONDS=" + strconv.Itoa(leaseSeconds), "SANDBOX_EXPIRING_LEAD_SECONDS=10",
	}})
	t.Run("runs", func(t *testing.T) {
		t.Run("renewed", func(t *testing.T) {
			t.Parallel()
			renewedRun(t, s)
		})
		t.Run("unrenewed", func(t *testing.T) {
			t.Parallel()
			unrenewedRun(t, s)
		})
	})
}

// renewedRun holds a sandbox for 90 s, renewing it with KeepAlive, and
// checks that its background process and its file lasted.
func renewedRun(t *testing.T, s *devstack.Stack) {
	a := newAPI(t, s)
	cl, err := client.New(s.Info.APIURL, tokenA, client.WithHTTPClient(a.http))
	if err != nil {
		t.Fatal(err)
	}
	r := a.acquire(tokenA, "alice", "renewed")
	want(t, "acquire", r, 200)
	c := connOf(r)
	start := time.Now()
	ka := cl.KeepAlive(context.Background(), c.id, leaseSeconds*time.Second)
	defer ka.Stop()

	content := "kept " + strconv.FormatInt(time.Now().UnixNano(), 10)
	if out, code := run(t, c, `echo `+content+` > "$HOME/outputs/kept.txt" && echo written`); code != 0 || out != "written\n" {
		t.Fatalf("write outputs/kept.txt: %q exit %d", out, code)
	}
	background(t, c, `n=0; while :; do n=$((n+1)); echo $n > "$HOME/ticks"; sleep 0.2; done`)
	ticksAdvance(t, c, "at the start")

	// 90 s of a run's life, the sandbox checked every few seconds.
	for time.Since(start) < 90*time.Second {
		select {
		case <-ka.Done():
			t.Fatalf("the keep-alive stopped after %s: %v", time.Since(start).Round(time.Second), ka.Err())
		case <-time.After(5 * time.Second):
		}
		if rec := a.do("GET", "/v1/sandboxes/"+c.id, tokenA, ""); str(rec.body, "state") != "active" {
			t.Fatalf("after %s the renewed sandbox is %s, want active", time.Since(start).Round(time.Second), rec.raw)
		}
	}
	ticksAdvance(t, c, "after 90 s")
	if out, code := run(t, c, `cat "$HOME/outputs/kept.txt"`); code != 0 || out != content+"\n" {
		t.Errorf("outputs/kept.txt after 90 s: %q exit %d, want %q", out, code, content)
	}
	if err := ka.Err(); err != nil {
		t.Errorf("a renewal failed: %v", err)
	}
	r = a.acquire(tokenA, "alice", "renewed")
	if str(r.body, "source") != "reused" || str(r.body, "sandbox_id") != c.id {
		t.Errorf("acquire after 90 s: %s, want %s reused", r.raw, c.id)
	}
	if err := ka.Stop(); err != nil {
		t.Errorf("keep-alive: %v", err)
	}
	want(t, "release", a.do("POST", "/v1/sandboxes/"+c.id+"/release", tokenA, ""), 200)
}

// ticksAdvance waits (bounded) for the background loop's counter to
// move: the process runs.
func ticksAdvance(t *testing.T, c conn, step string) {
	t.Helper()
	ticks := func() string {
		out, code := run(t, c, `cat "$HOME/ticks" 2>/dev/null || echo none`)
		if code != 0 {
			t.Fatalf("%s: read ticks: exit %d", step, code)
		}
		return strings.TrimSpace(out)
	}
	first := ticks()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if now := ticks(); now != first && now != "none" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the background process does not run (ticks stay %s)", step, first)
		}
	}
}

// unrenewedRun holds a sandbox without renewing it and checks how it is
// lost: warned first, its outputs stored, its end named to the thread.
func unrenewedRun(t *testing.T, s *devstack.Stack) {
	a := newAPI(t, s)
	const user, thread = "bob", "unrenewed"
	r := a.acquire(tokenA, user, thread)
	want(t, "acquire", r, 200)
	c := connOf(r)
	acquired := time.Now()
	content := "lost " + strconv.FormatInt(time.Now().UnixNano(), 10)
	if out, code := run(t, c, `echo `+content+` > "$HOME/outputs/lost.txt" && echo written`); code != 0 || out != "written\n" {
		t.Fatalf("write outputs/lost.txt: %q exit %d", out, code)
	}

	// The provider's timer ends two minutes after the lease: a loss well
	// before that is the broker's doing.
	deadline := acquired.Add(leaseSeconds*time.Second + 60*time.Second)
	var rec reply
	for {
		rec = a.do("GET", "/v1/sandboxes/"+c.id, tokenA, "")
		if str(rec.body, "state") == "gone" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unrenewed sandbox is still %s %s after its acquire", rec.raw, time.Since(acquired).Round(time.Second))
		}
		time.Sleep(time.Second)
	}
	t.Logf("unrenewed sandbox gone %s after its acquire (lease %d s)", time.Since(acquired).Round(time.Second), leaseSeconds)
	reason := str(rec.body, "end_reason")
	if reason != "provider_timeout" {
		t.Errorf("record of the lost sandbox: %s; want end_reason provider_timeout", rec.raw)
	}
	checkWarnedThenLost(t, s, c.id)
	checkStored(t, s, user+"/"+thread+"/outputs/lost.txt", content+"\n")

	next := a.acquire(tokenA, user, thread)
	want(t, "next acquire", next, http.StatusOK)
	if str(next.body, "sandbox_id") == c.id || str(next.body, "previous", "sandbox_id") != c.id || str(next.body, "previous", "reason") != reason {
		t.Errorf("next acquire: %s; want a new sandbox naming previous %s, reason %s", next.raw, c.id, reason)
	}
	want(t, "release", a.do("POST", "/v1/sandboxes/"+str(next.body, "sandbox_id")+"/release", tokenA, ""), 200)
}

// checkWarnedThenLost wants, among id's events, a sandbox.expiring before
// its sandbox.lost.
func checkWarnedThenLost(t *testing.T, s *devstack.Stack, id string) {
	t.Helper()
	var kinds []string
	for _, ev := range stackEvents(t, s) {
		if ev.Detail.SandboxID == id {
			kinds = append(kinds, ev.DetailType)
		}
	}
	expiring, lost := -1, -1
	for i, k := range kinds {
		switch {
		case k == "sandbox.expiring" && expiring < 0:
			expiring = i
		case k == "sandbox.lost" && lost < 0:
			lost = i
		}
	}
	if expiring < 0 || lost < 0 || expiring > lost {
		t.Errorf("events of %s: %v; want a sandbox.expiring before a sandbox.lost", id, kinds)
	}
}

// checkStored wants the S3 object of the thread path key (tenantA's)
// to hold content.
func checkStored(t *testing.T, s *devstack.Stack, key, content string) {
	t.Helper()
	key = s.Info.S3.Prefix + "/" + tenantA + "/" + key
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obj, err := devstack.S3Client(s.Info.S3).GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.Info.S3.Bucket), Key: aws.String(key)})
	if err != nil {
		t.Errorf("S3 GetObject %s: %v", key, err)
		return
	}
	defer obj.Body.Close()
	got, err := io.ReadAll(obj.Body)
	if err != nil || string(got) != content {
		t.Errorf("S3 object %s = %q (%v), want %q", key, got, err, content)
	}
}
