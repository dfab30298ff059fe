package generatorfn_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/lambdafn/generatorfn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
)

// generatorFixture is the generator function's handler over the test
// adapters, with the export signal it gives and the EMF lines it prints.
type generatorFixture struct {
	*env
	signal  *pipeline.ExportSignal
	handler *generatorfn.Handler
	metrics *lambdatest.SyncBuffer
}

func (e *env) generator(provider llm.Provider, st store.Store) *generatorFixture {
	signal := &pipeline.ExportSignal{}
	counter := generatorfn.NewCounter()
	if st == nil {
		st = e.Store
	}
	gen := pipeline.NewGenerator(st, provider, signal, pipeline.GeneratorConfig{
		Cache: e.Store, Clock: e.Clock, Logger: e.Log, Owner: "test",
		Metrics:     counter,
		Concurrency: 4, CallsPerRound: 1, Rounds: 3,
		RetryDelays: []time.Duration{10 * time.Second, 60 * time.Second},
	})
	m := &lambdatest.SyncBuffer{}
	return &generatorFixture{
		env: e, signal: signal, metrics: m,
		handler: &generatorfn.Handler{
			Generator: gen, Queue: e.Queue, Counter: counter,
			Metrics: metrics.New(m, e.Clock, map[string]string{"function": "generator"}),
			Logger:  e.Log,
		},
	}
}

// deleteSucceeded deletes the deliveries not reported as failures, as
// Lambda does, and returns the ids of the failures.
func (f *generatorFixture) deleteSucceeded(ds []queue.Delivery, resp events.SQSEventResponse) []string {
	f.T.Helper()
	var failed []string
	for _, x := range resp.BatchItemFailures {
		failed = append(failed, x.ItemIdentifier)
	}
	for _, d := range ds {
		if !slices.Contains(failed, d.ID) {
			if err := f.Queue.Delete(f.T.Context(), d.Receipt); err != nil {
				f.T.Fatal(err)
			}
		}
	}
	return failed
}

// lastMetrics returns the values of the last metrics line.
func (f *generatorFixture) lastMetrics() map[string]float64 {
	f.T.Helper()
	lines := f.metrics.Lines(f.T)
	if len(lines) == 0 {
		f.T.Fatal("no metrics line was written")
	}
	out := map[string]float64{}
	for k, v := range lines[len(lines)-1] {
		if n, ok := v.(float64); ok {
			out[k] = n
		}
	}
	return out
}

func idsOf(ds []queue.Delivery, batches ...int) []string {
	var out []string
	for _, d := range ds {
		m, _ := pipeline.DecodeBatchMessage(d.Body)
		if slices.Contains(batches, m.BatchNo) {
			out = append(out, d.ID)
		}
	}
	return out
}

func TestGeneratorAllSucceed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.generator(sim.New(sim.Config{}), nil)
	taskID := e.SplitCSV(6, 2)
	ds := e.Drain()
	resp, err := f.handler.Handle(t.Context(), lambdatest.SQSEvent(t, ds))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if failed := f.deleteSucceeded(ds, resp); len(failed) != 0 {
		t.Fatalf("batch item failures %v, want none", failed)
	}
	select {
	case id := <-f.signal.C():
		if id != taskID {
			t.Errorf("export started for %s, want %s", id, taskID)
		}
	default:
		t.Error("the last batch did not start the export")
	}
	task, err := e.Store.GetTask(t.Context(), taskID)
	if err != nil {
		t.Fatal(err)
	}
	if task.BatchesDone != 3 || task.RowsSucceeded != 6 {
		t.Errorf("task = %d/3 batches, %d/6 rows succeeded", task.BatchesDone, task.RowsSucceeded)
	}
	want := map[string]float64{
		"RowsSucceeded": 6, "RowsFailed": 0, "RowsCached": 0, "ModelCalls": 6, "RateLimited": 0,
		"BatchesReleased": 0, "MessagesFailed": 0, "PoisonMessages": 0,
		"InputTokens": 30, "OutputTokens": 141, // the simulator's counts for these prompts
	}
	if diff := cmp.Diff(want, f.lastMetrics()); diff != "" {
		t.Errorf("metrics mismatch (-want +got):\n%s", diff)
	}
}

