package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	anthropicllm "github.com/batchgen/batchgen/internal/llm/anthropic"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// lockedBuffer is a paid log written by a server's handlers at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) paid(t *testing.T) map[string]mockserver.Paid {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	p, err := mockserver.ParsePaidLog(l.b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mockBatchServer starts a mock-llm with cfg, its paid log kept, and
// returns the OpenAI adapter talking to it.
func mockBatchServer(t *testing.T, cfg mockserver.Config) (*mockserver.Server, *openaillm.Provider, *lockedBuffer) {
	t.Helper()
	paid := &lockedBuffer{}
	cfg.PaidLog = paid
	srv := mockserver.New(cfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	p, err := openaillm.New(openaillm.Config{Conn: llm.Conn{BaseURL: hs.URL + "/v1", Model: "mock-1"}})
	if err != nil {
		t.Fatal(err)
	}
	return srv, p, paid
}

// The provider labels of the rows of the tasks of splitEconomy: answered
// online, and through the batch API.
const (
	onlineLabel = "mock/mock-1"
	batchLabel  = onlineLabel + pricing.BatchSuffix
)

// economyConfig is a generator's configuration for economy tests: short
// gathers, polls and backoffs.
func economyConfig() pipeline.GeneratorConfig {
	return pipeline.GeneratorConfig{
		Concurrency: 4, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		RetryDelays: []time.Duration{20 * time.Millisecond},
		Economy:     pipeline.EconomyConfig{Gather: 100 * time.Millisecond, Poll: 50 * time.Millisecond},
	}
}

// newEconomyEnv is newEnv with the provider batches' journal in the env's
// blobs, as the embedded runtime keeps it.
func newEconomyEnv(t *testing.T, provider llm.Provider, cfg pipeline.GeneratorConfig) (*env, store.ProviderBatches) {
	e := newEnv(t, provider, cfg)
	journal := e.store
	e.cfg.Economy.Journal = journal
	e.gen = pipeline.NewGenerator(e.store, provider, e.signal, e.cfg)
	return e, journal
}

// splitEconomy splits n product rows into a task of the given terms.
func (e *env) splitEconomy(label string, n, batchSize int, terms store.Terms) pipeline.SplitParams {
	e.t.Helper()
	spec := store.TaskSpec{Prompt: "{{id}} {{name}}", Provider: "mock", Model: "mock-1", BatchSize: batchSize}
	p := pipeline.SplitParams{
		TaskID: pipeline.DeriveTaskID(label, spec), Source: "in.csv", Spec: spec, Terms: terms,
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(n)),
	}
	if _, err := e.splitter.Split(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// checkAnswers checks that every row of task succeeded with its own
// answer (the mock answers "Copy for: PROMPT") and returns how many rows
// each provider label answered.
func checkAnswers(t testing.TB, e *env, task store.Task) map[string]int {
	t.Helper()
	cells := e.resultCells(task)
	col := map[string]int{}
	for i, h := range cells[0] {
		col[h] = i
	}
	labels := map[string]int{}
	for _, row := range cells[1:] {
		if row[col["status"]] != "succeeded" {
			t.Errorf("row %v: want succeeded", row)
			continue
		}
		if want := "Copy for: " + row[col["id"]] + " " + row[col["name"]]; row[col["output"]] != want {
			t.Errorf("row %s answered %q, want %q: an answer matched to another row", row[col["id"]], row[col["output"]], want)
		}
		labels[row[col["provider"]]]++
	}
	return labels
}

// TestEconomyMatchesAnswersAndRetriesFailedLines: an economy task's rows
// go to the provider's batch API, whose answers come back shuffled and
// with a fifth of the lines failed (a retryable 500 in the error file).
// Every row gets its own answer, the failed lines are sent again in a
// later batch, no prompt is paid twice, none online, and the task's cost
// is the batch price: half the online one, the saving shown.
func TestEconomyMatchesAnswersAndRetriesFailedLines(t *testing.T) {
	t.Parallel()
	srv, provider, paid := mockBatchServer(t, mockserver.Config{BatchDelay: 300 * time.Millisecond, BatchErrorRate: 0.2, Latency: time.Millisecond})
	e, _ := newEconomyEnv(t, provider, economyConfig())
	const rows = 400
	p := e.splitEconomy("economy", rows, 50, store.Terms{Mode: store.ModeEconomy})
	task := e.runToCompletion(context.Background(), p.TaskID)
	if task.State != store.TaskSucceeded || task.RowsSucceeded != rows {
		t.Fatalf("task %s with %d of %d rows succeeded; want SUCCEEDED with all", task.State, task.RowsSucceeded, rows)
	}
	labels := checkAnswers(t, e, task)
	if labels[batchLabel] != rows {
		t.Errorf("providers of the rows %v: want all %d answered as %q", labels, rows, batchLabel)
	}
	counts := paid.paid(t)
	if len(counts) != rows {
		t.Errorf("%d prompts paid, want %d", len(counts), rows)
	}
	for prompt, n := range counts {
		if n.Online != 0 || n.Batch != 1 {
			t.Errorf("prompt %q paid %d times online and %d in batches; want once, in a batch", prompt, n.Online, n.Batch)
		}
	}
	st := srv.Stats()
	if st.BatchFailed == 0 || st.BatchLines <= rows {
		t.Errorf("the mock failed %d of %d lines: want some failed and sent again", st.BatchFailed, st.BatchLines)
	}
	prices := pricing.Default().With(map[string]pricing.Price{"mock-1": {InputPerMTok: 10, OutputPerMTok: 30}})
	batchCost := prices.Task(task)
	online := task
	online.UsageByProvider = map[string]store.Usage{onlineLabel: task.UsageByProvider[batchLabel]}
	onlineCost := prices.Task(online)
	if !batchCost.Known || batchCost.Cost <= 0 || batchCost.Cost > 0.5*onlineCost.Cost*1.0001 {
		t.Errorf("cost %v at the batch price, %v online: want half", batchCost, onlineCost)
	}
	if d := batchCost.Saved - (onlineCost.Cost - batchCost.Cost); d > 1e-9 || d < -1e-9 {
		t.Errorf("saving %v, want %v", batchCost.Saved, onlineCost.Cost-batchCost.Cost)
	}
	if !strings.Contains(batchCost.String(), "less than online through the batch API") {
		t.Errorf("estimate %q does not show the saving", batchCost)
	}
}

// TestEconomyFinalLineErrorFailsItsRow: a line the provider refuses for
// good in its error file (a content filter) fails its row at once, as
// online, and is not sent again.
func TestEconomyFinalLineErrorFailsItsRow(t *testing.T) {
	t.Parallel()
	srv, provider, _ := mockBatchServer(t, mockserver.Config{BatchDelay: 100 * time.Millisecond, FilterMarker: "商品7"})
	e, _ := newEconomyEnv(t, provider, economyConfig())
	p := e.splitEconomy("economy-filter", 20, 10, store.Terms{Mode: store.ModeEconomy})
	task := e.runToCompletion(context.Background(), p.TaskID)
	if task.RowsFailed != 1 || task.RowsSucceeded != 19 {
		t.Fatalf("%d failed and %d succeeded; want the filtered row failed", task.RowsFailed, task.RowsSucceeded)
	}
	rows, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: p.TaskID, FromNo: 1, ToNo: 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.State == store.RowFailed && (r.ErrorClass != "content_filter" || r.Attempts != 1) {
			t.Errorf("row %d failed as %s after %d attempts; want content_filter after 1", r.No, r.ErrorClass, r.Attempts)
		}
	}
	if st := srv.Stats(); st.BatchLines != 20 {
		t.Errorf("%d lines sent for 20 rows: a final error was sent again", st.BatchLines)
	}
}

// TestEconomyResumesItsProviderBatches: a run killed while its rows wait
// for their provider batches leaves the batches' ids in the journal; the
// next run finds them, sends nothing again and takes their answers.
func TestEconomyResumesItsProviderBatches(t *testing.T) {
	t.Parallel()
	srv, provider, paid := mockBatchServer(t, mockserver.Config{BatchDelay: 8 * time.Second, Latency: time.Millisecond})
	e, journal := newEconomyEnv(t, provider, economyConfig())
	const rows = 120
	p := e.splitEconomy("economy-resume", rows, 30, store.Terms{Mode: store.ModeEconomy})

	// The first run, killed once every row is in a recorded provider
	// batch.
	e.runUntilJournaled(journal, p.TaskID, rows, 0)
	if st := srv.Stats(); st.BatchLines >= rows {
		t.Fatalf("the mock answered all %d lines before the kill; the test wants the run killed midway", st.BatchLines)
	}

	// The next run: a new process's generator over the same data.
	task := e.resumeInNewProcess(provider, p.TaskID)
	if task.RowsSucceeded != rows {
		t.Fatalf("%d of %d rows succeeded after the resume", task.RowsSucceeded, rows)
	}
	checkAnswers(t, e, task)
	if st := srv.Stats(); st.BatchLines != rows {
		t.Errorf("the mock ran %d lines for %d rows: the resumed run sent rows again", st.BatchLines, rows)
	}
	for prompt, n := range paid.paid(t) {
		if n.Calls() != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n.Calls())
		}
	}
}

