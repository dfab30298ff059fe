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

// TestDeadlineHandsTheClaimBack: an attempt that runs out of time hands
// its claim back, so the next delivery claims the batch at once. Before,
// the batch stayed leased to the dead attempt: the next delivery counted a
// lost claim and dropped its message, and the batch waited for the lease to
// expire (seen as slow-model jobs stuck on the emulator under load).
//   - during the cache lookup of the batch's rows (a cache store slower
//     than the invocation's deadline);
//   - during the claim itself: a claim the store applied but answered
//     after the deadline is still this attempt's, to hand back, and not
//     given up with the context.
func TestDeadlineHandsTheClaimBack(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		deadline time.Duration
		slow     func(e *env) *pipeline.Generator
	}{
		{"during the cache lookup", 200 * time.Millisecond, func(e *env) *pipeline.Generator {
			cfg := e.cfg
			cfg.Cache = stalledCache{e.store}
			return pipeline.NewGenerator(e.store, e.provider, e.signal, cfg)
		}},
		{"during the claim", 100 * time.Millisecond, func(e *env) *pipeline.Generator {
			return pipeline.NewGenerator(lateClaimStore{Store: e.store, delay: 300 * time.Millisecond}, e.provider, e.signal, e.cfg)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil, pipeline.GeneratorConfig{Lease: time.Hour})
			id := e.splitProducts("deadline", "{{name}}", 3, 10).TaskID
			ctx, cancel := context.WithTimeout(t.Context(), tt.deadline)
			defer cancel()
			msg := pipeline.Delivery{Body: pipeline.EncodeBatchMessage(id, 1), ReceiveCount: 1}
			if out := tt.slow(e).Process(ctx, msg); out.Err == nil {
				t.Fatalf("outcome %+v, want the deadline's error", out)
			}
			b, err := e.store.GetBatch(t.Context(), id, 1)
			if err != nil {
				t.Fatal(err)
			}
			if b.State != store.BatchPending || b.Attempt != 1 {
				t.Fatalf("batch is %s at attempt %d, leased until %v, after its attempt ran out of time: want it handed back, PENDING after 1 attempt", b.State, b.Attempt, b.LeaseUntil)
			}
			// The next delivery claims it and finishes it.
			msg.ReceiveCount = 2
			if out := e.gen.Process(t.Context(), msg); !out.Ack || out.Err != nil {
				t.Fatalf("next delivery: %+v, want the batch done", out)
			}
		})
	}
}
