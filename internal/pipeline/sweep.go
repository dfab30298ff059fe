package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
)

// SweeperConfig tunes the sweeper. Zero fields take the defaults.
type SweeperConfig struct {
	// PendingAfter is how long a batch may sit unchanged (PENDING and never
	// claimed, or RUNNING without a lease renewal) before the sweeper acts.
	// Defaults to 5 minutes.
	PendingAfter time.Duration
	// Limit is the page size: how many open batches one listing returns.
	// A sweep pages on until it has seen every open batch or its time is
	// up. Defaults to 500.
	Limit int
	// MaxDuration bounds one sweep's paging; a sweep that runs out of time
	// resumes where it stopped on its next run, so every open batch is
	// reached over a few runs however many there are. Defaults to 30 s
	// (the sweeper function has 60 s).
	MaxDuration time.Duration
	// DeadlineMargin is the time a sweep leaves before its context's
	// deadline (a Lambda invocation's end) to send what it re-enqueues and
	// start missing exports. Defaults to 10 s.
	DeadlineMargin time.Duration
	// TaskID, when set, restricts the sweep to one task: `batchgen run`
	// sweeps only its own task, whose queue it owns.
	TaskID string
	// RecentTasks is how many of the newest tasks are checked for a missing
	// export start. Defaults to 200.
	RecentTasks int
	// MaxClaims is how many claims a batch may take. A batch claimed this
	// often without finishing keeps killing its workers (a crash loop, a row
	// that times out the function every time): the sweeper fails its
	// remaining rows with class "stuck" so the task still finishes.
	// Defaults to 12 (three times the default retry rounds).
	MaxClaims int
	// ParkedPoll is how long a batch handed back to wait for its provider
	// batches (ParkedReason; the generators' EconomyConfig.Poll, parking)
	// stays out of the queue: such a batch waited too long only
	// PendingAfter past it, and its claims, one per poll for as long as the
	// provider takes, are not a crash loop's. Defaults to 0 (no runtime
	// parks).
	ParkedPoll time.Duration
	// Clock decides what waited too long. Defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Metrics receives the use case's metrics. Defaults to recording
	// nothing.
	Metrics metrics.Recorder
}

func (c SweeperConfig) withDefaults() SweeperConfig {
	c.PendingAfter = cmp.Or(c.PendingAfter, 5*time.Minute)
	c.Limit = cmp.Or(c.Limit, 500)
	c.MaxDuration = cmp.Or(c.MaxDuration, 30*time.Second)
	c.DeadlineMargin = cmp.Or(c.DeadlineMargin, 10*time.Second)
	c.RecentTasks = cmp.Or(c.RecentTasks, 200)
	c.MaxClaims = cmp.Or(c.MaxClaims, 12)
	c.Clock = orClock(c.Clock)
	c.Logger = orLogger(c.Logger)
	c.Metrics = metrics.Or(c.Metrics)
	return c
}

func (c SweeperConfig) validate() error {
	if c.PendingAfter <= 0 || c.Limit < 1 || c.MaxDuration <= 0 || c.DeadlineMargin <= 0 || c.RecentTasks < 1 || c.MaxClaims < 1 {
		return fmt.Errorf("config: PendingAfter %v, Limit %d, MaxDuration %v, DeadlineMargin %v, RecentTasks %d, MaxClaims %d: each must be positive",
			c.PendingAfter, c.Limit, c.MaxDuration, c.DeadlineMargin, c.RecentTasks, c.MaxClaims)
	}
	return nil
}

// SweepReport counts what one sweep did.
type SweepReport struct {
	// Requeued counts PENDING batches that waited too long and got a fresh
	// message.
	Requeued int `json:"requeued"`
	// LeasesReset counts RUNNING batches whose lease had expired, set back
	// to PENDING and re-enqueued.
	LeasesReset int `json:"leases_reset"`
	// ExportsStarted counts tasks whose batches were all done but whose
	// export had not been started.
	ExportsStarted int `json:"exports_started"`
	// BatchesFailed counts batches claimed MaxClaims times without
	// finishing, whose remaining rows were failed as stuck.
	BatchesFailed int `json:"batches_failed"`
	// Parked counts open batches of finished, cancelled or missing tasks
	// taken out of the open-batches index: no work is left for them, and
	// left there they would crowd live batches out of every sweep.
	Parked int `json:"parked,omitempty"`
	// Incomplete is true when the sweep ran out of time before it listed
	// every open batch; the next sweep resumes where this one stopped.
	Incomplete bool `json:"incomplete,omitempty"`
}

