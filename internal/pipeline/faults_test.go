package pipeline_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/faultstore"
)

// TestStorageFaultsLoseNothing runs a job while every third call of the
// generator's hot store methods fails: results are retried with backoff or
// the message is redelivered, the task succeeds, and no row is billed twice.
func TestStorageFaultsLoseNothing(t *testing.T) {
	t.Parallel()
	provider := newCounting(sim.New(sim.Config{Latency: time.Millisecond}))
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 4})
	faulty := faultstore.New(e.store, faultstore.EveryNth(3, "SaveRowResults", "FinishBatch", "ClaimBatch", "ListRows", "GetTask"))
	e.useStore(faulty)
	id := e.splitProducts("faults", "{{id}} {{name}}", 90, 10).TaskID
	done := e.runToCompletion(context.Background(), id)
	if done.State != store.TaskSucceeded {
		t.Fatalf("state = %s, want SUCCEEDED", done.State)
	}
	injected := faulty.Injected()
	for _, m := range []string{"SaveRowResults", "FinishBatch", "ClaimBatch"} {
		if injected[m] == 0 {
			t.Errorf("no fault injected into %s; the test proves nothing about it", m)
		}
	}
	calls := provider.snapshot()
	if len(calls) != 90 {
		t.Errorf("%d distinct prompts called, want 90", len(calls))
	}
	for p, n := range calls {
		if n != 1 {
			t.Errorf("prompt %q billed %d times", p, n)
		}
	}
	if got := len(e.resultCells(done)); got != 91 {
		t.Errorf("result has %d lines, want 91", got)
	}
}

// blockingProvider answers "<name>: prompt" but holds the first call until
// released, standing in for a worker that stalls (GC pause, SIGSTOP, a hung
// connection) past its lease.
type blockingProvider struct {
	name    string
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func (p *blockingProvider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	first := false
	p.once.Do(func() { first = true })
	if first {
		close(p.started)
		<-p.release
	}
	return llm.Response{Text: p.name + ": " + req.Prompt}, nil
}

// TestStalledWorkerIsFencedOut: worker A claims a batch and stalls in a model
// call past its lease (its clock never lets the heartbeat fire); worker B
// takes the batch over and finishes it; when A wakes, its late write is
// refused and B's results stand.
func TestStalledWorkerIsFencedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	a := &blockingProvider{name: "A", started: make(chan struct{}), release: make(chan struct{})}
	// A's clock is never advanced: its heartbeat never renews.
	e := newEnv(t, a, pipeline.GeneratorConfig{Concurrency: 1, Lease: time.Minute, Clock: clock.NewFake(t0)})
	e.splitter = pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: clock.NewFake(t0)})
	id := e.splitProducts("fence", "{{id}}", 3, 10).TaskID
	msg := pipeline.EncodeBatchMessage(id, 1)
	outA := make(chan pipeline.Outcome, 1)
	go func() { outA <- e.gen.Process(ctx, pipeline.Delivery{Body: msg, ReceiveCount: 1}) }()
	<-a.started

	b := pipeline.NewGenerator(e.store, providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		return llm.Response{Text: "B: " + req.Prompt}, nil
	}), e.signal, pipeline.GeneratorConfig{Concurrency: 1, Lease: time.Minute, Clock: clock.NewFake(t0.Add(5 * time.Minute)), Owner: "B"})
	if out := b.Process(ctx, pipeline.Delivery{Body: msg, ReceiveCount: 2}); !out.Ack || out.Err != nil {
		t.Fatalf("B's outcome = %+v, want ack", out)
	}
	close(a.release)
	if out := <-outA; !out.Ack {
		t.Fatalf("A's outcome = %+v, want ack (it lost the batch)", out)
	}
	rows, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: id, FromNo: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if want := fmt.Sprintf("B: SKU-%04d", r.No); r.Output != want || r.State != store.RowSucceeded {
			t.Errorf("row %d = %q (%s), want %q: the stalled worker overwrote its successor", r.No, r.Output, r.State, want)
		}
	}
	task, err := e.store.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if task.BatchesDone != 1 || task.RowsSucceeded != 3 {
		t.Errorf("counters = %d batches, %d rows; want 1 and 3 counted once", task.BatchesDone, task.RowsSucceeded)
	}
}

// TestPanickingProviderDoesNotKillTheRun: a provider that panics on one
// row (a bug) fails only that batch's message, which is dead-lettered after
// its receives; every other batch finishes.
func TestPanickingProviderDoesNotKillTheRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		if req.Prompt == "SKU-0013" {
			panic("provider bug")
		}
		return llm.Response{Text: "ok"}, nil
	})
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2})
	id := e.splitProducts("panic", "{{id}}", 30, 10).TaskID
	wctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	workers := pipeline.NewLocalWorkers(e.queue, e.gen, pipeline.LocalWorkersConfig{Workers: 2, PollInterval: 5 * time.Millisecond})
	done := make(chan struct{})
	go func() { _ = workers.Run(wctx); close(done) }()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		dead, err := e.queue.ListDead(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) == 1 {
			break
		}
		select {
		case <-wctx.Done():
			t.Fatal("the panicking batch's message was never dead-lettered")
		case <-poll.C:
		}
	}
	stop()
	<-done
	batches, err := e.store.ListBatches(ctx, store.ListBatchesParams{TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		if want := b.No != 2; (b.State == store.BatchDone) != want {
			t.Errorf("batch %d is %s; want only batch 2 (row 13) unfinished", b.No, b.State)
		}
	}
}
