package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRowSlotsTakeTurns: with the one slot held, three waiters of alice's
// and then one of bob's are granted alice, bob, alice, alice; a waiter
// whose context ends leaves the line; and the slots all come back.
func TestRowSlotsTakeTurns(t *testing.T) {
	t.Parallel()
	s := newRowSlots(1)
	ctx := t.Context()
	if !s.acquire(ctx, "alice") {
		t.Fatal("the free slot was not granted")
	}
	granted := make(chan string, 5)
	waiters := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		n := 0
		for _, ws := range s.waiting {
			n += len(ws)
		}
		return n
	}
	wait := func(owner string, ctx context.Context) {
		before := waiters()
		go func() {
			if s.acquire(ctx, owner) {
				granted <- owner
			} else {
				granted <- owner + " gave up"
			}
		}()
		// In line before the next waiter comes.
		for deadline := time.Now().Add(5 * time.Second); waiters() == before; {
			if time.Now().After(deadline) {
				t.Fatalf("%s's waiter never got in line", owner)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for range 3 {
		wait("alice", ctx)
	}
	quitting, quit := context.WithCancel(ctx)
	wait("carol", quitting)
	wait("bob", ctx)
	quit()
	if got := <-granted; got != "carol gave up" {
		t.Fatalf("first answer %q, want carol giving up", got)
	}
	var order []string
	for range 4 {
		s.release()
		order = append(order, <-granted)
	}
	if diff := cmp.Diff([]string{"alice", "bob", "alice", "alice"}, order); diff != "" {
		t.Errorf("grants (-want +got):\n%s", diff)
	}
	s.release()
	if s.free != 1 || len(s.turns) != 0 || len(s.waiting) != 0 {
		t.Errorf("after every release: %d free, turns %v, waiting %v; want the one slot back and nobody waiting", s.free, s.turns, s.waiting)
	}
}