// ClassStuck marks rows of a batch that was claimed too often without
// finishing; `batchgen retry --error-class stuck` reruns them.
const ClassStuck = "stuck"

// Sweeper compensates for lost messages and dead workers: it re-enqueues
// batches that waited too long, resets expired leases and starts exports
// that never started. Every action is idempotent, so sweeping twice, or
// alongside live workers, is safe.
//
// A sweep pages through the whole open-batches index, oldest change first,
// for at most MaxDuration; when time runs out it keeps its place, and the
// next sweep of the same Sweeper (the next tick, or the next invocation of a
// warm Lambda) carries on from there. Batches of finished and cancelled
// tasks are parked (taken out of the index) on sight, so they cost one
// write once and never again.
type Sweeper struct {
	store   store.Store
	queue   queue.Queue
	exports ExportStarter
	cfg     SweeperConfig

	mu sync.Mutex
	// resume is where the last sweep stopped for lack of time; zero to
	// start from the oldest open batch.
	resume store.OpenCursor
}

// NewSweeper returns a Sweeper over st that re-enqueues on q and starts
// exports through exports. It applies cfg's defaults and panics if a port
// is nil or cfg is invalid: a mistake in the wiring, caught at start-up.
func NewSweeper(st store.Store, q queue.Queue, exports ExportStarter, cfg SweeperConfig) *Sweeper {
	cfg = cfg.withDefaults()
	if err := errors.Join(required("Store", st), required("Queue", q), required("ExportStarter", exports), cfg.validate()); err != nil {
		panic("pipeline.NewSweeper: " + err.Error())
	}
	return &Sweeper{store: st, queue: q, exports: exports, cfg: cfg}
}

// Sweep runs one pass. It carries on past per-item failures and returns them
// joined, with the report of what did succeed.
func (s *Sweeper) Sweep(ctx context.Context) (SweepReport, error) {
	cfg, clk, log := s.cfg, s.cfg.Clock, s.cfg.Logger
	var report SweepReport
	var errs []error
	now := clk.Now()
	s.mu.Lock()
	after := s.resume
	s.mu.Unlock()
	outOfTime := func() bool {
		if clk.Now().Sub(now) >= cfg.MaxDuration {
			return true
		}
		dl, ok := ctx.Deadline()
		return ok && time.Until(dl) < cfg.DeadlineMargin
	}
	tasks := map[string]sweptTask{} // per task: whether any batch of it needs work, and its owner
	seen := 0
	for {
		batches, err := s.store.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: now.Add(-cfg.PendingAfter), After: after, Limit: cfg.Limit})
		if err != nil {
			// Keep the place: the next sweep retries this page.
			s.keepPlace(after)
			return report, errors.Join(append(errs, fmt.Errorf("sweep: list open batches: %w", err))...)
		}
		seen += len(batches)
		errs = s.sweepPage(ctx, cfg, batches, tasks, now, log, &report, errs)
		if len(batches) < cfg.Limit {
			after = store.OpenCursor{}
			break
		}
		after = batches[len(batches)-1].Cursor()
		if outOfTime() {
			report.Incomplete = true
			log.WarnContext(ctx, "sweeper ran out of time before it saw every open batch; the next sweep carries on", "seen", seen, "resume_after", after.UpdatedAt)
			break
		}
	}
	s.keepPlace(after)

	report.ExportsStarted, errs = s.startMissingExports(ctx, cfg, now, log, errs)
	m := cfg.Metrics
	m.Add(metrics.SweeperRequeued, float64(report.Requeued))
	m.Add(metrics.SweeperLeasesReset, float64(report.LeasesReset))
	m.Add(metrics.LeasesExpired, float64(report.LeasesReset))
	m.Add(metrics.SweeperExportsStarted, float64(report.ExportsStarted))
	return report, errors.Join(errs...)
}

// keepPlace records where the next sweep starts.
func (s *Sweeper) keepPlace(c store.OpenCursor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resume = c
}

