package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

type recordingStarter struct {
	mu  sync.Mutex
	ids []string
}

func (r *recordingStarter) StartExport(_ context.Context, id string, _ int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, id)
	return nil
}

func TestSweeper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e.splitter = pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: clk})
	id := e.splitProducts("sweep", "{{id}}", 30, 10).TaskID
	// Lose every message, as if the queue had dropped them.
	for {
		ds, err := e.queue.Receive(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			break
		}
		for _, d := range ds {
			if err := e.queue.Delete(ctx, d.Receipt); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A worker claims batch 2 and dies without renewing.
	if _, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: 2, Owner: "dead", Now: clk.Now(), LeaseUntil: clk.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	starter := &recordingStarter{}
	sw := pipeline.NewSweeper(e.store, e.queue, starter, pipeline.SweeperConfig{Clock: clk})

	report, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pipeline.SweepReport{}, report); diff != "" {
		t.Errorf("sweep before the threshold acted (-want +got):\n%s", diff)
	}

	clk.Advance(6 * time.Minute)
	report, err = sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pipeline.SweepReport{Requeued: 2, LeasesReset: 1}, report); diff != "" {
		t.Errorf("sweep report (-want +got):\n%s", diff)
	}
	got := map[int]int{}
	for {
		ds, err := e.queue.Receive(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			break
		}
		for _, d := range ds {
			m, err := pipeline.DecodeBatchMessage(d.Body)
			if err != nil {
				t.Fatal(err)
			}
			got[m.BatchNo]++
			_ = e.queue.Delete(ctx, d.Receipt)
		}
	}
	if diff := cmp.Diff(map[int]int{1: 1, 2: 1, 3: 1}, got); diff != "" {
		t.Errorf("re-enqueued batches (-want +got):\n%s", diff)
	}

	// Right after, nothing is due again: the sweeper touched what it re-enqueued.
	report, err = sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pipeline.SweepReport{}, report); diff != "" {
		t.Errorf("second sweep acted again (-want +got):\n%s", diff)
	}

	// All batches finish but the export start is lost: the sweeper starts it.
	for no := 1; no <= 3; no++ {
		b, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: no, Owner: "w", Now: clk.Now(), LeaseUntil: clk.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.FinishBatch(ctx, store.FinishBatchParams{TaskID: id, BatchNo: no, Attempt: b.Attempt, Succeeded: 10, Now: clk.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(6 * time.Minute)
	report, err = sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if report.ExportsStarted != 1 || len(starter.ids) != 1 || starter.ids[0] != id {
		t.Errorf("exports started = %d %v, want task %s once", report.ExportsStarted, starter.ids, id)
	}
}

// TestSweeperFailsCrashLoopingBatch: a batch whose workers keep dying
// (claimed MaxClaims times, never finished) gets its remaining rows failed
// as stuck, so the task finishes and is exported instead of hanging.
func TestSweeperFailsCrashLoopingBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e.splitter = pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: clk})
	id := e.splitProducts("stuck", "{{id}}", 4, 4).TaskID
	// One row was answered before the crashes started.
	b, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: 1, Owner: "w", Now: clk.Now(), LeaseUntil: clk.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: id, BatchNo: 1, Attempt: b.Attempt,
		Rows: []store.RowResultWrite{{RowNo: 2, Result: store.RowResult{State: store.RowSucceeded, Output: "kept", Attempts: 1,
			Provider: "sim/sim-1", Usage: store.Usage{InputTokens: 7, OutputTokens: 3}}}}, Now: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ { // two more claims, each dying with its lease
		clk.Advance(2 * time.Minute)
		if _, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: 1, Owner: "w", Now: clk.Now(), LeaseUntil: clk.Now().Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(10 * time.Minute)
	starter := &recordingStarter{}
	sw := pipeline.NewSweeper(e.store, e.queue, starter, pipeline.SweeperConfig{Clock: clk, MaxClaims: 3})
	report, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if report.BatchesFailed != 1 || report.LeasesReset != 0 {
		t.Fatalf("report = %+v, want the batch failed as stuck", report)
	}
	rows, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: id, FromNo: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		switch {
		case r.No == 2 && (r.State != store.RowSucceeded || r.Output != "kept"):
			t.Errorf("row 2 = %s %q: the answered row must keep its result", r.State, r.Output)
		case r.No != 2 && (r.State != store.RowFailed || r.ErrorClass != pipeline.ClassStuck):
			t.Errorf("row %d = %s %s, want FAILED stuck", r.No, r.State, r.ErrorClass)
		}
	}
	task, err := e.store.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if task.BatchesDone != 1 || task.RowsFailed != 3 || task.RowsSucceeded != 1 || len(starter.ids) != 1 {
		t.Errorf("task %+v, exports %v: want the batch counted once and the export started", task, starter.ids)
	}
	// The answered row's tokens count into the task, as a worker's finish
	// counts them: its cost must not vanish because the batch got stuck.
	if want := (store.Usage{InputTokens: 7, OutputTokens: 3}); task.Usage != want || task.UsageByProvider["sim/sim-1"] != want {
		t.Errorf("task usage %+v by provider %+v, want %+v from the answered row", task.Usage, task.UsageByProvider, want)
	}
}

