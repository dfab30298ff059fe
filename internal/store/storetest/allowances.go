package storetest

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/batchgen/batchgen/internal/store"
)

// RunAllowances holds an adapter to the store.Allowances contract: a
// ledger opened once per cap, takings bounded by what is left (all of it
// when less than wanted, none when less than needed), returns kept only
// under the cap they were taken under, and many takers at once never
// taking more than there is.
func RunAllowances(t *testing.T, newStore func(t *testing.T) store.Allowances) {
	t.Helper()
	near := func(t *testing.T, what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	t.Run("TakeAndReturn", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		id := newID("allowance")
		_, _, err := s.TakeAllowance(ctx, id, 10, 1, 3)
		wantErr(t, err, store.ErrNotFound, "take from a ledger never opened")
		noErr(t, s.OpenAllowance(ctx, id, 10, 2), "open")
		taken, left, err := s.TakeAllowance(ctx, id, 10, 1, 3)
		noErr(t, err, "take 3")
		near(t, "taken", taken, 3)
		near(t, "left", left, 5)
		taken, left, err = s.TakeAllowance(ctx, id, 10, 1, 10)
		noErr(t, err, "take more than is left")
		near(t, "taken when less is left than wanted", taken, 5)
		near(t, "left", left, 0)
		taken, left, err = s.TakeAllowance(ctx, id, 10, 0.5, 1)
		noErr(t, err, "take from an empty ledger")
		near(t, "taken from an empty ledger", taken, 0)
		near(t, "left", left, 0)
		noErr(t, s.ReturnAllowance(ctx, id, 10, 2.25), "return")
		taken, left, err = s.TakeAllowance(ctx, id, 10, 1, 1)
		noErr(t, err, "take after a return")
		near(t, "taken after a return", taken, 1)
		near(t, "left after a return", left, 1.25)
		// Opened again under the same cap by a process that came later:
		// the takings stand.
		noErr(t, s.OpenAllowance(ctx, id, 10, 0), "open again")
		_, left, err = s.TakeAllowance(ctx, id, 10, 0, 0)
		noErr(t, err, "look")
		near(t, "left after a second open under the same cap", left, 1.25)
		// A new cap: the ledger is opened again from what the rows cost, and
		// a return under the old cap is not counted twice.
		_, _, err = s.TakeAllowance(ctx, id, 20, 1, 1)
		wantErr(t, err, store.ErrNotFound, "take under a new cap before its open")
		noErr(t, s.OpenAllowance(ctx, id, 20, 9.5), "open under a new cap")
		noErr(t, s.ReturnAllowance(ctx, id, 10, 1), "return under the old cap")
		taken, left, err = s.TakeAllowance(ctx, id, 20, 0.5, 0.5)
		noErr(t, err, "take under the new cap")
		near(t, "taken under the new cap", taken, 0.5)
		near(t, "left under the new cap", left, 10)
	})
	t.Run("ManyTakers", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		id := newID("allowance")
		noErr(t, s.OpenAllowance(ctx, id, 7, 0), "open")
		var got atomic.Int64
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				taken, _, err := s.TakeAllowance(ctx, id, 7, 1, 1)
				if err != nil {
					t.Errorf("take: %v", err)
				}
				if taken > 0 {
					got.Add(1)
				}
			})
		}
		wg.Wait()
		if got.Load() != 7 {
			t.Errorf("20 takers of 1 from 7 took %d times, want 7", got.Load())
		}
	})
}
