package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// env is the embedded runtime wired as `batchgen run` wires it, with a
// provider chosen by the test.
type env struct {
	t        testing.TB
	dir      string
	store    *sqlitestore.Store
	queue    *sqlitequeue.Queue
	blobs    *fileblob.Store
	signal   *pipeline.ExportSignal
	gen      *pipeline.Generator
	exporter *pipeline.Exporter
	splitter *pipeline.Splitter
	provider llm.Provider
	cfg      pipeline.GeneratorConfig
}

func newEnv(t testing.TB, provider llm.Provider, cfg pipeline.GeneratorConfig) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlitestore.Open(filepath.Join(dir, "db.sqlite"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: "batches", Visibility: time.Minute, MaxReceive: 10})
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := fileblob.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, store: st, queue: q, blobs: blobs, signal: &pipeline.ExportSignal{}}
	if cfg.ErrorDelay == 0 {
		cfg.ErrorDelay = 20 * time.Millisecond
	}
	if cfg.Cache == nil {
		cfg.Cache = st
	}
	if provider == nil { // tests that never generate
		provider = sim.New(sim.Config{})
	}
	if cfg.Owner == "" {
		cfg.Owner = "test"
	}
	e.provider, e.cfg = provider, cfg
	e.gen = pipeline.NewGenerator(st, provider, e.signal, cfg)
	e.exporter = pipeline.NewExporter(st, blobs, pipeline.ExporterConfig{})
	e.splitter = pipeline.NewSplitter(st, q, pipeline.SplitterConfig{Inputs: blobs, Exports: e.signal})
	return e
}

// useStore rebuilds the generator over st (a wrapper of e.store).
func (e *env) useStore(st store.Store) {
	e.gen = pipeline.NewGenerator(st, e.provider, e.signal, e.cfg)
}

func (e *env) writeCSV(name string, header []string, rows [][]string) string {
	e.t.Helper()
	var b strings.Builder
	b.WriteString(strings.Join(header, ",") + "\n")
	for _, r := range rows {
		b.WriteString(strings.Join(r, ",") + "\n")
	}
	path := filepath.Join(e.dir, name)
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return path
}

// runToCompletion runs local workers until the task is ready for export,
// then exports it.
func (e *env) runToCompletion(ctx context.Context, taskID string) store.Task {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	wctx, stop := context.WithCancel(ctx)
	workers := pipeline.NewLocalWorkers(e.queue, e.gen, pipeline.LocalWorkersConfig{Workers: 3, PollInterval: 5 * time.Millisecond})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = workers.Run(wctx) }()
	defer func() { stop(); wg.Wait() }()
	for {
		select {
		case id := <-e.signal.C():
			if id != taskID {
				continue
			}
			stop()
			wg.Wait()
			task, err := e.exporter.Export(ctx, taskID)
			if err != nil {
				e.t.Fatalf("export: %v", err)
			}
			return task
		case <-ctx.Done():
			t, _ := e.store.GetTask(context.Background(), taskID)
			// Which batches are open, and how (a RUNNING one leased to an
			// attempt that ended, or a PENDING one whose message is gone or
			// hidden), says where the work stopped.
			open, err := e.store.ListBatches(context.Background(), store.ListBatchesParams{TaskID: taskID,
				States: []store.BatchState{store.BatchPending, store.BatchRunning}})
			var lines []string
			for _, b := range open {
				lines = append(lines, fmt.Sprintf("batch %d %s attempt %d owner %q lease until %s, updated %s, last error %q",
					b.No, b.State, b.Attempt, b.Owner, b.LeaseUntil.Format(time.RFC3339Nano), b.UpdatedAt.Format(time.RFC3339Nano), b.LastError))
			}
			e.t.Fatalf("task %s did not finish: %+v\nopen batches (%v):\n%s", taskID, t, err, strings.Join(lines, "\n"))
		}
	}
}