// TestAutoCutsOverBeforeTheDeadline: an auto task whose provider batch
// would take 12 s, with a deadline 8 s away, cancels the batch when the
// deadline leaves just the time its waiting rows need online, keeps every
// answer the batch returned, and calls the rest online: done before the
// deadline, nothing paid twice. The margin (3 s for 100 rows the online
// pace takes 1 s to answer) is wide enough for a machine busy with the
// rest of the tests.
func TestAutoCutsOverBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	_, provider, paid := mockBatchServer(t, mockserver.Config{BatchDelay: 12 * time.Second, Latency: 5 * time.Millisecond})
	cfg := economyConfig()
	cfg.Economy.OnlineRate = 100
	cfg.Economy.CutOverMargin = 3 * time.Second
	e, _ := newEconomyEnv(t, provider, cfg)
	const rows = 100
	deadline := time.Now().Add(8 * time.Second)
	p := e.splitEconomy("auto", rows, 25, store.Terms{Mode: store.ModeAuto, Deadline: deadline})
	task := e.runToCompletion(context.Background(), p.TaskID)
	if now := time.Now(); now.After(deadline) {
		t.Errorf("the task ended %v after its deadline", now.Sub(deadline))
	}
	if task.RowsSucceeded != rows {
		t.Fatalf("%d of %d rows succeeded", task.RowsSucceeded, rows)
	}
	labels := checkAnswers(t, e, task)
	if labels[batchLabel] == 0 || labels[onlineLabel] == 0 || labels[batchLabel]+labels[onlineLabel] != rows {
		t.Errorf("rows by provider %v: want some answered by the cancelled batch and the rest online", labels)
	}
	var batch, online int
	for prompt, n := range paid.paid(t) {
		if n.Calls() != 1 {
			t.Errorf("prompt %q paid %d times (%d online, %d in batches)", prompt, n.Calls(), n.Online, n.Batch)
		}
		batch += n.Batch
		online += n.Online
	}
	if batch != labels[batchLabel] || online != labels[onlineLabel] {
		t.Errorf("paid %d in batches and %d online; the result shows %v", batch, online, labels)
	}
}