func TestGeneratorRetryableFailureUsesGradedDelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	provider := sim.New(sim.Config{Fault: func(req llm.Request, _ int64) error {
		if strings.Contains(req.Prompt, "积木 2") {
			return &llm.Error{Class: llm.ClassRateLimited, StatusCode: 429, Message: "slow down"}
		}
		return nil
	}})
	f := e.generator(provider, nil)
	e.SplitCSV(6, 2)
	ds := e.Drain()
	resp, err := f.handler.Handle(t.Context(), lambdatest.SQSEvent(t, ds))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	failed := f.deleteSucceeded(ds, resp)
	if diff := cmp.Diff(idsOf(ds, 1), failed); diff != "" {
		t.Fatalf("batch item failures mismatch (-want +got):\n%s", diff)
	}
	// The handler set the failed message's visibility to the first graded
	// delay (10 s), not the queue's 30 minutes.
	e.Clock.Advance(9 * time.Second)
	if got := e.Drain(); len(got) != 0 {
		t.Fatalf("%d messages visible before the retry delay", len(got))
	}
	e.Clock.Advance(time.Second)
	again := e.Drain()
	if diff := cmp.Diff([]int{1}, lambdatest.BatchNos(t, again)); diff != "" {
		t.Fatalf("redelivered batches mismatch (-want +got):\n%s", diff)
	}
	if again[0].ReceiveCount != 2 {
		t.Errorf("ReceiveCount = %d, want 2", again[0].ReceiveCount)
	}
	b, err := e.Store.GetBatch(t.Context(), "task-1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.State != store.BatchPending {
		t.Errorf("batch 1 state = %s, want PENDING (released)", b.State)
	}
	want := map[string]float64{
		"RowsSucceeded": 5, "RowsFailed": 0, "RowsCached": 0, "ModelCalls": 6, "RateLimited": 1,
		"BatchesReleased": 1, "MessagesFailed": 0, "PoisonMessages": 0,
		"InputTokens": 25, "OutputTokens": 117,
	}
	if diff := cmp.Diff(want, f.lastMetrics()); diff != "" {
		t.Errorf("metrics mismatch (-want +got):\n%s", diff)
	}
}

func TestGeneratorPoisonMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.generator(sim.New(sim.Config{}), nil)
	if err := e.Queue.Send(t.Context(), []queue.Outgoing{{Body: []byte(`{"task_id": "nope", "batch_no": 1}`)}, {Body: []byte("not json")}}); err != nil {
		t.Fatal(err)
	}
	ds := e.Drain()
	resp, err := f.handler.Handle(t.Context(), lambdatest.SQSEvent(t, ds))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	failed := f.deleteSucceeded(ds, resp)
	if len(failed) != 2 {
		t.Fatalf("batch item failures = %v, want both messages", failed)
	}
	// Poison stays invisible for the queue's visibility timeout so the
	// redrive policy dead-letters it after maxReceiveCount deliveries.
	e.Clock.Advance(pipeline.DefaultErrorDelay + time.Second)
	if got := e.Drain(); len(got) != 0 {
		t.Fatalf("poison redelivered after %v", pipeline.DefaultErrorDelay)
	}
	e.Clock.Advance(30 * time.Minute)
	if got := e.Drain(); len(got) != 2 {
		t.Fatalf("got %d messages after the visibility timeout, want 2", len(got))
	}
	var bodies []string
	for _, l := range e.Logs.Lines(t) {
		if l["level"] == "ERROR" && strings.Contains(l["msg"].(string), "poison") {
			bodies = append(bodies, l["body"].(string))
		}
	}
	slices.Sort(bodies)
	if diff := cmp.Diff([]string{"not json", `{"task_id": "nope", "batch_no": 1}`}, bodies); diff != "" {
		t.Errorf("poison error logs mismatch (-want +got):\n%s", diff)
	}
	m := f.lastMetrics()
	if m["PoisonMessages"] != 2 || m["MessagesFailed"] != 2 {
		t.Errorf("metrics = %v, want 2 poison and 2 failed messages", m)
	}
}

// flakyStore fails GetTask while down is set, like a throttled table.
type flakyStore struct {
	store.Store
	mu   sync.Mutex
	down bool
}

func (s *flakyStore) GetTask(ctx context.Context, id string) (store.Task, error) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return store.Task{}, errors.New("ProvisionedThroughputExceededException")
	}
	return s.Store.GetTask(ctx, id)
}