// splitProducts splits n product rows (columns id and name) into a task
// with the given prompt and batch size, and returns the split's parameters
// (TaskID among them).
func (e *env) splitProducts(label, prompt string, n, batchSize int) pipeline.SplitParams {
	e.t.Helper()
	spec := store.TaskSpec{Prompt: prompt, Provider: "sim", BatchSize: batchSize}
	p := pipeline.SplitParams{
		TaskID: pipeline.DeriveTaskID(label, spec), Source: "in.csv", Spec: spec,
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(n)),
	}
	if _, err := e.splitter.Split(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) resultCells(task store.Task) [][]string {
	e.t.Helper()
	r, err := e.blobs.Open(context.Background(), task.ResultKey)
	if err != nil {
		e.t.Fatal(err)
	}
	defer r.Close()
	f, err := excelize.OpenReader(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	rows, err := f.GetRows(f.GetSheetName(0))
	if err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// countingProvider counts calls per prompt around a real provider.
type countingProvider struct {
	llm.Provider
	mu    sync.Mutex
	calls map[string]int
}

func newCounting(p llm.Provider) *countingProvider {
	return &countingProvider{Provider: p, calls: map[string]int{}}
}

func (c *countingProvider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	c.mu.Lock()
	c.calls[req.Prompt]++
	c.mu.Unlock()
	return c.Provider.Generate(ctx, req)
}

func (c *countingProvider) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.calls))
	for k, v := range c.calls {
		out[k] = v
	}
	return out
}

func productRows(n int) [][]string {
	rows := make([][]string, n)
	for i := range rows {
		rows[i] = []string{fmt.Sprintf("SKU-%04d", i+1), fmt.Sprintf("商品%d", i+1)}
	}
	return rows
}

func TestEndToEndEmbedded(t *testing.T) {
	t.Parallel()
	provider := newCounting(sim.New(sim.Config{Latency: time.Millisecond}))
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 8})
	path := e.writeCSV("skus.csv", []string{"sku", "名称"}, productRows(250))
	spec := store.TaskSpec{Prompt: "为{{名称}}（{{sku}}）写文案", Provider: "sim", Model: "sim-1", BatchSize: 40}
	id := pipeline.DeriveTaskID("test", spec)
	task, err := e.splitter.Split(context.Background(), pipeline.SplitParams{TaskID: id, Path: path, Source: "skus.csv", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if task.RowsTotal != 250 || task.BatchesTotal != 7 || task.State != store.TaskRunning {
		t.Fatalf("split task = %+v", task)
	}
	done := e.runToCompletion(context.Background(), id)
	if done.State != store.TaskSucceeded {
		t.Fatalf("state = %s, want SUCCEEDED", done.State)
	}
	cells := e.resultCells(done)
	wantHeader := []string{"sku", "名称", "output", "status", "error", "error_class", "cached", "attempts", "latency_ms",
		"provider", "input_tokens", "output_tokens", "rerun", "batchgen_key"}
	if diff := cmp.Diff(wantHeader, cells[0]); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	if len(cells) != 251 {
		t.Fatalf("result has %d rows, want 251", len(cells))
	}
	var sum store.Usage
	for i, row := range cells[1:] {
		if row[0] != fmt.Sprintf("SKU-%04d", i+1) {
			t.Fatalf("row %d is %q: rows out of order", i+1, row[0])
		}
		if row[3] != "succeeded" || row[2] == "" {
			t.Fatalf("row %d = %q, want succeeded with output", i+1, row)
		}
		in, errIn := strconv.ParseInt(row[10], 10, 64)
		out, errOut := strconv.ParseInt(row[11], 10, 64)
		if row[9] != "sim/sim-1" || errIn != nil || errOut != nil || in <= 0 || out <= 0 {
			t.Fatalf("row %d = %q, want provider sim/sim-1 and positive token counts", i+1, row)
		}
		sum = sum.Add(store.Usage{InputTokens: in, OutputTokens: out})
	}
	// The task's sums are the rows' tokens, each row counted once, and so
	// is its split by the provider that answered.
	if diff := cmp.Diff(sum, done.Usage); diff != "" {
		t.Errorf("task usage (-rows' sum +task):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]store.Usage{"sim/sim-1": sum}, done.UsageByProvider); diff != "" {
		t.Errorf("task usage by provider (-rows' sums +task):\n%s", diff)
	}
	for p, n := range provider.snapshot() {
		if n != 1 {
			t.Errorf("prompt %q called %d times", p, n)
		}
	}
}

func TestEveryMessageDeliveredTwiceBillsOnce(t *testing.T) {
	t.Parallel()
	provider := newCounting(sim.New(sim.Config{Latency: 2 * time.Millisecond}))
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 4})
	path := e.writeCSV("skus.csv", []string{"sku", "名称"}, productRows(120))
	spec := store.TaskSpec{Prompt: "{{sku}} {{名称}}", Provider: "sim", BatchSize: 10}
	id := pipeline.DeriveTaskID("dup", spec)
	task, err := e.splitter.Split(context.Background(), pipeline.SplitParams{TaskID: id, Path: path, Source: "skus.csv", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	// Deliver every batch a second time, in reverse order.
	var dups []queue.Outgoing
	for b := task.BatchesTotal; b >= 1; b-- {
		dups = append(dups, queue.Outgoing{Body: pipeline.EncodeBatchMessage(id, b)})
	}
	for i := 0; i < len(dups); i += 10 {
		if err := e.queue.Send(context.Background(), dups[i:min(i+10, len(dups))]); err != nil {
			t.Fatal(err)
		}
	}
	done := e.runToCompletion(context.Background(), id)
	if done.State != store.TaskSucceeded {
		t.Fatalf("state = %s", done.State)
	}
	calls := provider.snapshot()
	if len(calls) != 120 {
		t.Fatalf("%d distinct prompts called, want 120", len(calls))
	}
	for p, n := range calls {
		if n != 1 {
			t.Errorf("prompt %q billed %d times", p, n)
		}
	}
	if done.RowsSucceeded != 120 || done.BatchesDone != 12 {
		t.Errorf("counters = %d rows, %d batches; want 120, 12", done.RowsSucceeded, done.BatchesDone)
	}
}

// scripted is a provider whose answer depends on markers in the prompt:
// a unit-test double for the error-classification logic.
type scripted struct {
	mu    sync.Mutex
	calls map[string]int
}

func (s *scripted) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	s.mu.Lock()
	s.calls[req.Prompt]++
	n := s.calls[req.Prompt]
	s.mu.Unlock()
	switch {
	case strings.Contains(req.Prompt, "filter"):
		return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: 400, Message: "flagged"}
	case strings.Contains(req.Prompt, "flaky") && n <= 2:
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: 503, Message: "overloaded"}
	case strings.Contains(req.Prompt, "limited") && n <= 1:
		return llm.Response{}, &llm.Error{Class: llm.ClassRateLimited, StatusCode: 429, RetryAfter: 5 * time.Millisecond}
	case strings.Contains(req.Prompt, "down"):
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: 500, Message: "boom"}
	case strings.Contains(req.Prompt, "toolong"):
		return llm.Response{}, &llm.Error{Class: llm.ClassPromptTooLong, StatusCode: 400, Message: "context length"}
	}
	return llm.Response{Text: "ok: " + req.Prompt}, nil
}