// TestEconomyWithoutJournalRunsOnline: a runtime that keeps no journal of
// provider batches (the AWS stack, for now) calls an economy task's rows
// online rather than risk paying for them twice after a restart.
func TestEconomyWithoutJournalRunsOnline(t *testing.T) {
	t.Parallel()
	srv, provider, _ := mockBatchServer(t, mockserver.Config{BatchDelay: 100 * time.Millisecond, Latency: time.Millisecond})
	e := newEnv(t, provider, economyConfig())
	p := e.splitEconomy("economy-no-journal", 20, 10, store.Terms{Mode: store.ModeEconomy})
	task := e.runToCompletion(context.Background(), p.TaskID)
	if labels := checkAnswers(t, e, task); labels[onlineLabel] != 20 {
		t.Errorf("rows by provider %v: want all online", labels)
	}
	if st := srv.Stats(); st.BatchLines != 0 {
		t.Errorf("%d batch lines sent without a journal", st.BatchLines)
	}
}

// TestAutoResumedPastItsCutOver: an auto task killed while its rows wait
// for a provider batch, resumed when its deadline needs the rest online at
// once, reads back every answer the batch had (the batch cancelled), calls
// only the others online, and pays no prompt twice.
func TestAutoResumedPastItsCutOver(t *testing.T) {
	t.Parallel()
	srv, provider, paid := mockBatchServer(t, mockserver.Config{BatchDelay: 20 * time.Second, Latency: time.Millisecond})
	cfg := economyConfig()
	cfg.Economy.OnlineRate = 100
	cfg.Economy.CutOverMargin = 500 * time.Millisecond
	e, journal := newEconomyEnv(t, provider, cfg)
	const rows = 80
	p := e.splitEconomy("auto-resume", rows, 20, store.Terms{Mode: store.ModeAuto, Deadline: time.Now().Add(time.Hour)})

	e.runUntilJournaled(journal, p.TaskID, rows, 2*time.Second) // a tenth of the batch's lines answered

	// The deadline moved up: the rows waiting need it all online.
	if _, err := e.store.SetTerms(context.Background(), p.TaskID, store.Terms{Mode: store.ModeAuto, Deadline: time.Now().Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	task := e.resumeInNewProcess(provider, p.TaskID)
	if task.RowsSucceeded != rows {
		t.Fatalf("%d of %d rows succeeded", task.RowsSucceeded, rows)
	}
	labels := checkAnswers(t, e, task)
	if labels[batchLabel] == 0 || labels[onlineLabel] == 0 {
		t.Errorf("rows by provider %v: want the batch's answers read back and the rest online", labels)
	}
	for prompt, n := range paid.paid(t) {
		if n.Calls() != 1 {
			t.Errorf("prompt %q paid %d times (%d online, %d in batches)", prompt, n.Calls(), n.Online, n.Batch)
		}
	}
	if st := srv.Stats(); st.BatchLines != int64(labels[batchLabel]) {
		t.Errorf("the mock answered %d batch lines; the result keeps %d", st.BatchLines, labels[batchLabel])
	}
}

// TestEconomyOnAnthropic: the same lane over Anthropic's Message Batches
// (the mock's, through the official SDK): every row its own answer,
// failed lines sent again, each prompt paid once, in a batch.
func TestEconomyOnAnthropic(t *testing.T) {
	t.Parallel()
	paidLog := &lockedBuffer{}
	srv := mockserver.New(mockserver.Config{BatchDelay: 300 * time.Millisecond, BatchErrorRate: 0.2, Latency: time.Millisecond, PaidLog: paidLog})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	provider, err := anthropicllm.New(anthropicllm.Config{Conn: llm.Conn{BaseURL: hs.URL, APIKey: "test", Model: "mock-1"}})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := newEconomyEnv(t, provider, economyConfig())
	const rows = 120
	p := e.splitEconomy("economy-anthropic", rows, 40, store.Terms{Mode: store.ModeEconomy})
	e.runAllInBatches(p.TaskID, rows)
	if st := srv.Stats(); st.BatchFailed == 0 {
		t.Error("no line failed: the test wants some sent again")
	}
	for prompt, n := range paidLog.paid(t) {
		if n.Online != 0 || n.Batch != 1 {
			t.Errorf("prompt %q paid %d times online and %d in batches", prompt, n.Online, n.Batch)
		}
	}
}

// brokenJournal cannot be read.
type brokenJournal struct{}

func (brokenJournal) ListProviderBatches(context.Context, string) ([]store.ProviderBatch, error) {
	return nil, errors.New("disk on fire")
}
func (brokenJournal) RecordProviderBatch(context.Context, string, store.ProviderBatch) error {
	return nil
}

// TestEconomyUnreadableJournalWaits: when the journal of provider batches
// cannot be read, an economy task's rows neither go online nor into a new
// batch (a batch already sent might answer them: either would pay twice);
// each call is a failed attempt saying why, and the batch is tried again
// after a delay, not at once.
func TestEconomyUnreadableJournalWaits(t *testing.T) {
	t.Parallel()
	srv, provider, _ := mockBatchServer(t, mockserver.Config{BatchDelay: 100 * time.Millisecond, Latency: time.Millisecond})
	cfg := economyConfig()
	cfg.Economy.Journal = brokenJournal{}
	e := newEnv(t, provider, cfg)
	p := e.splitEconomy("economy-broken-journal", 10, 10, store.Terms{Mode: store.ModeEconomy})
	out := e.gen.Process(context.Background(), pipeline.Delivery{Body: pipeline.EncodeBatchMessage(p.TaskID, 1)})
	if out.Ack || out.RetryAfter <= 0 {
		t.Errorf("outcome %+v: want the batch released for a later round", out)
	}
	rows, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: p.TaskID, FromNo: 1, ToNo: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.State != store.RowPending || r.Attempts == 0 || !strings.Contains(r.Error, "read the journal of provider batches: disk on fire") {
			t.Errorf("row %d is %s after %d attempts (%q); want pending after failed attempts saying why", r.No, r.State, r.Attempts, r.Error)
		}
	}
	if st := srv.Stats(); st.Requests != 0 || st.BatchLines != 0 {
		t.Errorf("the mock had %d online requests and %d batch lines; want none", st.Requests, st.BatchLines)
	}
}

// resumeInNewProcess works task taskID to its end as a new process would
// after a kill: a new generator (no lanes, no memory of the batches sent),
// the dead process's leases released.
func (e *env) resumeInNewProcess(provider llm.Provider, taskID string) store.Task {
	e.t.Helper()
	e.gen = pipeline.NewGenerator(e.store, provider, e.signal, e.cfg)
	task, err := e.store.GetTask(context.Background(), taskID)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := pipeline.Resume(context.Background(), e.store, e.queue, task, time.Now()); err != nil {
		e.t.Fatal(err)
	}
	return e.runToCompletion(context.Background(), taskID)
}

// runUntilJournaled works task taskID until all its rows are in provider
// batches the journal records, then for after more, and kills the workers
// (their process, as far as the lanes go: resumeInNewProcess follows).
func (e *env) runUntilJournaled(journal store.ProviderBatches, taskID string, rows int, after time.Duration) {
	e.t.Helper()
	e.runUntilSent(journal, taskID, rows, after, false)
}

// runUntilSent is runUntilJournaled counting the rows of the batches about
// to be sent (the journal's intents) too when intents is set.
func (e *env) runUntilSent(journal store.ProviderBatches, taskID string, rows int, after time.Duration, intents bool) {
	e.t.Helper()
	ctx, kill := context.WithCancel(context.Background())
	workers := pipeline.NewLocalWorkers(e.queue, e.gen, pipeline.LocalWorkersConfig{Workers: 2, PollInterval: 5 * time.Millisecond})
	done := make(chan struct{})
	go func() { defer close(done); _ = workers.Run(ctx) }()
	defer func() { kill(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for lines := 0; lines < rows; {
		entries, err := journal.ListProviderBatches(context.Background(), taskID)
		if err != nil {
			e.t.Fatal(err)
		}
		lines = 0
		for _, en := range entries {
			if en.Job != "" || (en.Intent && intents) {
				lines += len(en.Lines)
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d of %d rows in recorded provider batches after 20 s", lines, rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(after)
}

// TestEconomyLearnsTheQueueLimit: a provider whose queue holds at most 100
// lines in flight fails a batch of 300 whole (OpenAI's
// token_limit_exceeded, billing nothing). The lane sends the lines again
// in smaller batches, learning the limit from the refusals: every row is
// answered in a batch, on its first attempt, paid once.
func TestEconomyLearnsTheQueueLimit(t *testing.T) {
	t.Parallel()
	srv, provider, paid := mockBatchServer(t, mockserver.Config{BatchDelay: 300 * time.Millisecond, BatchQueueLimit: 100, Latency: time.Millisecond})
	cfg := economyConfig()
	cfg.Economy.RefusalWait = 100 * time.Millisecond
	e, _ := newEconomyEnv(t, provider, cfg)
	const rows = 300
	p := e.splitEconomy("economy-queue-limit", rows, 100, store.Terms{Mode: store.ModeEconomy})
	e.runAllInBatches(p.TaskID, rows)
	st := srv.Stats()
	if st.BatchesRefused == 0 {
		t.Error("no batch was refused: the test wants the queue limit met")
	}
	t.Logf("%d batches refused for the queue limit", st.BatchesRefused)
	rs, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: p.TaskID, FromNo: 1, ToNo: rows})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Attempts != 1 {
			t.Errorf("row %d took %d attempts: a refused batch cost it one", r.No, r.Attempts)
		}
	}
	for prompt, n := range paid.paid(t) {
		if n.Calls() != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n.Calls())
		}
	}
}

// TestEconomyLearnsTheJobsQuota: a provider that takes at most 2 batches
// in progress at once refuses a third for now (a concurrent-jobs quota, as
// Bedrock's). The lane learns the quota from the first refusals and sends
// each batch left when one of its own ends, instead of asking again every
// RefusalWait (10 ms here, against 1-s batches, which blind asks would
// turn into dozens of refusals): every row is answered in a batch, on its
// first attempt, paid once.
//
// The batches take a second, not 300 ms: on a loaded machine (the unit
// stage at its busiest) the six batches' rows reached their lanes so far
// apart that two at a time were never exceeded, and the test, rightly,
// failed for want of a refusal.
func TestEconomyLearnsTheJobsQuota(t *testing.T) {
	t.Parallel()
	srv, provider, paid := mockBatchServer(t, mockserver.Config{BatchDelay: time.Second, BatchJobsLimit: 2, Latency: time.Millisecond})
	cfg := economyConfig()
	cfg.Economy.RefusalWait = 10 * time.Millisecond
	cfg.Economy.MaxLines = 50
	e, _ := newEconomyEnv(t, provider, cfg)
	const rows = 300
	p := e.splitEconomy("economy-jobs-quota", rows, 100, store.Terms{Mode: store.ModeEconomy})
	e.runAllInBatches(p.TaskID, rows)
	st := srv.Stats()
	t.Logf("%d batches created, %d creates refused for the jobs quota, at most %d in progress", st.BatchesCreated, st.CreatesOverJobs, st.MostJobsInProgress)
	if st.CreatesOverJobs == 0 {
		t.Error("no create was refused: the test wants the jobs quota met")
	}
	if st.CreatesOverJobs > 10 {
		t.Errorf("%d creates refused for %d batches: the lane kept asking instead of waiting for its batches to end", st.CreatesOverJobs, st.BatchesCreated)
	}
	rs, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: p.TaskID, FromNo: 1, ToNo: rows})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Attempts != 1 {
			t.Errorf("row %d took %d attempts: a refused batch cost it one", r.No, r.Attempts)
		}
	}
	for prompt, n := range paid.paid(t) {
		if n.Calls() != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n.Calls())
		}
	}
}