func TestGeneratorTransientErrorRetriesSoon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	st := &flakyStore{Store: e.Store, down: true}
	f := e.generator(sim.New(sim.Config{}), st)
	e.SplitCSV(2, 2)
	ds := e.Drain()
	resp, err := f.handler.Handle(t.Context(), lambdatest.SQSEvent(t, ds))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if failed := f.deleteSucceeded(ds, resp); len(failed) != 1 {
		t.Fatalf("batch item failures = %v, want the message", failed)
	}
	e.Clock.Advance(pipeline.DefaultErrorDelay)
	again := e.Drain()
	if len(again) != 1 {
		t.Fatalf("got %d messages after the error delay, want the failed one back", len(again))
	}
	st.mu.Lock()
	st.down = false
	st.mu.Unlock()
	resp, err = f.handler.Handle(t.Context(), lambdatest.SQSEvent(t, again))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("retry: Handle = %v, %v; want success", resp.BatchItemFailures, err)
	}
}

// TestGeneratorStaleReceiptSendsFreshCopy: the settlement is carried out
// by pipeline.Settlement.Apply. A retry whose receipt went stale (the
// visibility ran out, another instance received the message and deleted
// it) sends a fresh copy and lets Lambda delete the stale delivery, so the
// batch keeps a message.
func TestGeneratorStaleReceiptSendsFreshCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	st := &flakyStore{Store: e.Store, down: true}
	f := e.generator(sim.New(sim.Config{}), st)
	e.SplitCSV(2, 2)
	ds := e.Drain()
	e.Clock.Advance(30 * time.Minute)
	again := e.Drain()
	if len(again) != 1 {
		t.Fatalf("got %d messages after the visibility timeout, want 1", len(again))
	}
	if err := e.Queue.Delete(t.Context(), again[0].Receipt); err != nil {
		t.Fatal(err)
	}
	resp, err := f.handler.Handle(t.Context(), lambdatest.SQSEvent(t, ds))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if failed := f.deleteSucceeded(ds, resp); len(failed) != 0 {
		t.Fatalf("batch item failures = %v, want none: a fresh copy replaces the stale delivery", failed)
	}
	if got := e.Drain(); len(got) != 0 {
		t.Fatalf("fresh copy visible before the error delay: %d messages", len(got))
	}
	e.Clock.Advance(pipeline.DefaultErrorDelay)
	fresh := e.Drain()
	if diff := cmp.Diff([]int{1}, lambdatest.BatchNos(t, fresh)); diff != "" {
		t.Fatalf("messages after the error delay (-want +got):\n%s", diff)
	}
}

// stallingProvider answers only when its context ends, like a model call
// still running when the invocation runs out of time.
type stallingProvider struct{}

func (stallingProvider) Generate(ctx context.Context, _ llm.Request) (llm.Response, error) {
	<-ctx.Done()
	return llm.Response{}, ctx.Err()
}

func TestGeneratorStopsBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.generator(stallingProvider{}, nil)
	f.handler.Headroom = 300 * time.Millisecond
	e.SplitCSV(2, 2)
	ds := e.Drain()
	ctx, cancel := context.WithTimeout(t.Context(), 900*time.Millisecond)
	defer cancel()
	resp, err := f.handler.Handle(ctx, lambdatest.SQSEvent(t, ds))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Handle returned after the invocation's deadline; it must leave headroom")
	}
	if failed := f.deleteSucceeded(ds, resp); len(failed) != 1 {
		t.Fatalf("batch item failures = %v, want the unfinished message", failed)
	}
	b, err := e.Store.GetBatch(t.Context(), "task-1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.State != store.BatchPending {
		t.Errorf("batch state = %s, want PENDING: released for the next invocation", b.State)
	}
	// An interrupted batch is retried at once, not after a backoff.
	if again := e.Drain(); len(again) != 1 {
		t.Errorf("got %d messages, want the interrupted one visible again", len(again))
	}
	rows, err := e.Store.ListRows(t.Context(), store.ListRowsParams{TaskID: "task-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.State != store.RowPending || r.Attempts != 0 {
			t.Errorf("row %d = %s after %d attempts; an interrupted call must not count", r.No, r.State, r.Attempts)
		}
	}
}

// barrierProvider answers only once n calls are in flight together, so a
// handler that processed messages one at a time would never finish.
type barrierProvider struct {
	n       int
	mu      sync.Mutex
	waiting int
	release chan struct{}
}

func (p *barrierProvider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	p.mu.Lock()
	p.waiting++
	if p.waiting == p.n {
		close(p.release)
	}
	p.mu.Unlock()
	select {
	case <-p.release:
		return llm.Response{Text: "ok: " + req.Prompt}, nil
	case <-ctx.Done():
		return llm.Response{}, ctx.Err()
	}
}

