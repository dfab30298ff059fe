//go:build emulator

package dynamostore_test

import (
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/store/dynamostore"
)

// TestStreamCount: a principal's open streams are counted in the table
// across callers (the events function's instances): past the cap a stream
// is refused, another principal's is not, a closed one makes room, and one
// whose invocation died without closing stops counting at its end.
func TestStreamCount(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clk := clock.NewFake(time.Now())
	st, _, _ := newStore(t, dynamostore.Options{Clock: clk})
	end := clk.Now().Add(5 * time.Minute)
	first, ok, err := st.EnterStream(ctx, "alice", 2, end)
	if err != nil || !ok {
		t.Fatalf("alice's first stream: %v %v", ok, err)
	}
	// The second dies without closing: its item stays until its end.
	if _, ok, err := st.EnterStream(ctx, "alice", 2, clk.Now().Add(time.Minute)); err != nil || !ok {
		t.Fatalf("alice's second stream: %v %v", ok, err)
	}
	if _, ok, err := st.EnterStream(ctx, "alice", 2, end); err != nil || ok {
		t.Fatalf("alice's third stream: admitted %v (%v), want refused at 2", ok, err)
	}
	if _, ok, err := st.EnterStream(ctx, "bob", 2, end); err != nil || !ok {
		t.Fatalf("bob's stream beside alice's two: %v %v", ok, err)
	}
	if err := first(ctx); err != nil {
		t.Fatal(err)
	}
	third, ok, err := st.EnterStream(ctx, "alice", 2, end)
	if err != nil || !ok {
		t.Fatalf("alice's stream after one closed: %v %v", ok, err)
	}
	if _, ok, _ := st.EnterStream(ctx, "alice", 2, end); ok {
		t.Fatal("alice's fourth stream admitted with two open")
	}
	clk.Advance(2 * time.Minute) // the dead one's end has passed
	if _, ok, err := st.EnterStream(ctx, "alice", 2, end); err != nil || !ok {
		t.Fatalf("alice's stream after the dead one's end: %v %v", ok, err)
	}
	if err := third(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.EnterStream(ctx, "carol", 0, end); err != nil || !ok {
		t.Fatalf("no cap: %v %v", ok, err)
	}
}