// TestEconomyDropsIdleLanes: a lane whose task is done gives its memory
// back once idle (here after 50 ms); the next task's lane lives on.
func TestEconomyDropsIdleLanes(t *testing.T) {
	t.Parallel()
	_, provider, _ := mockBatchServer(t, mockserver.Config{BatchDelay: 100 * time.Millisecond, Latency: time.Millisecond})
	cfg := economyConfig()
	cfg.Economy.IdleLane = 50 * time.Millisecond
	cfg.CacheMode = pipeline.CacheOff // the second task asks the first's questions
	e, _ := newEconomyEnv(t, provider, cfg)
	first := e.splitEconomy("economy-idle-1", 10, 10, store.Terms{Mode: store.ModeEconomy})
	e.runToCompletion(context.Background(), first.TaskID)
	if _, ok := e.gen.EconomyStatus(first.TaskID); !ok {
		t.Fatal("no lane for the first task right after it ran")
	}
	time.Sleep(100 * time.Millisecond)
	second := e.splitEconomy("economy-idle-2", 10, 10, store.Terms{Mode: store.ModeEconomy})
	e.runToCompletion(context.Background(), second.TaskID)
	if _, ok := e.gen.EconomyStatus(first.TaskID); ok {
		t.Error("the first task's lane is kept after it was idle")
	}
	if _, ok := e.gen.EconomyStatus(second.TaskID); !ok {
		t.Error("the second task's lane is gone while it was just used")
	}
}