func TestErrorClasses(t *testing.T) {
	t.Parallel()
	p := &scripted{calls: map[string]int{}}
	e := newEnv(t, p, pipeline.GeneratorConfig{
		Concurrency: 4, CallsPerRound: 2, Rounds: 3, RetryDelays: []time.Duration{10 * time.Millisecond},
		BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond, Limiter: nopLimiter{},
	})
	rows := [][]string{{"1", "fine"}, {"2", "filter"}, {"3", "flaky"}, {"4", "down"}, {"5", "toolong"}, {"6", "limited"}, {"7", "fine too"}}
	path := e.writeCSV("in.csv", []string{"id", "kind"}, rows)
	spec := store.TaskSpec{Prompt: "{{id}} {{kind}}", Provider: "scripted", BatchSize: 3}
	id := pipeline.DeriveTaskID("classes", spec)
	if _, err := e.splitter.Split(context.Background(), pipeline.SplitParams{TaskID: id, Path: path, Source: "in.csv", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	done := e.runToCompletion(context.Background(), id)
	if done.State != store.TaskPartial {
		t.Fatalf("state = %s, want PARTIAL", done.State)
	}
	got := map[string][3]string{}
	for _, r := range e.resultCells(done)[1:] {
		got[r[1]] = [3]string{r[3], r[5], r[7]} // status, error_class, attempts
	}
	want := map[string][3]string{
		"fine":     {"succeeded", "", "1"},
		"filter":   {"failed", "content_filter", "1"},
		"flaky":    {"succeeded", "", "3"},
		"down":     {"failed", "retry_exhausted", "6"},
		"toolong":  {"failed", "prompt_too_long", "1"},
		"limited":  {"succeeded", "", "2"},
		"fine too": {"succeeded", "", "1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("per-row outcome (-want +got):\n%s", diff)
	}
}

func TestFatalProviderErrorStopsCalling(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return llm.Response{}, &llm.Error{Class: llm.ClassQuotaExhausted, StatusCode: 429, Message: "You exceeded your current quota"}
	})
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 1})
	id := e.splitProducts("fatal", "{{id}}", 50, 10).TaskID
	done := e.runToCompletion(context.Background(), id)
	if done.State != store.TaskPartial {
		t.Fatalf("state = %s", done.State)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls > 2 {
		t.Errorf("provider called %d times after insufficient_quota; want the job to stop calling", calls)
	}
	for _, r := range e.resultCells(done)[1:] {
		if r[3] != "failed" || r[5] != "insufficient_quota" {
			t.Fatalf("row %q: want failed insufficient_quota", r)
		}
	}
}

