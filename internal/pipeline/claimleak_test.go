package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// stalledCache answers no lookup before its caller gives up: a cache store
// slower than the invocation's deadline.
type stalledCache struct{ store.Cache }

func (stalledCache) GetCached(ctx context.Context, _ []string) (map[string]string, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestDeadlineDuringCacheLookupReleasesTheClaim: an attempt that runs out of
// time while it looks the batch's rows up in the cache hands its claim
// back, so the next delivery claims the batch at once. Before, the batch
// stayed leased to the dead attempt: the next delivery counted a lost claim
// and dropped its message, and the batch waited for the lease to expire
// (seen as a slow-model job stuck on the emulator under load).
func TestDeadlineDuringCacheLookupReleasesTheClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, pipeline.GeneratorConfig{Lease: time.Hour})
	id := e.splitProducts("cache-deadline", "{{name}}", 3, 10).TaskID
	stalled := newEnv(t, nil, pipeline.GeneratorConfig{Lease: time.Hour, Cache: stalledCache{e.store}})
	gen := pipeline.NewGenerator(e.store, stalled.provider, e.signal, stalled.cfg)

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	msg := pipeline.Delivery{Body: pipeline.EncodeBatchMessage(id, 1), ReceiveCount: 1}
	if out := gen.Process(ctx, msg); out.Err == nil {
		t.Fatalf("outcome %+v, want the deadline's error", out)
	}
	b, err := e.store.GetBatch(t.Context(), id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.State == store.BatchRunning {
		t.Fatalf("batch is %s, leased until %v, after its attempt gave up: want it handed back", b.State, b.LeaseUntil)
	}
	// The next delivery claims it and finishes it.
	msg.ReceiveCount = 2
	if out := e.gen.Process(t.Context(), msg); !out.Ack || out.Err != nil {
		t.Fatalf("next delivery: %+v, want the batch done", out)
	}
}

// lateClaimStore applies every claim at once but answers it only after
// delay, or never if its caller gives up first: a claim the store made
// whose answer came too late for the invocation.
type lateClaimStore struct {
	store.Store
	delay time.Duration
}

func (s lateClaimStore) ClaimBatch(ctx context.Context, p store.ClaimBatchParams) (store.Batch, error) {
	b, err := s.Store.ClaimBatch(context.WithoutCancel(ctx), p)
	select {
	case <-ctx.Done():
		return store.Batch{}, ctx.Err()
	case <-time.After(s.delay):
		return b, err
	}
}

// TestDeadlineDuringClaimReleasesTheClaim: a claim the store applied but
// answered after the work's deadline is still this attempt's, and the
// attempt hands it back, so the next delivery claims the batch at once.
// Before, the claim was given up with the deadline: the batch stayed leased
// to an attempt that never ran, the next delivery dropped its message as
// another owner's, and the batch waited for its lease to run out.
func TestDeadlineDuringClaimReleasesTheClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, pipeline.GeneratorConfig{Lease: time.Hour})
	id := e.splitProducts("claim-deadline", "{{name}}", 3, 10).TaskID
	gen := pipeline.NewGenerator(lateClaimStore{Store: e.store, delay: 300 * time.Millisecond}, e.provider, e.signal, e.cfg)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	msg := pipeline.Delivery{Body: pipeline.EncodeBatchMessage(id, 1), ReceiveCount: 1}
	if out := gen.Process(ctx, msg); out.Err == nil {
		t.Fatalf("outcome %+v, want the deadline's error", out)
	}
	b, err := e.store.GetBatch(t.Context(), id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.State != store.BatchPending || b.Attempt != 1 {
		t.Fatalf("batch is %s at attempt %d, leased until %v, after its attempt ran out of time: want it PENDING after 1 attempt", b.State, b.Attempt, b.LeaseUntil)
	}
	msg.ReceiveCount = 2
	if out := e.gen.Process(t.Context(), msg); !out.Ack || out.Err != nil {
		t.Fatalf("next delivery: %+v, want the batch done", out)
	}
}