// sweptTask is what a sweep learnt of a task with open batches.
type sweptTask struct {
	// done: no batch of it needs work (finished, cancelled or gone).
	done bool
	// owner is its principal, the group of its messages.
	owner string
	// held: it waits for its owner to start it (store.TaskHeld). Its
	// batches wait unsent; one a sample's worker died holding is handed
	// back, unsent too.
	held bool
}

// sweepPage acts on one page of open batches: parks those of tasks with no
// work left, fails stuck ones, re-enqueues stale ones and resets expired
// leases.
func (s *Sweeper) sweepPage(ctx context.Context, cfg SweeperConfig, batches []store.Batch, tasks map[string]sweptTask, now time.Time, log *slog.Logger, report *SweepReport, errs []error) []error {
	var msgs []queue.Outgoing
	parked := map[string]int{}
	for _, b := range batches {
		if cfg.TaskID != "" && b.TaskID != cfg.TaskID {
			continue
		}
		task, seen := tasks[b.TaskID]
		if !seen {
			t, err := s.store.GetTask(ctx, b.TaskID)
			switch {
			case errors.Is(err, store.ErrNotFound):
				task.done = true // expired or deleted: nothing will ever run it
			case err != nil:
				errs = append(errs, fmt.Errorf("task of batch %s/%d: %w", b.TaskID, b.No, err))
				continue
			default:
				// A cancelled or failed task's open batches stay as they
				// are: its remaining rows are not to run.
				task = sweptTask{done: t.State.Final(), owner: t.Owner, held: t.Held()}
			}
			tasks[b.TaskID] = task
		}
		if task.done {
			err := s.store.ParkBatch(ctx, store.ParkBatchParams{TaskID: b.TaskID, BatchNo: b.No, UpdatedAt: b.UpdatedAt})
			switch {
			case err == nil:
				report.Parked++
				parked[b.TaskID]++
			case isConflict(err) || errors.Is(err, store.ErrNotFound):
				// changed meanwhile (reopened, finished): not ours to park
			default:
				errs = append(errs, fmt.Errorf("park batch %s/%d: %w", b.TaskID, b.No, err))
			}
			continue
		}
		if task.held && b.State == store.BatchPending {
			continue // sent when its task starts
		}
		parked := b.State == store.BatchPending && b.LastError == ParkedReason
		if parked && b.UpdatedAt.After(now.Add(-cfg.PendingAfter-cfg.ParkedPoll)) {
			continue // its message is on its way, delayed a poll
		}
		stale := b.State == store.BatchPending || (b.State == store.BatchRunning && b.LeaseUntil.Before(now))
		if stale && b.Attempt >= cfg.MaxClaims && !parked {
			if err := s.failStuck(ctx, b, now, log); err != nil {
				errs = append(errs, err)
			} else {
				report.BatchesFailed++
			}
			continue
		}
		switch {
		case b.State == store.BatchPending:
			err := s.store.TouchBatch(ctx, store.TouchBatchParams{TaskID: b.TaskID, BatchNo: b.No, Attempt: b.Attempt, Now: now})
			if isConflict(err) {
				continue // claimed meanwhile
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("touch batch %s/%d: %w", b.TaskID, b.No, err))
				continue
			}
			report.Requeued++
			log.InfoContext(ctx, "sweeper re-enqueued a batch that waited too long", logging.TaskID, b.TaskID, logging.BatchNo, b.No, "waiting_since", b.UpdatedAt)
		case b.State == store.BatchRunning && b.LeaseUntil.Before(now):
			err := s.store.ReleaseBatch(ctx, store.ReleaseBatchParams{
				TaskID: b.TaskID, BatchNo: b.No, Attempt: b.Attempt, LastError: "lease expired: worker " + b.Owner + " stopped renewing", Now: now,
			})
			if isConflict(err) {
				continue // renewed or finished meanwhile
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("reset batch %s/%d: %w", b.TaskID, b.No, err))
				continue
			}
			report.LeasesReset++
			log.WarnContext(ctx, "sweeper reset an expired lease", logging.TaskID, b.TaskID, logging.BatchNo, b.No, "owner", b.Owner, "lease_until", b.LeaseUntil)
			if task.held {
				continue // sent when its task starts
			}
		default:
			continue
		}
		msgs = append(msgs, BatchMessage{TaskID: b.TaskID, BatchNo: b.No, Owner: task.owner}.Outgoing(0))
	}
	for id, n := range parked {
		log.InfoContext(ctx, "sweeper parked the open batches of a task with no work left", logging.TaskID, id, "batches", n)
	}
	if len(msgs) > 0 {
		if err := s.queue.Send(ctx, msgs); err != nil {
			errs = append(errs, fmt.Errorf("re-enqueue %d batches: %w", len(msgs), err))
		}
	}
	return errs
}