func TestSplitRejectsUnknownPlaceholderAndWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	path := e.writeCSV("in.csv", []string{"商品名称", "类目"}, [][]string{{"杯子", "家居"}})
	spec := store.TaskSpec{Prompt: "写{{商品名}}", Provider: "sim"}
	_, err := e.splitter.Split(context.Background(), pipeline.SplitParams{TaskID: "t1", Path: path, Source: "in.csv", Spec: spec})
	var rej *pipeline.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("err = %v, want *RejectedError", err)
	}
	if !strings.Contains(err.Error(), `"商品名称", "类目"`) {
		t.Errorf("message %q does not list the columns", err)
	}
	if _, err := e.store.GetTask(context.Background(), "t1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("task was written for a rejected input: %v", err)
	}
	if ds, _ := e.queue.Receive(context.Background(), 10); len(ds) != 0 {
		t.Errorf("%d messages enqueued for a rejected input", len(ds))
	}
}

func TestExportFormulaLookingOutputStaysText(t *testing.T) {
	t.Parallel()
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		return llm.Response{Text: "=HYPERLINK(\"http://x\",\"" + req.Prompt + "\")"}, nil
	})
	e := newEnv(t, p, pipeline.GeneratorConfig{})
	path := e.writeCSV("in.csv", []string{"v"}, [][]string{{"+1"}, {"-2"}, {"@x"}})
	spec := store.TaskSpec{Prompt: "{{v}}", Provider: "x"}
	id := pipeline.DeriveTaskID("formula", spec)
	if _, err := e.splitter.Split(context.Background(), pipeline.SplitParams{TaskID: id, Path: path, Source: "in.csv", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	done := e.runToCompletion(context.Background(), id)
	r, err := e.blobs.Open(context.Background(), done.ResultKey)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(r); err != nil {
		t.Fatal(err)
	}
	f, err := excelize.OpenReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	sheet := f.GetSheetName(0)
	for row := 2; row <= 4; row++ {
		for _, col := range []string{"A", "B"} {
			cell := fmt.Sprintf("%s%d", col, row)
			if formula, _ := f.GetCellFormula(sheet, cell); formula != "" {
				t.Errorf("cell %s became formula %q", cell, formula)
			}
		}
	}
	if v, _ := f.GetCellValue(sheet, "A2"); v != "+1" {
		t.Errorf("A2 = %q, want +1", v)
	}
}

type providerFunc func(ctx context.Context, req llm.Request) (llm.Response, error)

func (f providerFunc) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	return f(ctx, req)
}

type nopLimiter struct{}

func (nopLimiter) Wait(ctx context.Context, _ int) error { return ctx.Err() }
func (nopLimiter) Settle(int, int)                       {}
func (nopLimiter) Observe(llm.RateLimits)                {}
func (nopLimiter) Penalize(time.Duration)                {}

// TestResumedSplitSendsOnlyUnclaimedBatches: a split that died after
// enqueueing, with some batches already claimed or done, resumes without a
// second message for those batches.
func TestResumedSplitSendsOnlyUnclaimedBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	params := e.splitProducts("resume", "{{id}}", 50, 10)
	id := params.TaskID
	drain := func() map[int]int {
		got := map[int]int{}
		for {
			ds, err := e.queue.Receive(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) == 0 {
				return got
			}
			for _, d := range ds {
				m, _ := pipeline.DecodeBatchMessage(d.Body)
				got[m.BatchNo]++
				_ = e.queue.Delete(ctx, d.Receipt)
			}
		}
	}
	if got := drain(); len(got) != 5 {
		t.Fatalf("first split sent %v, want one message per batch", got)
	}
	// Batches 1 and 2 were picked up; then the task is put back to PENDING
	// as if the split had died before its last step.
	for no := 1; no <= 2; no++ {
		if _, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: no, Owner: "w", Now: time.Now(), LeaseUntil: time.Now().Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.store.TransitionTask(ctx, store.TransitionTaskParams{ID: id, From: []store.TaskState{store.TaskRunning}, To: store.TaskPending, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	task, err := e.splitter.Split(ctx, params)
	if err != nil || task.State != store.TaskRunning {
		t.Fatalf("resumed split: %v, state %s", err, task.State)
	}
	if diff := cmp.Diff(map[int]int{3: 1, 4: 1, 5: 1}, drain()); diff != "" {
		t.Errorf("resumed split's messages (-want +got):\n%s", diff)
	}
}