// runAllInBatches works task taskID to its end and checks that each of its
// rows succeeded with its own answer, answered through the batch API.
func (e *env) runAllInBatches(taskID string, rows int) store.Task {
	e.t.Helper()
	task := e.runToCompletion(context.Background(), taskID)
	if task.RowsSucceeded != rows {
		e.t.Fatalf("%d of %d rows succeeded", task.RowsSucceeded, rows)
	}
	if labels := checkAnswers(e.t, e, task); labels[batchLabel] != rows {
		e.t.Errorf("rows by provider %v: want all through the batch API", labels)
	}
	return task
}

// mockBatchProvider starts a mock-llm with cfg, its paid log kept, and
// returns the adapter of kind ("openai" or "anthropic") talking to it.
func mockBatchProvider(t *testing.T, kind string, cfg mockserver.Config) (*mockserver.Server, llm.Provider, *lockedBuffer) {
	t.Helper()
	if kind == "openai" {
		return mockBatchServer(t, cfg)
	}
	paid := &lockedBuffer{}
	cfg.PaidLog = paid
	srv := mockserver.New(cfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	p, err := anthropicllm.New(anthropicllm.Config{Conn: llm.Conn{BaseURL: hs.URL, APIKey: "test", Model: "mock-1"}})
	if err != nil {
		t.Fatal(err)
	}
	return srv, p, paid
}

// checkPaidOnceInBatches checks that each of rows prompts was paid once,
// in a provider batch, and that the provider ran each line once.
func checkPaidOnceInBatches(t *testing.T, srv *mockserver.Server, paid *lockedBuffer, rows int) {
	t.Helper()
	counts := paid.paid(t)
	if len(counts) != rows {
		t.Errorf("%d prompts paid, want %d", len(counts), rows)
	}
	for prompt, n := range counts {
		if n.Online != 0 || n.Batch != 1 {
			t.Errorf("prompt %q paid %d times online and %d in batches; want once, in a batch", prompt, n.Online, n.Batch)
		}
	}
	if st := srv.Stats(); st.BatchLines != int64(rows) {
		t.Errorf("the provider ran %d lines for %d rows", st.BatchLines, rows)
	}
}

// TestEconomyFindsABatchWhoseAnswerWasLost: the provider takes a batch and
// its answer is lost (a 502 from a proxy, a timeout). The lane asks the
// provider for the batch by its key before sending its lines again, finds
// it, and takes its answers: no line is paid twice. On OpenAI the key is
// in the batch's metadata; Message Batches keep none, and the batch is
// found by its size and time.
func TestEconomyFindsABatchWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"openai", "anthropic"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			srv, provider, paid := mockBatchProvider(t, kind, mockserver.Config{BatchDelay: 200 * time.Millisecond, Latency: time.Millisecond, BatchAnswersLost: 2})
			cfg := economyConfig()
			cfg.Economy.MaxLines = 30 // three provider batches, two answers lost
			e, _ := newEconomyEnv(t, provider, cfg)
			const rows = 90
			p := e.splitEconomy("economy-lost-"+kind, rows, 30, store.Terms{Mode: store.ModeEconomy})
			e.runAllInBatches(p.TaskID, rows)
			checkPaidOnceInBatches(t, srv, paid, rows)
			st := srv.Stats()
			if st.BatchesCreated != 3 {
				t.Errorf("%d batches created for 90 rows in batches of 30 (two answers lost): want 3", st.BatchesCreated)
			}
		})
	}
}

