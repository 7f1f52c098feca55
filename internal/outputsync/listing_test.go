package outputsync

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

func TestParseMtimeNs(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		// GNU find 4.9 output, observed with touch -d on this machine.
		{"1720000000.1234567890", 1_720_000_000_123_456_789, false},
		{"0.0000000000", 0, false},
		{"-2.5000000000", -1_500_000_000, false}, // -1.5 s
		{"2.000000000", 2_000_000_000, false},    // 9 digits
		{"2.5", 2_500_000_000, false},            // short fraction padded
		{"2", 2_000_000_000, false},
		{"1720000000.123456789999", 1_720_000_000_123_456_789, false}, // extra digits dropped
		{"", 0, true},
		{".5", 0, true},
		{"2.", 0, true},
		{"2.5e3", 0, true},
		{"+2.5", 0, true},
		{" 2.5", 0, true},
		{"99999999999999999999.0", 0, true},
		{"9223372037.0", 0, true}, // overflows int64 ns
	}
	for _, tc := range tests {
		got, err := parseMtimeNs(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseMtimeNs(%q) = %d, %v; want %d, err=%v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseListing(t *testing.T) {
	out := []byte("13\t2.0000000000\t/home/user/outputs/a.pdf\x00" +
		"5\t1.5\t/home/user/outputs/tab\there\nnewline\x00" +
		"x\t1.0\t/home/user/outputs/bad-size\x00" +
		"5\t1.0\t\x00" + // empty path
		"5\t1.0\x00" + // two fields
		"\x00" + // empty record
		"7\t3.0\t/home/user/outputs/cut")
	files, bad, truncated := parseListing(out)
	want := []listedFile{
		{Size: 13, MtimeNs: 2_000_000_000, Path: "/home/user/outputs/a.pdf"},
		{Size: 5, MtimeNs: 1_500_000_000, Path: "/home/user/outputs/tab\there\nnewline"},
	}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("files = %+v, want %+v", files, want)
	}
	if len(bad) != 4 {
		t.Errorf("bad records = %q, want 4", bad)
	}
	if !truncated {
		t.Errorf("truncated = false, want true for a record without NUL")
	}
	if f, b, tr := parseListing(nil); f != nil || b != nil || tr {
		t.Errorf("empty listing = %v %v %v, want nothing", f, b, tr)
	}
}

func TestRelPath(t *testing.T) {
	const home = "/home/user"
	tests := []struct {
		abs  string
		want string // "" = refused
	}{
		{"/home/user/outputs/a.txt", "outputs/a.txt"},
		{"/home/user/workspace/d/e/f.bin", "workspace/d/e/f.bin"},
		{"/home/user/outputs/..hidden/...", "outputs/..hidden/..."},
		{"/home/user/outputs/ü space.txt", "outputs/ü space.txt"},
		{"/home/user/outputs/../x", ""},
		{"/home/user/outputs/a/../../x", ""},
		{"/home/user/outputs/./x", ""},
		{"/home/user/outputs//x", ""},
		{"/home/user/outputs/", ""},
		{"/home/user/outputs", ""},
		{"/home/user/outputs/x/", ""},
		{"/home/user/uploads/x", ""},
		{"/home/user/outputsx/x", ""},
		{"/home/userx/outputs/x", ""},
		{"/etc/passwd", ""},
		{"outputs/x", ""},
		{"/home/user/outputs/a\nb", ""},
		{"/home/user/outputs/a\tb", ""},
		{"/home/user/outputs/a\x00b", ""},
		{"/home/user/outputs/a\x7fb", ""},
		{"/home/user/outputs/a\u0085b", ""},
		{"/home/user/outputs/a\xffb", ""},
		{"/home/user/outputs/invoice\u202Efdp.exe", ""},     // right-to-left override
		{"/home/user/outputs/a\u200Bb", ""},                 // zero-width space
		{"/home/user/outputs/\uFEFFa", ""},                  // byte order mark
		{"/home/user/outputs/a\u00ADb", ""},                 // soft hyphen
		{"/home/user/outputs/a\U000E0001b", ""},             // language tag
		{"/home/user/outputs/a\u00A0b", "outputs/a\u00A0b"}, // no-break space is Zs, not Cf
	}
	for _, tc := range tests {
		got, err := relPath(home, tc.abs)
		if tc.want == "" {
			if err == nil {
				t.Errorf("relPath(%q) = %q, want refused", tc.abs, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("relPath(%q) = %q, %v; want %q", tc.abs, got, err, tc.want)
		}
	}
}

func TestKeys(t *testing.T) {
	k := core.ThreadKey{Tenant: "acme", User: "u1", Thread: "t1"}
	tests := []struct {
		prefix, wantObj, wantManifest string
	}{
		{"out", "out/acme/u1/t1/outputs/a.txt", "out/.broker/manifests/acme/u1/t1.json"},
		{"", "acme/u1/t1/outputs/a.txt", ".broker/manifests/acme/u1/t1.json"},
		{"a/b", "a/b/acme/u1/t1/outputs/a.txt", "a/b/.broker/manifests/acme/u1/t1.json"},
	}
	for _, tc := range tests {
		got, err := objectKey(tc.prefix, k, "outputs/a.txt")
		if err != nil || got != tc.wantObj {
			t.Errorf("objectKey(%q) = %q, %v; want %q", tc.prefix, got, err, tc.wantObj)
		}
		if got := manifestKey(tc.prefix, k); got != tc.wantManifest {
			t.Errorf("manifestKey(%q) = %q, want %q", tc.prefix, got, tc.wantManifest)
		}
	}
	if _, err := objectKey("out", k, "outputs/"+strings.Repeat("x", 1024)); err == nil {
		t.Errorf("objectKey accepted a key over 1024 bytes")
	}
	if got, err := cleanPrefix("/out/v1/"); err != nil || got != "out/v1" {
		t.Errorf("cleanPrefix = %q, %v; want out/v1", got, err)
	}
}

// TestBrokerObjectsOutsideEveryTenantTree: no thread prefix, whatever its
// tenant, user and thread ids (tenants named like the broker's segments
// included), is a prefix of any thread's manifest key.
func TestBrokerObjectsOutsideEveryTenantTree(t *testing.T) {
	ids := []string{"acme", "_manifests", "_broker", "broker", "manifests", "-", "_", "u1", "t1", "outputs", "workspace"}
	var keys []core.ThreadKey
	for _, a := range ids {
		for _, b := range ids {
			for _, c := range ids {
				k := core.ThreadKey{Tenant: a, User: b, Thread: c}
				if k.Validate() != nil {
					t.Fatalf("test id %v invalid", k)
				}
				keys = append(keys, k)
			}
		}
	}
	for _, prefix := range []string{"", "out"} {
		for _, owner := range keys {
			tp := threadPrefix(prefix, owner)
			for _, k := range keys {
				if m := manifestKey(prefix, k); strings.HasPrefix(m, tp) {
					t.Fatalf("manifest %q of %v lies under the tree %q of %v", m, k, tp, owner)
				}
			}
		}
	}
}

func TestDisplayPath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/home/user/outputs/a\nb", `outputs/a\nb`},
		{"/home/user/outputs/a\xffb", `outputs/a\xffb`},
		{"/etc/passwd", "/etc/passwd"},
	}
	for _, tc := range tests {
		if got := displayPath("/home/user", tc.in); got != tc.want {
			t.Errorf("displayPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	long := displayPath("/home/user", "/home/user/outputs/"+strings.Repeat("é", 300))
	if !utf8.ValidString(long) || len(long) > 260 {
		t.Errorf("long display path: valid=%v len=%d", utf8.ValidString(long), len(long))
	}
}

// FuzzParseListing: the parser never panics, every record is accounted for
// exactly once, and well-formed records round-trip.
func FuzzParseListing(f *testing.F) {
	f.Add([]byte("13\t1720000000.1234567890\t/home/user/outputs/a\x00"), int64(5), int64(7), "/home/user/outputs/x\ny")
	f.Add([]byte("\x00\x00\t\t\x00"), int64(0), int64(-1), "\t")
	f.Fuzz(func(t *testing.T, raw []byte, size, mtime int64, p string) {
		files, bad, truncated := parseListing(raw)
		records := bytes.Count(raw, []byte{0})
		if len(files)+len(bad) != records {
			t.Fatalf("%d files + %d bad != %d records", len(files), len(bad), records)
		}
		if truncated != (len(raw) > 0 && raw[len(raw)-1] != 0) {
			t.Fatalf("truncated = %v for %q", truncated, raw)
		}
		if size < 0 || p == "" || strings.IndexByte(p, 0) >= 0 || mtime > 1<<62 || mtime < -(1<<62) {
			return
		}
		sec, ns := mtime/1e9, mtime%1e9
		if ns < 0 {
			sec, ns = sec-1, ns+1e9
		}
		mt := fmt.Sprintf("%d.%09d0", sec, ns)
		if sec < 0 {
			mt = fmt.Sprintf("-%d.%09d0", -sec, ns)
		}
		rec := fmt.Sprintf("%d\t%s\t%s\x00", size, mt, p)
		got, gotBad, _ := parseListing([]byte(rec))
		if len(gotBad) != 0 || len(got) != 1 || got[0] != (listedFile{Size: size, MtimeNs: mtime, Path: p}) {
			t.Fatalf("round trip of %q = %+v (bad %q), want size %d mtime %d", rec, got, gotBad, size, mtime)
		}
	})
}

// FuzzObjectKey: any accepted path maps to a key under the thread prefix,
// inside a mirrored directory, without control characters, "." or ".."
// segments, and valid UTF-8.
func FuzzObjectKey(f *testing.F) {
	for _, s := range []string{"/home/user/outputs/a.txt", "/home/user/outputs/../x", "/home/user/workspace/a\nb", "/home/user/outputs/\xff"} {
		f.Add(s)
	}
	k := core.ThreadKey{Tenant: "acme", User: "u1", Thread: "t1"}
	f.Fuzz(func(t *testing.T, abs string) {
		rel, err := relPath("/home/user", abs)
		if err != nil {
			return
		}
		key, err := objectKey("out", k, rel)
		if err != nil {
			return
		}
		rest, ok := strings.CutPrefix(key, "out/acme/u1/t1/")
		if !ok {
			t.Fatalf("key %q outside the thread prefix", key)
		}
		if !strings.HasPrefix(rest, "outputs/") && !strings.HasPrefix(rest, "workspace/") {
			t.Fatalf("key %q outside the mirrored dirs", key)
		}
		if !utf8.ValidString(key) || strings.IndexFunc(key, unicode.IsControl) >= 0 {
			t.Fatalf("key %q has control characters or invalid UTF-8", key)
		}
		for _, seg := range strings.Split(rest, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("key %q has segment %q", key, seg)
			}
		}
		if "/home/user/"+rest != abs {
			t.Fatalf("key %q does not map back to %q", key, abs)
		}
	})
}
