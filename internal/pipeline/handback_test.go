package pipeline_test

import (
	"context"
	"errors"
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

// stallingLimiter stands for a quota busy with other work: each Wait
// reports itself on waiting and then, if outlast is set, advances the fake
// clock past the stop time and grants the token (the wait outlasted the
// stop); otherwise it blocks until ctx ends.
type stallingLimiter struct {
	clk     *clock.Fake
	outlast time.Duration
	waiting chan struct{}
}

func (l *stallingLimiter) Wait(ctx context.Context, _ int) error {
	l.waiting <- struct{}{}
	if l.outlast > 0 {
		l.clk.Advance(l.outlast)
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (l *stallingLimiter) Penalize(time.Duration) {}
func (l *stallingLimiter) Settle(int, int)        {}
func (l *stallingLimiter) Observe(llm.RateLimits) {}

// TestGeneratorQuotaStarvedHandBack: rows still waiting for the quota when
// the stop time comes start no call, even when the limiter grants the token
// after the stop time (the stop is checked again after the wait), and the
// batch, which tried nothing that could fail, is handed back as
// QuotaStarved: resent without using up a receive, so quota starvation
// never walks a healthy batch toward the dead-letter queue.
func TestGeneratorQuotaStarvedHandBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		outlast time.Duration
	}{
		{"wait ended by the stop time", 0},
		{"token granted after the stop time", 2 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			clk := clock.NewFake(t0)
			lim := &stallingLimiter{clk: clk, outlast: tc.outlast, waiting: make(chan struct{}, 10)}
			p := &gatedProvider{started: make(chan struct{}, 10), gate: make(chan struct{})}
			close(p.gate)
			e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2, Clock: clk, Limiter: lim})
			sp := e.splitProducts("starved-"+tc.name, "{{name}}", 4, 4)
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
			<-lim.waiting // a row is waiting for the quota
			if tc.outlast == 0 {
				clk.Advance(time.Minute)
			}
			out := <-done

			if diff := cmp.Diff(pipeline.Outcome{HandedBack: true, QuotaStarved: true}, out); diff != "" {
				t.Errorf("outcome mismatch (-want +got):\n%s", diff)
			}
			if n := p.calls.Load(); n != 0 {
				t.Errorf("%d model calls, want none: no call may start after StopStartingAt", n)
			}
			rows, err := e.store.ListRows(t.Context(), store.ListRowsParams{TaskID: sp.TaskID})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				if r.State != store.RowPending || r.Attempts != 0 {
					t.Errorf("row %d %s after %d attempts, want PENDING and untouched", r.No, r.State, r.Attempts)
				}
			}
			if got := e.gen.Settle(out).Action; got != pipeline.SettleResend {
				t.Errorf("settled as %v, want resend (no receive used up)", got)
			}
		})
	}
}

// TestGeneratorCalledHandBackIsNotStarved: a batch that made a model call
// in the delivery (here one that failed and left its row pending) and then
// ran out of time waiting for the quota is not starved: it tried something
// that can fail, so it uses up a receive and can still dead-letter.
func TestGeneratorCalledHandBackIsNotStarved(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clock.NewFake(t0)
	lim := &firstFreeLimiter{waiting: make(chan struct{}, 10)}
	failing := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, Err: errors.New("502 bad gateway")}
	})
	e := newEnv(t, failing, pipeline.GeneratorConfig{Concurrency: 1, CallsPerRound: 1, Clock: clk, Limiter: lim})
	e.splitProducts("called", "{{name}}", 3, 3)
	ds, err := e.queue.Receive(t.Context(), 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(ds))
	}
	done := make(chan pipeline.Outcome, 1)
	go func() {
		done <- e.gen.Process(t.Context(), pipeline.Delivery{Body: ds[0].Body, StopStartingAt: t0.Add(time.Minute)})
	}()
	<-lim.waiting // the second row waits for the quota after the first row's call
	clk.Advance(time.Minute)
	out := <-done
	if !out.HandedBack || out.QuotaStarved || out.Progress != 0 {
		t.Errorf("outcome %+v, want handed back without progress and not starved", out)
	}
	if got := e.gen.Settle(out).Action; got != pipeline.SettleRetry {
		t.Errorf("settled as %v, want retry (a receive used up)", got)
	}
}