// forgetfulJournal records a batch's intent but not the batch the provider
// took: a process killed between the two.
type forgetfulJournal struct{ store.ProviderBatches }

func (j forgetfulJournal) RecordProviderBatch(ctx context.Context, taskID string, e store.ProviderBatch) error {
	if e.Job != "" {
		return nil
	}
	return j.ProviderBatches.RecordProviderBatch(ctx, taskID, e)
}

// TestEconomyKilledBetweenSendAndRecord: a run killed after the provider
// took its batches and before its journal recorded them leaves their
// intents alone. The next run asks the provider for them before sending
// any row again, finds them and reads their answers back: every line runs
// once, every prompt is paid once.
func TestEconomyKilledBetweenSendAndRecord(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"openai", "anthropic"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			srv, provider, paid := mockBatchProvider(t, kind, mockserver.Config{BatchDelay: 3 * time.Second, Latency: time.Millisecond})
			e, journal := newEconomyEnv(t, provider, economyConfig())
			const rows = 80
			p := e.splitEconomy("economy-unrecorded-"+kind, rows, 20, store.Terms{Mode: store.ModeEconomy})

			// The first run records intents only, and is killed once the
			// provider holds every row.
			cfg := e.cfg
			cfg.Economy.Journal = forgetfulJournal{journal}
			e.gen = pipeline.NewGenerator(e.store, provider, e.signal, cfg)
			e.runUntilSent(journal, p.TaskID, rows, 300*time.Millisecond, true)
			if st := srv.Stats(); st.BatchesCreated == 0 || st.BatchLines >= rows {
				t.Fatalf("at the kill the provider had %d batches and had run %d lines; the test wants the batches taken and running", st.BatchesCreated, st.BatchLines)
			}
			created := srv.Stats().BatchesCreated

			task := e.resumeInNewProcess(provider, p.TaskID)
			if task.RowsSucceeded != rows {
				t.Fatalf("%d of %d rows succeeded after the resume", task.RowsSucceeded, rows)
			}
			checkAnswers(t, e, task)
			checkPaidOnceInBatches(t, srv, paid, rows)
			if st := srv.Stats(); st.BatchesCreated != created {
				t.Errorf("the resumed run created %d batches more: it sent rows again", st.BatchesCreated-created)
			}
			entries, err := journal.ListProviderBatches(context.Background(), p.TaskID)
			if err != nil {
				t.Fatal(err)
			}
			found := 0
			for _, en := range entries {
				if en.Job != "" && !en.Ended {
					found++
				}
			}
			if found != int(created) {
				t.Errorf("the journal records %d batches after the resume, want the %d found", found, created)
			}
		})
	}
}