// sizeRecordingStore records the Size of every SaveRowResults call.
type sizeRecordingStore struct {
	store.Store
	mu    sync.Mutex
	sizes []int
}

func (s *sizeRecordingStore) SaveRowResults(ctx context.Context, p store.SaveRowResultsParams) (store.SaveRowResultsResult, error) {
	s.mu.Lock()
	s.sizes = append(s.sizes, p.Size())
	s.mu.Unlock()
	return s.Store.SaveRowResults(ctx, p)
}

// TestSweeperStuckBatchWritesWithinTransactionBytes: failing a stuck batch
// splits its row writes by store.MaxSaveBytes as a worker's flush does (the
// sweeper's copy split by row count alone): each stuck row's error quotes
// the batch's last error, and 40 rows of a 100 KB error made one 4 MB
// group, over DynamoDB's transaction limit.
func TestSweeperStuckBatchWritesWithinTransactionBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e.splitter = pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: clk})
	id := e.splitProducts("stuck-big", "{{id}}", 40, 40).TaskID
	lastErr := strings.Repeat("upstream said no. ", 100<<10/18)
	for i := 0; i < 3; i++ {
		b, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: 1, Owner: "w", Now: clk.Now(), LeaseUntil: clk.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.store.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: id, BatchNo: 1, Attempt: b.Attempt, LastError: lastErr, Now: clk.Now()}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Minute)
	}
	clk.Advance(10 * time.Minute)
	rec := &sizeRecordingStore{Store: e.store}
	sw := pipeline.NewSweeper(rec, e.queue, &recordingStarter{}, pipeline.SweeperConfig{Clock: clk, MaxClaims: 3})
	if report, err := sw.Sweep(ctx); err != nil || report.BatchesFailed != 1 {
		t.Fatalf("sweep = %+v, %v; want the batch failed as stuck", report, err)
	}
	if len(rec.sizes) < 2 {
		t.Errorf("%d SaveRowResults calls for 40 rows of %d KB errors: want them split", len(rec.sizes), len(lastErr)>>10)
	}
	for i, n := range rec.sizes {
		if n > store.MaxSaveBytes {
			t.Errorf("write %d carries %d bytes, over store.MaxSaveBytes %d", i, n, store.MaxSaveBytes)
		}
	}
	task, err := e.store.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if task.RowsFailed != 40 || task.BatchesDone != 1 {
		t.Errorf("task %d failed rows, %d batches done; want 40 and 1", task.RowsFailed, task.BatchesDone)
	}
}