// startMissingExports starts the export of recent tasks whose batches are all
// done but that are still not exported after PendingAfter.
func (s *Sweeper) startMissingExports(ctx context.Context, cfg SweeperConfig, now time.Time, log *slog.Logger, errs []error) (int, []error) {
	started := 0
	tasks, err := s.store.ListTasks(ctx, cfg.RecentTasks)
	if err != nil {
		errs = append(errs, fmt.Errorf("list recent tasks: %w", err))
	}
	for _, t := range tasks {
		if cfg.TaskID != "" && t.ID != cfg.TaskID {
			continue
		}
		// A cancelled task still needs its partial result written.
		if !t.NeedsExport() || !t.UpdatedAt.Before(now.Add(-cfg.PendingAfter)) {
			continue
		}
		var err error
		if !store.EventExport.Allows(t.State) {
			// Exporting or cancelled: its start was lost (or its export
			// died). Start it again; the starter is idempotent per
			// generation.
			err = s.exports.StartExport(ctx, t.ID, t.ExportGen)
		} else {
			var ok bool
			if ok, err = StartExportOnce(ctx, s.store, s.exports, t, now); err == nil && !ok {
				continue // someone else just started it
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("start export of %s: %w", t.ID, err))
			continue
		}
		started++
		log.WarnContext(ctx, "sweeper started an export that never started", logging.TaskID, t.ID, "state", t.State)
	}
	return started, errs
}

// failStuck claims a batch that keeps failing to finish and fails its
// remaining rows as stuck, so its task can finish and be exported.
func (s *Sweeper) failStuck(ctx context.Context, b store.Batch, now time.Time, log *slog.Logger) error {
	claimed, err := s.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: b.TaskID, BatchNo: b.No, Owner: "sweeper", Now: now, LeaseUntil: now.Add(5 * time.Minute)})
	if isConflict(err) {
		return nil // a worker has it right now
	}
	if err != nil {
		return fmt.Errorf("claim stuck batch %s/%d: %w", b.TaskID, b.No, err)
	}
	rows, err := s.store.ListRows(ctx, store.ListRowsParams{TaskID: b.TaskID, FromNo: b.FirstRow, ToNo: b.FirstRow + b.RowCount - 1})
	if err != nil {
		return fmt.Errorf("rows of stuck batch %s/%d: %w", b.TaskID, b.No, err)
	}
	var (
		tally  batchTally
		writes []store.RowResultWrite
	)
	for _, r := range rows {
		res := r.RowResult
		if !r.State.Final() {
			res.State, res.ErrorClass = store.RowFailed, ClassStuck
			res.Error = fmt.Sprintf("the batch was claimed %d times without finishing (its worker keeps dying); last error: %s", b.Attempt, b.LastError)
			writes = append(writes, store.RowResultWrite{RowNo: r.No, Result: res})
		}
		tally.add(res)
	}
	for len(writes) > 0 {
		n := saveGroupLen(len(writes), func(i int) int { return writes[i].SaveSize() })
		if _, err := s.store.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: b.TaskID, BatchNo: b.No, Attempt: claimed.Attempt, Rows: writes[:n], Now: now}); err != nil {
			return fmt.Errorf("fail rows %d.. of stuck batch %s/%d: %w", writes[0].RowNo, b.TaskID, b.No, err)
		}
		writes = writes[n:]
	}
	once := func(write func() error) error { return write() }
	_, err = finishBatch(ctx, s.store, s.exports, claimed, tally, now, once)
	if err != nil {
		return fmt.Errorf("stuck batch: %w", err)
	}
	log.ErrorContext(ctx, "sweeper failed the remaining rows of a stuck batch", logging.TaskID, b.TaskID, logging.BatchNo, b.No, "claims", b.Attempt, "last_error", b.LastError)
	return nil
}