// TestLegacyJournal: a journal the embedded runtime kept in its blobs
// before the store kept it (economy/TASK.json) is read for a task the
// store has no entries for, and moved into the store.
func TestLegacyJournal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sim.New(sim.Config{}), economyConfig())
	old := `[{"job":"batch_1","lines":["a-0","b-0"],"submitted":"2026-12-01T10:00:00Z"}]`
	if err := e.blobs.Put(context.Background(), "economy/t1.json", strings.NewReader(old)); err != nil {
		t.Fatal(err)
	}
	j := pipeline.LegacyJournal{Journal: e.store, Blobs: e.blobs}
	got, err := j.ListProviderBatches(context.Background(), "t1")
	if err != nil || len(got) != 1 || got[0].Job != "batch_1" || len(got[0].Lines) != 2 {
		t.Fatalf("legacy journal: %+v %v, want its batch", got, err)
	}
	moved, err := e.store.ListProviderBatches(context.Background(), "t1")
	if err != nil || len(moved) != 1 || moved[0].Job != "batch_1" {
		t.Errorf("the store after reading the legacy journal: %+v %v, want the batch moved in", moved, err)
	}
	if got, err := j.ListProviderBatches(context.Background(), "t2"); err != nil || len(got) != 0 {
		t.Errorf("a task with no journal: %+v %v", got, err)
	}
}

