package pipeline_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// TestHeldTaskSamplesThenStarts: a task split with a sample is held; only
// its sample's rows are called, spread over the sheet, each once however
// many copies of the sample's messages come; the sweeper sends
// none of its batches and a stray batch message starts no row; the start
// runs the rest, and no row is called twice.
func TestHeldTaskSamplesThenStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var mu sync.Mutex
	calls := map[string]int{}
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		mu.Lock()
		calls[req.Prompt]++
		mu.Unlock()
		return llm.Response{Text: "ok " + req.Prompt, Usage: llm.Usage{InputTokens: 10, OutputTokens: 20}}, nil
	})
	callCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range calls {
			n += c
		}
		return n
	}
	// Priced, so the cap the start sets holds (a cap without prices stops
	// the task).
	prices := pricing.Default().With(map[string]pricing.Price{"sim": {InputPerMTok: 1, OutputPerMTok: 1}})
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2, Prices: prices})
	const rows, batch, sample = 30, 5, 4
	spec := store.TaskSpec{Prompt: "{{id}}", Provider: "sim", BatchSize: batch}
	params := pipeline.SplitParams{
		TaskID: pipeline.DeriveTaskID("held", spec), Source: "in.csv", Spec: spec, Terms: store.Terms{Sample: sample},
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(rows)),
	}
	task, err := e.splitter.Split(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if task.State != store.TaskHeld || task.Sample != sample {
		t.Fatalf("split task %s (sample %d), want HELD with its sample", task.State, task.Sample)
	}
	id := task.ID

	// Work the queue until the quote says the sample is answered.
	work := func(until func() bool) {
		t.Helper()
		wctx, stop := context.WithTimeout(ctx, 30*time.Second)
		defer stop()
		workers := pipeline.NewLocalWorkers(e.queue, e.gen, pipeline.LocalWorkersConfig{Workers: 3, PollInterval: 5 * time.Millisecond})
		done := make(chan struct{})
		go func() { defer close(done); _ = workers.Run(wctx) }()
		for !until() {
			if wctx.Err() != nil {
				t.Fatal("the condition did not hold within 30 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // let stray messages be taken too
		stop()
		<-done
	}
	quote := func() pipeline.Quote {
		t.Helper()
		cur, err := e.store.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		q, err := pipeline.QuoteTask(ctx, e.store, cur, pipeline.QuoteParams{RowsToCall: -1, Concurrency: 2})
		if err != nil && !errors.Is(err, pipeline.ErrNothingMeasured) {
			t.Fatal(err)
		}
		return q
	}
	if q := quote(); !q.Sampling || q.Asked != sample || q.Tried != 0 {
		t.Fatalf("quote before any worker: %+v, want sampling %d rows, none tried", q, sample)
	}
	// The queue delivers at least once, and two splitters racing on one
	// upload both send the sample: a second copy of each message tries no
	// more rows.
	if err := e.queue.Send(ctx, pipeline.SampleMessages(task, sample)); err != nil {
		t.Fatal(err)
	}
	work(func() bool { return !quote().Sampling })
	q := quote()
	if q.Tried != sample || q.Measured != sample || q.Left != rows-sample || callCount() != sample {
		t.Fatalf("after the sample: quote %+v, %d calls; want %d rows measured and called", q, callCount(), sample)
	}
	// Spread: one row from each of four batches over the sheet's six.
	mu.Lock()
	for _, want := range []string{"SKU-0001", "SKU-0006", "SKU-0016", "SKU-0021"} {
		if calls[want] != 1 {
			t.Errorf("sample calls %v, want the first row of batches 1, 2, 4 and 5", calls)
			break
		}
	}
	mu.Unlock()

	// Held: the sweeper sends none of its batches, and a batch message that
	// is not the sample's starts no row.
	sweeper := pipeline.NewSweeper(e.store, e.queue, e.signal, pipeline.SweeperConfig{PendingAfter: time.Nanosecond})
	rep, err := sweeper.Sweep(ctx)
	if err != nil || rep.Requeued != 0 || rep.LeasesReset != 0 || rep.BatchesFailed != 0 {
		t.Fatalf("sweep of a held task: %+v %v, want nothing sent", rep, err)
	}
	if err := e.queue.Send(ctx, pipeline.BatchMessages(task, []int{3})); err != nil {
		t.Fatal(err)
	}
	work(func() bool { return true })
	if n := callCount(); n != sample {
		t.Fatalf("%d calls after a stray message for the held task, want the sample's %d", n, sample)
	}

	starter := pipeline.Starter{Store: e.store, Queue: e.queue, Exports: e.signal}
	started, n, err := starter.Start(ctx, pipeline.StartParams{TaskID: id, Now: time.Now(), Change: func(t *store.Terms) { t.MaxCost = 5 }})
	if err != nil || started.State != store.TaskRunning || n != rows/batch || started.MaxCost != 5 {
		t.Fatalf("start: %s, %d batches sent, cap %v, %v; want RUNNING with every batch sent and the new cap", started.State, n, started.MaxCost, err)
	}
	done := e.runToCompletion(ctx, id)
	if done.State != store.TaskSucceeded || done.RowsSucceeded != rows {
		t.Fatalf("after the start: %s with %d rows succeeded, want SUCCEEDED with %d", done.State, done.RowsSucceeded, rows)
	}
	mu.Lock()
	for prompt, c := range calls {
		if c != 1 {
			t.Errorf("%s called %d times: the sample was paid twice", prompt, c)
		}
	}
	if len(calls) != rows {
		t.Errorf("%d prompts called, want %d", len(calls), rows)
	}
	mu.Unlock()
	var se *pipeline.StateError
	if _, _, err := starter.Start(ctx, pipeline.StartParams{TaskID: id, Now: time.Now()}); !errors.As(err, &se) || !errors.Is(err, store.ErrConflict) {
		t.Errorf("second start: %v, want a StateError", err)
	}
}

// TestHeldTaskAnsweredWholeBySample: a sheet no larger than its sample is
// answered whole while held; the start goes straight to the export.
func TestHeldTaskAnsweredWholeBySample(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, nil, pipeline.GeneratorConfig{Concurrency: 2})
	spec := store.TaskSpec{Prompt: "{{id}}", Provider: "sim", BatchSize: 2}
	params := pipeline.SplitParams{
		TaskID: pipeline.DeriveTaskID("small", spec), Source: "in.csv", Spec: spec, Terms: store.Terms{Sample: 20},
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(3)),
	}
	task, err := e.splitter.Split(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range pipeline.SampleMessages(task, task.Sample) {
		out := e.gen.Process(ctx, pipeline.Delivery{Body: m.Body})
		if out.Err != nil || !out.Ack {
			t.Fatalf("sample message: %+v, want acknowledged", out)
		}
	}
	held, err := e.store.GetTask(ctx, task.ID)
	if err != nil || held.State != store.TaskHeld || held.BatchesDone != 2 || !held.NeedsExport() {
		t.Fatalf("after the sample: %+v %v, want HELD with both batches done", held, err)
	}
	started, n, err := pipeline.Starter{Store: e.store, Queue: e.queue, Exports: e.signal}.Start(ctx, pipeline.StartParams{TaskID: task.ID, Now: time.Now()})
	if err != nil || started.State != store.TaskRunning || n != 0 {
		t.Fatalf("start: %s, %d batches, %v", started.State, n, err)
	}
	select {
	case got := <-e.signal.C():
		if got != task.ID {
			t.Fatalf("export signalled for %s", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the start of a task its sample answered whole started no export")
	}
	if cur, _ := e.store.GetTask(ctx, task.ID); cur.State != store.TaskExporting {
		t.Errorf("task %s after the start, want EXPORTING", cur.State)
	}
}

// TestEconomyBatchRows: a splitter configured for a runtime that parks
// (EconomyBatchRows) splits economy and auto tasks into large batches, at
// most the largest batch; online tasks keep the batch size they asked for.
func TestEconomyBatchRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, nil, pipeline.GeneratorConfig{})
	splitter := pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{EconomyBatchRows: pipeline.ParkedEconomyBatchRows})
	path := e.writeCSV("in.csv", []string{"id", "name"}, productRows(2500))
	for _, tc := range []struct {
		mode    store.Mode
		batches int
	}{
		{store.ModeOnline, 50},
		{store.ModeEconomy, 3},
		{store.ModeAuto, 3},
	} {
		spec := store.TaskSpec{Prompt: "{{id}}", Provider: "sim", BatchSize: 50}
		terms := store.Terms{Mode: tc.mode}
		if tc.mode == store.ModeAuto {
			terms.Deadline = time.Now().Add(time.Hour)
		}
		task, err := splitter.Split(ctx, pipeline.SplitParams{TaskID: pipeline.DeriveTaskID("rows-"+string(tc.mode), spec), Source: "in.csv", Spec: spec, Terms: terms, Path: path})
		if err != nil {
			t.Fatal(err)
		}
		if task.BatchesTotal != tc.batches {
			t.Errorf("%s: %d batches of %d rows, want %d", tc.mode, task.BatchesTotal, task.Spec.BatchSize, tc.batches)
		}
	}
}

// holdFails is a store whose first recording of a hold fails: a split that
// died after it sent its sample's messages, before it recorded the hold.
type holdFails struct {
	store.Store
	failed bool
}

func (s *holdFails) TransitionTask(ctx context.Context, p store.TransitionTaskParams) (store.Task, error) {
	if p.To == store.TaskHeld && !s.failed {
		s.failed = true
		return store.Task{}, errors.New("injected: the split died before it recorded the hold")
	}
	return s.Store.TransitionTask(ctx, p)
}

// TestSampleMetBeforeTheHold: the sample's messages are sent before the
// hold is recorded, so a worker can meet them while the task is still
// PENDING (serve's API and drop folder split one upload side by side, and
// SQS delivers at once). It answers the sample's rows only, never its
// batches whole; the sweeper sends none of them; the resumed split holds
// the task and its sample's second copies try nothing more.
func TestSampleMetBeforeTheHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int64
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		calls.Add(1)
		return llm.Response{Text: "ok " + req.Prompt, Usage: llm.Usage{InputTokens: 10, OutputTokens: 20}}, nil
	})
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2})
	const rows, batch, sample = 20, 5, 3
	spec := store.TaskSpec{Prompt: "{{id}}", Provider: "sim", BatchSize: batch}
	params := pipeline.SplitParams{
		TaskID: pipeline.DeriveTaskID("held-late", spec), Source: "in.csv", Spec: spec, Terms: store.Terms{Sample: sample},
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(rows)),
	}
	dying := pipeline.NewSplitter(&holdFails{Store: e.store}, e.queue, pipeline.SplitterConfig{Inputs: e.blobs, Exports: e.signal})
	if _, err := dying.Split(ctx, params); err == nil {
		t.Fatal("the split whose hold failed succeeded")
	}
	task, err := e.store.GetTask(ctx, params.TaskID)
	if err != nil || task.State != store.TaskPending || !task.Held() {
		t.Fatalf("task after the dying split: %s %v, want PENDING and held for its sample", task.State, err)
	}
	sweeper := pipeline.NewSweeper(e.store, e.queue, e.signal, pipeline.SweeperConfig{PendingAfter: time.Nanosecond})
	if rep, err := sweeper.Sweep(ctx); err != nil || rep.Requeued != 0 {
		t.Fatalf("sweep of a task being held: %+v %v, want nothing sent", rep, err)
	}
	// A stray batch message too (the sweeper's, had it sent one).
	if err := e.queue.Send(ctx, pipeline.BatchMessages(task, []int{4})); err != nil {
		t.Fatal(err)
	}
	e.drain(ctx)
	if n := calls.Load(); n != sample {
		t.Fatalf("%d calls for a PENDING task's sample of %d: its batches ran whole", n, sample)
	}
	held, err := e.splitter.Split(ctx, params)
	if err != nil || held.State != store.TaskHeld {
		t.Fatalf("resumed split: %s %v, want HELD", held.State, err)
	}
	e.drain(ctx)
	if n := calls.Load(); n != sample {
		t.Fatalf("%d calls after the resumed split sent the sample again, want %d", n, sample)
	}
	q, err := pipeline.QuoteTask(ctx, e.store, held, pipeline.QuoteParams{RowsToCall: -1, Concurrency: 2})
	if err != nil || q.Sampling || q.Tried != sample {
		t.Fatalf("quote: %+v %v, want the sample of %d tried", q, err, sample)
	}
}

// drain runs local workers until the queue holds no live message, within
// 30 s.
func (e *env) drain(ctx context.Context) {
	e.t.Helper()
	wctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	workers := pipeline.NewLocalWorkers(e.queue, e.gen, pipeline.LocalWorkersConfig{Workers: 3, PollInterval: 5 * time.Millisecond})
	done := make(chan struct{})
	go func() { defer close(done); _ = workers.Run(wctx) }()
	defer func() { stop(); <-done }()
	for {
		n, age, err := e.queue.Backlog(wctx)
		if err == nil && n == 0 && age == 0 { // none visible, none in hand
			return
		}
		if wctx.Err() != nil {
			e.t.Fatalf("the queue still held %d messages after 30 s", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
