package storetest

import (
	"slices"
	"time"
)

// testOutputsOwed: notes of owed outputs are listed oldest first, up to
// the limit; noting again keeps the first note's place; forgetting drops
// one (and forgetting none succeeds).
func testOutputsOwed(f *fixture) {
	owed := func(limit int) []string {
		f.t.Helper()
		ids, err := f.s.OutputsOwed(f.ctx, limit)
		if err != nil {
			f.t.Fatalf("OutputsOwed: %v", err)
		}
		return ids
	}
	if got := owed(10); len(got) != 0 {
		f.t.Fatalf("owed of an empty store = %v; want none", got)
	}
	for i, id := range []string{"sbx2", "sbx1", "sbx3"} {
		if err := f.s.NoteOutputsOwed(f.ctx, id, t0.Add(time.Duration(i)*time.Second)); err != nil {
			f.t.Fatalf("NoteOutputsOwed %s: %v", id, err)
		}
	}
	if err := f.s.NoteOutputsOwed(f.ctx, "sbx2", t0.Add(time.Minute)); err != nil {
		f.t.Fatalf("NoteOutputsOwed again: %v", err)
	}
	if got := owed(10); !slices.Equal(got, []string{"sbx2", "sbx1", "sbx3"}) {
		f.t.Errorf("owed = %v; want sbx2, sbx1, sbx3 (oldest note first)", got)
	}
	if got := owed(2); !slices.Equal(got, []string{"sbx2", "sbx1"}) {
		f.t.Errorf("owed up to 2 = %v; want sbx2, sbx1", got)
	}
	for _, id := range []string{"sbx1", "nope"} {
		if err := f.s.ForgetOutputsOwed(f.ctx, id); err != nil {
			f.t.Fatalf("ForgetOutputsOwed %s: %v", id, err)
		}
	}
	if got := owed(10); !slices.Equal(got, []string{"sbx2", "sbx3"}) {
		f.t.Errorf("owed after forgetting sbx1 = %v; want sbx2, sbx3", got)
	}
}