func TestGeneratorProcessesRecordsConcurrently(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.generator(&barrierProvider{n: 4, release: make(chan struct{})}, nil)
	e.SplitCSV(4, 1)
	ds := e.Drain()
	if len(ds) != 4 {
		t.Fatalf("got %d messages, want 4", len(ds))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := f.handler.Handle(ctx, lambdatest.SQSEvent(t, ds))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if len(resp.BatchItemFailures) != 0 {
		t.Fatalf("batch item failures %v: the records were not processed concurrently", resp.BatchItemFailures)
	}
}

// firstAnswersProvider answers its first call at once and holds the others
// until gate closes, reporting each held call on held.
type firstAnswersProvider struct {
	mu    sync.Mutex
	calls int
	held  chan struct{}
	gate  chan struct{}
}

func (p *firstAnswersProvider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	p.mu.Lock()
	p.calls++
	first := p.calls == 1
	p.mu.Unlock()
	if !first {
		p.held <- struct{}{}
		select {
		case <-p.gate:
		case <-ctx.Done():
			return llm.Response{}, ctx.Err()
		}
	}
	return llm.Response{Text: "ok: " + req.Prompt}, nil
}

// TestGeneratorHandsBackHealthyWorkWithAFreshMessage: an invocation whose
// time to start rows runs out after it finished some rows lets its calls in
// flight finish, and replaces the message with a fresh copy instead of
// reporting a failure, so the receive count that leads to the dead-letter
// queue starts again.
func TestGeneratorHandsBackHealthyWorkWithAFreshMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := &firstAnswersProvider{held: make(chan struct{}, 10), gate: make(chan struct{})}
	f := e.generator(p, nil)
	e.SplitCSV(6, 6)
	ds := e.Drain()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	type result struct {
		resp events.SQSEventResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := f.handler.Handle(ctx, lambdatest.SQSEvent(t, ds))
		done <- result{resp, err}
	}()
	for range 3 { // rows 2-4 hold the other concurrency slots
		<-p.held
	}
	// The invocation's time to start rows is over (the generator's clock
	// says so); the three calls in flight then answer.
	e.Clock.Advance(10 * time.Minute)
	close(p.gate)
	r := <-done
	if r.err != nil {
		t.Fatalf("Handle: %v", r.err)
	}
	if failed := f.deleteSucceeded(ds, r.resp); len(failed) != 0 {
		t.Fatalf("batch item failures = %v, want none: the message was replaced", failed)
	}
	again := e.Drain()
	if len(again) != 1 || again[0].ID == ds[0].ID || again[0].ReceiveCount != 1 {
		t.Fatalf("after the hand-back got %+v, want one fresh message received once", again)
	}
	rows, err := e.Store.ListRows(t.Context(), store.ListRowsParams{TaskID: "task-1"})
	if err != nil {
		t.Fatal(err)
	}
	var succeeded int
	for _, r := range rows {
		if r.State == store.RowSucceeded {
			succeeded++
		}
	}
	p.mu.Lock()
	calls := p.calls
	p.mu.Unlock()
	// Row 1's answer frees a slot before the stop, so row 5 may or may not
	// have started by then; row 6 can only start once a held call answers,
	// which is after the stop. Every call made, paid for, is saved.
	if succeeded != calls || succeeded < 4 || succeeded > 5 {
		t.Errorf("%d rows succeeded after %d model calls, want every call's row saved and 4 or 5 of them: the calls in flight at the stop finish, no row starts after it", succeeded, calls)
	}
	if got := f.lastMetrics()[metrics.BatchesReleased]; got != 1 {
		t.Errorf("BatchesReleased = %v, want 1", got)
	}
}

// TestGeneratorIdleAfterRecordsSettle: the handler calls Idle once per
// invocation, after every record's rows are saved and settled (the
// instance may be frozen next, so what it leased ahead of the shared quota
// is given back then, not while rows still draw on it).
func TestGeneratorIdleAfterRecordsSettle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.generator(sim.New(sim.Config{}), nil)
	taskID := e.SplitCSV(6, 2)
	var calls, doneAtIdle int
	f.handler.Idle = func(ctx context.Context) {
		calls++
		task, err := e.Store.GetTask(ctx, taskID)
		if err != nil {
			t.Error(err)
			return
		}
		doneAtIdle = task.RowsSucceeded
	}
	ds := e.Drain()
	if _, err := f.handler.Handle(t.Context(), lambdatest.SQSEvent(t, ds)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if calls != 1 {
		t.Errorf("Idle called %d times in one invocation, want once", calls)
	}
	if doneAtIdle != 6 {
		t.Errorf("Idle was called with %d of 6 rows saved, want all of them", doneAtIdle)
	}
}