// firstFreeLimiter grants its first token at once; every later Wait
// reports itself on waiting and blocks until ctx ends.
type firstFreeLimiter struct {
	granted atomic.Bool
	waiting chan struct{}
}

func (l *firstFreeLimiter) Wait(ctx context.Context, _ int) error {
	if l.granted.CompareAndSwap(false, true) {
		return nil
	}
	l.waiting <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

func (l *firstFreeLimiter) Penalize(time.Duration) {}
func (l *firstFreeLimiter) Settle(int, int)        {}
func (l *firstFreeLimiter) Observe(llm.RateLimits) {}

// TestGeneratorStopsStartingRowsOnStop: closing Delivery.Stop (the embedded
// server shutting down) is StopStartingAt now: no new row starts, the calls
// in flight finish and are saved, and the batch is handed back.
func TestGeneratorStopsStartingRowsOnStop(t *testing.T) {
	t.Parallel()
	p := &gatedProvider{started: make(chan struct{}, 10), gate: make(chan struct{})}
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2})
	sp := e.splitProducts("stop", "{{name}}", 6, 6)
	ds, err := e.queue.Receive(t.Context(), 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(ds))
	}
	stop := make(chan struct{})
	done := make(chan pipeline.Outcome, 1)
	go func() {
		done <- e.gen.Process(t.Context(), pipeline.Delivery{Body: ds[0].Body, ReceiveCount: ds[0].ReceiveCount, Stop: stop})
	}()
	<-p.started
	<-p.started // both slots are calling the model
	close(stop)
	close(p.gate)
	out := <-done
	if diff := cmp.Diff(pipeline.Outcome{HandedBack: true, Progress: 2}, out); diff != "" {
		t.Errorf("outcome mismatch (-want +got):\n%s", diff)
	}
	if n := p.calls.Load(); n != 2 {
		t.Errorf("%d model calls, want 2: no row may start after the stop", n)
	}
	rows, err := e.store.ListRows(t.Context(), store.ListRowsParams{TaskID: sp.TaskID})
	if err != nil {
		t.Fatal(err)
	}
	succeeded := 0
	for _, r := range rows {
		if r.State == store.RowSucceeded {
			succeeded++
		}
	}
	if succeeded != 2 {
		t.Errorf("%d rows saved, want the 2 that were calling the model at the stop", succeeded)
	}
}

// TestInvocationEnd: the one rule for the end of an invocation killed at a
// deadline: the work ends the settle margin before it, and no call starts
// later than the longest call before the work ends; a margin that does not
// fit twice in what is left keeps half of it.
func TestInvocationEnd(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	e := newEnv(t, nil, pipeline.GeneratorConfig{CallTimeout: time.Minute, Clock: clk})
	tests := []struct {
		remaining, settle, work, start time.Duration
	}{
		{15 * time.Minute, 20 * time.Second, 14*time.Minute + 40*time.Second, 13*time.Minute + 40*time.Second},
		{2 * time.Minute, 20 * time.Second, 100 * time.Second, 50 * time.Second},
		{60 * time.Second, 20 * time.Second, 40 * time.Second, 20 * time.Second},
		{10 * time.Second, 20 * time.Second, 5 * time.Second, 2500 * time.Millisecond},
	}
	for _, tc := range tests {
		end := e.gen.InvocationEnd(tc.remaining, tc.settle)
		if end.Work != tc.work || !end.StopStarting.Equal(clk.Now().Add(tc.start)) {
			t.Errorf("%v left, %v to settle: work %v, stop starting at +%v; want %v and +%v",
				tc.remaining, tc.settle, end.Work, end.StopStarting.Sub(clk.Now()), tc.work, tc.start)
		}
	}
}