// TestEconomyParksInsteadOfWaiting: a runtime that cannot wait hours (a
// Lambda) parks: each delivery of an economy batch sends its rows' lines
// (or asks the provider once how their batch does) and hands the batch
// back, to come again after a poll as a fresh message, without using up
// an attempt of any row. Deliveries alternate between two generators (two
// Lambda instances, the second without the first's lanes), and the
// answers still arrive: every row answered in a batch, each paid once.
func TestEconomyParksInsteadOfWaiting(t *testing.T) {
	t.Parallel()
	srv, provider, paid := mockBatchServer(t, mockserver.Config{BatchDelay: 1500 * time.Millisecond, Latency: time.Millisecond})
	cfg := economyConfig()
	cfg.Economy.Park, cfg.Economy.Poll = true, 300*time.Millisecond
	e, _ := newEconomyEnv(t, provider, cfg)
	const rows = 60
	p := e.splitEconomy("economy-park", rows, 30, store.Terms{Mode: store.ModeEconomy})
	gens := []*pipeline.Generator{e.gen, pipeline.NewGenerator(e.store, provider, e.signal, e.cfg)}
	parks := 0
	for no := 1; no <= 2; no++ {
		for delivery := 0; ; delivery++ {
			if delivery > 50 {
				t.Fatalf("batch %d not done after 50 deliveries", no)
			}
			g := gens[delivery%2]
			out := g.Process(context.Background(), pipeline.Delivery{Body: pipeline.EncodeBatchMessage(p.TaskID, no)})
			if out.Ack {
				break
			}
			st := g.Settle(out)
			if !out.Parked || st.Action != pipeline.SettleResend || st.Delay != 300*time.Millisecond {
				t.Fatalf("batch %d, delivery %d: outcome %+v settled %+v; want parked and resent after the poll", no, delivery, out, st)
			}
			parks++
			batchRows, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: p.TaskID, FromNo: (no-1)*30 + 1, ToNo: no * 30})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range batchRows {
				if r.State != store.RowPending || r.Attempts != 0 {
					t.Fatalf("row %d parked as %s after %d attempts; want pending with none used", r.No, r.State, r.Attempts)
				}
			}
			b, err := e.store.GetBatch(context.Background(), p.TaskID, no)
			if err != nil || b.State != store.BatchPending || b.LastError != pipeline.ParkedReason {
				t.Fatalf("batch %d parked: %+v %v; want pending, waiting on provider batches", no, b, err)
			}
			time.Sleep(st.Delay)
		}
	}
	if parks < 2 {
		t.Errorf("%d parks: the provider batches answered before any delivery parked; the test proves nothing", parks)
	}
	select {
	case <-e.signal.C():
	case <-time.After(10 * time.Second):
		t.Fatal("the last batch did not start the export")
	}
	task, err := e.exporter.Export(context.Background(), p.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if labels := checkAnswers(t, e, task); labels[batchLabel] != rows {
		t.Errorf("rows by provider %v: want all %d through the batch API", labels, rows)
	}
	checkPaidOnceInBatches(t, srv, paid, rows)
	if st := srv.Stats(); st.BatchesCreated != 2 {
		t.Errorf("%d provider batches for 2 task batches: a parked row was sent again", st.BatchesCreated)
	}
}

// TestJournalWaitingOn: what a task waits for, as its journal tells a
// process with no lanes: the batches sent and not ended, by id.
func TestJournalWaitingOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sim.New(sim.Config{}), economyConfig())
	ctx := context.Background()
	t0 := time.Date(2026, 12, 2, 14, 5, 0, 0, time.UTC)
	for _, en := range []store.ProviderBatch{
		{Key: "k1", Intent: true, Lines: []string{"a-0"}, Submitted: t0},
		{Key: "k1", Job: "batch_one", Lines: []string{"a-0"}, Submitted: t0},
		{Key: "k2", Job: "batch_two", Lines: []string{"b-0"}, Submitted: t0.Add(time.Minute)},
		{Key: "k2", Job: "batch_two", Ended: true, Submitted: t0.Add(time.Minute)},
		{Key: "k3", Intent: true, Lines: []string{"c-0"}, Submitted: t0.Add(2 * time.Minute)}, // not sent (yet)
		{Key: "k4", Job: "batch_four", Lines: []string{"d-0"}, Submitted: t0.Add(3 * time.Minute)},
	} {
		if err := e.store.RecordProviderBatch(ctx, "t1", en); err != nil {
			t.Fatal(err)
		}
	}
	waiting := pipeline.JournalWaitingOn(e.store)
	if got, want := waiting("t1"), "waiting on 2 provider batches (batch_one, batch_four), sent from 2026-12-02 14:05 UTC"; got != want {
		t.Errorf("waiting on %q, want %q", got, want)
	}
	if got := waiting("no-such-task"); got != "" {
		t.Errorf("a task without a journal waits on %q, want nothing", got)
	}
}

// TestEconomyJournalsWhatEnded: once a task's provider batches have ended,
// its journal says so: a process with no lanes sees nothing waited on.
func TestEconomyJournalsWhatEnded(t *testing.T) {
	t.Parallel()
	_, provider, _ := mockBatchServer(t, mockserver.Config{BatchDelay: 200 * time.Millisecond, Latency: time.Millisecond})
	e, journal := newEconomyEnv(t, provider, economyConfig())
	p := e.splitEconomy("economy-ended", 40, 20, store.Terms{Mode: store.ModeEconomy})
	e.runAllInBatches(p.TaskID, 40)
	if got := pipeline.JournalWaitingOn(journal)(p.TaskID); got != "" {
		t.Errorf("after the task, its journal says %q; want nothing waited on", got)
	}
	entries, err := journal.ListProviderBatches(context.Background(), p.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	ended := 0
	for _, en := range entries {
		if en.Ended {
			ended++
		}
	}
	if ended == 0 {
		t.Error("no provider batch journaled as ended")
	}
}