// TestSweeperExportsCancelledTask: a task cancelled on AWS whose export start
// was lost gets its partial result exported by the sweeper.
func TestSweeperExportsCancelledTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e.splitter = pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: clk})
	id := e.splitProducts("cancelled", "{{id}}", 4, 2).TaskID
	if _, err := e.store.TransitionTask(ctx, store.TransitionTaskParams{ID: id, From: []store.TaskState{store.TaskRunning}, To: store.TaskCancelled, Now: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	starter := &recordingStarter{}
	sw := pipeline.NewSweeper(e.store, e.queue, starter, pipeline.SweeperConfig{Clock: clk, TaskID: id})
	clk.Advance(6 * time.Minute)
	report, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if report.ExportsStarted != 1 || len(starter.ids) != 1 {
		t.Errorf("report %+v, exports %v: want the cancelled task's partial export started", report, starter.ids)
	}
	if report.Requeued != 0 {
		t.Errorf("the sweeper re-enqueued %d batches of a cancelled task", report.Requeued)
	}
}

// drainQueue deletes every visible message and returns how often each
// task/batch was enqueued.
func drainQueue(t *testing.T, e *env) map[string]int {
	t.Helper()
	ctx := context.Background()
	got := map[string]int{}
	for {
		ds, err := e.queue.Receive(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			return got
		}
		for _, d := range ds {
			m, err := pipeline.DecodeBatchMessage(d.Body)
			if err != nil {
				t.Fatal(err)
			}
			got[fmt.Sprintf("%s/%d", m.TaskID, m.BatchNo)]++
			if err := e.queue.Delete(ctx, d.Receipt); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestSweeperNotStarvedByCancelledTask: a cancelled task leaves many pages
// of open batches at the oldest end of the index (thousands at the default
// page of 500; pages of 50 here keep the test fast). One sweep still finds
// the live task's lost batch behind them, and parks the stranded batches so
// the next sweeps do not even list them.
func TestSweeperNotStarvedByCancelledTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e.splitter = pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: clk})
	const stranded, page = 330, 50
	dead := e.splitProducts("cancelled", "{{id}}", stranded, 1).TaskID
	if _, err := e.store.TransitionTask(ctx, store.TransitionTaskParams{ID: dead, From: []store.TaskState{store.TaskRunning}, To: store.TaskCancelled, Now: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	live := e.splitProducts("live", "{{id}}", 2, 2).TaskID
	drainQueue(t, e) // every message is lost

	clk.Advance(6 * time.Minute)
	sw := pipeline.NewSweeper(e.store, e.queue, &pipeline.ExportSignal{}, pipeline.SweeperConfig{Clock: clk, Limit: page})
	report, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The cancelled task's partial export is started too.
	if diff := cmp.Diff(pipeline.SweepReport{Requeued: 1, Parked: stranded, ExportsStarted: 1}, report); diff != "" {
		t.Errorf("first sweep (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{live + "/1": 1}, drainQueue(t, e)); diff != "" {
		t.Errorf("re-enqueued (-want +got):\n%s", diff)
	}
	open, err := e.store.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: clk.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(open) != 1 || open[0].TaskID != live {
		t.Errorf("open index after the sweep holds %d batches, want only the live one", len(open))
	}
	// The cancelled task's batches keep their state: only the index forgot them.
	b, err := e.store.GetBatch(ctx, dead, stranded)
	if err != nil || b.State != store.BatchPending {
		t.Errorf("stranded batch = %+v, %v; want it still PENDING", b, err)
	}
}

// tickingClock advances by step on every reading, so a sweep's time budget
// runs out after a known number of pages.
type tickingClock struct {
	*clock.Fake
	step time.Duration
}

func (c tickingClock) Now() time.Time {
	now := c.Fake.Now()
	c.Fake.Advance(c.step)
	return now
}

// TestSweeperResumesWhereItRanOutOfTime: open batches the sweeper cannot act
// on (long leases, renewed long ago) fill more than one page. A sweep that
// runs out of time after one page keeps its place, and the next sweep
// reaches the lost batch behind them instead of rereading the same page.
func TestSweeperResumesWhereItRanOutOfTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e.splitter = pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: fake})
	// More than two pages of them; pages of 50, not the default 500, keep
	// the test fast.
	const leased, page = 120, 50
	busy := e.splitProducts("busy", "{{id}}", leased, 1).TaskID
	for no := 1; no <= leased; no++ {
		if _, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: busy, BatchNo: no, Owner: "slow", Now: fake.Now(), LeaseUntil: fake.Now().Add(24 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	fake.Advance(time.Minute)
	live := e.splitProducts("live", "{{id}}", 1, 1).TaskID
	drainQueue(t, e)
	fake.Advance(6 * time.Minute)

	clk := tickingClock{Fake: fake, step: time.Second}
	sw := pipeline.NewSweeper(e.store, e.queue, &pipeline.ExportSignal{}, pipeline.SweeperConfig{Clock: clk, Limit: page, MaxDuration: time.Second})
	var reports []pipeline.SweepReport
	for range 3 {
		report, err := sw.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, report)
	}
	want := []pipeline.SweepReport{{Incomplete: true}, {Incomplete: true}, {Requeued: 1}}
	if diff := cmp.Diff(want, reports); diff != "" {
		t.Errorf("sweeps of one page each (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{live + "/1": 1}, drainQueue(t, e)); diff != "" {
		t.Errorf("re-enqueued (-want +got):\n%s", diff)
	}
}

// TestSweeperLetsParkedBatchesWait: a batch handed back to wait for its
// provider batches (claimed once per poll for hours) is neither
// re-enqueued while its delayed message is on its way nor failed as stuck
// for its many claims; once it has waited PendingAfter past its poll (its
// message lost), it is re-enqueued, still not failed.
func TestSweeperLetsParkedBatchesWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e.splitter = pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: clk})
	id := e.splitProducts("parked", "{{id}}", 4, 4).TaskID
	for range 20 { // twenty polls, each a claim and a park
		b, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: 1, Owner: "w", Now: clk.Now(), LeaseUntil: clk.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.store.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: id, BatchNo: 1, Attempt: b.Attempt, LastError: pipeline.ParkedReason, Now: clk.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	sw := pipeline.NewSweeper(e.store, e.queue, &recordingStarter{}, pipeline.SweeperConfig{Clock: clk, MaxClaims: 3, PendingAfter: 5 * time.Minute, ParkedPoll: 10 * time.Minute})
	for _, tc := range []struct {
		after    time.Duration
		requeued int
	}{
		{14 * time.Minute, 0}, // its message is due at 10 minutes, the sweeper waits 5 more
		{2 * time.Minute, 1},  // 16 minutes: lost, sent again
	} {
		clk.Advance(tc.after)
		report, err := sw.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if report.BatchesFailed != 0 || report.Requeued != tc.requeued {
			t.Errorf("at %v: report %+v, want %d re-enqueued and none failed as stuck", tc.after, report, tc.requeued)
		}
	}
}
