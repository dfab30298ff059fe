package pipeline_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// gatedProvider holds every call until gate closes and reports each call
// on started.
type gatedProvider struct {
	calls   atomic.Int32
	started chan struct{}
	gate    chan struct{}
}

func (p *gatedProvider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	p.calls.Add(1)
	p.started <- struct{}{}
	select {
	case <-p.gate:
		return llm.Response{Text: "ok: " + req.Prompt}, nil
	case <-ctx.Done():
		return llm.Response{}, ctx.Err()
	}
}

// TestGeneratorStopsStartingRowsAt: when Delivery.StopStartingAt comes, no
// new row starts, the calls in flight finish and are saved (they were paid
// for), and the batch is handed back with its progress counted.
func TestGeneratorStopsStartingRowsAt(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clock.NewFake(t0)
	p := &gatedProvider{started: make(chan struct{}, 10), gate: make(chan struct{})}
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2, Clock: clk})
	sp := e.splitProducts("handback", "{{name}}", 6, 6)
	ds, err := e.queue.Receive(t.Context(), 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(ds))
	}
	done := make(chan pipeline.Outcome, 1)
	go func() {
		done <- e.gen.Process(t.Context(), pipeline.Delivery{
			Body: ds[0].Body, ReceiveCount: ds[0].ReceiveCount, StopStartingAt: t0.Add(time.Minute),
		})
	}()
	<-p.started
	<-p.started // both slots are calling the model
	clk.Advance(time.Minute)
	close(p.gate)
	out := <-done

	if diff := cmp.Diff(pipeline.Outcome{HandedBack: true, Progress: 2}, out); diff != "" {
		t.Errorf("outcome mismatch (-want +got):\n%s", diff)
	}
	if n := p.calls.Load(); n != 2 {
		t.Errorf("%d model calls, want 2: no row may start after StopStartingAt", n)
	}
	rows, err := e.store.ListRows(t.Context(), store.ListRowsParams{TaskID: sp.TaskID})
	if err != nil {
		t.Fatal(err)
	}
	var states []store.RowState
	for _, r := range rows {
		states = append(states, r.State)
		if r.State == store.RowPending && r.Attempts != 0 {
			t.Errorf("row %d pending after %d attempts; a row not started must not count", r.No, r.Attempts)
		}
	}
	want := []store.RowState{store.RowSucceeded, store.RowSucceeded, store.RowPending, store.RowPending, store.RowPending, store.RowPending}
	if diff := cmp.Diff(want, states); diff != "" {
		t.Errorf("row states (-want +got):\n%s", diff)
	}
	b, err := e.store.GetBatch(t.Context(), sp.TaskID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.State != store.BatchPending {
		t.Errorf("batch %s, want PENDING: handed back for the next delivery", b.State)
	}
	if got := e.gen.Settle(out).Action; got != pipeline.SettleResend {
		t.Errorf("settled as %v, want resend", got)
	}
}

// TestGeneratorHandBackWithoutProgress: a delivery whose time is up before
// any row finished is a plain retry, so a batch that never finishes a row
// still ends in the dead-letter queue.
func TestGeneratorHandBackWithoutProgress(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := &gatedProvider{started: make(chan struct{}, 10), gate: make(chan struct{})}
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2, Clock: clock.NewFake(t0)})
	e.splitProducts("handback-none", "{{name}}", 3, 3)
	ds, err := e.queue.Receive(t.Context(), 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(ds))
	}
	out := e.gen.Process(t.Context(), pipeline.Delivery{Body: ds[0].Body, StopStartingAt: t0})
	if diff := cmp.Diff(pipeline.Outcome{HandedBack: true}, out); diff != "" {
		t.Errorf("outcome mismatch (-want +got):\n%s", diff)
	}
	if n := p.calls.Load(); n != 0 {
		t.Errorf("%d model calls after the stop time, want 0", n)
	}
	if got := e.gen.Settle(out); got.Action != pipeline.SettleRetry || got.Delay != 0 {
		t.Errorf("settled as %v after %v, want an immediate retry", got.Action, got.Delay)
	}
}
