package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
)

// SweeperConfig tunes the sweeper. Zero fields take the defaults.
type SweeperConfig struct {
	// PendingAfter is how long a batch may sit unchanged (PENDING and never
	// claimed, or RUNNING without a lease renewal) before the sweeper acts.
	// Defaults to 5 minutes.
	PendingAfter time.Duration
	// Limit caps the batches handled in one sweep. Defaults to 500.
	Limit int
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
}

func (c SweeperConfig) withDefaults() SweeperConfig {
	if c.PendingAfter <= 0 {
		c.PendingAfter = 5 * time.Minute
	}
	if c.Limit <= 0 {
		c.Limit = 500
	}
	if c.RecentTasks <= 0 {
		c.RecentTasks = 200
	}
	if c.MaxClaims <= 0 {
		c.MaxClaims = 12
	}
	return c
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
}

// ClassStuck marks rows of a batch that was claimed too often without
// finishing; `batchgen retry --error-class stuck` reruns them.
const ClassStuck = "stuck"

// Sweeper compensates for lost messages and dead workers: it re-enqueues
// batches that waited too long, resets expired leases and starts exports
// that never started. Every action is idempotent, so sweeping twice, or
// alongside live workers, is safe.
type Sweeper struct {
	Store   store.Store
	Queue   queue.Queue
	Exports ExportStarter
	Clock   clock.Clock
	Logger  *slog.Logger
	Config  SweeperConfig
}

// Sweep runs one pass. It carries on past per-item failures and returns them
// joined, with the report of what did succeed.
func (s *Sweeper) Sweep(ctx context.Context) (SweepReport, error) {
	cfg := s.Config.withDefaults()
	clk := s.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var report SweepReport
	var errs []error
	now := clk.Now()
	batches, err := s.Store.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: now.Add(-cfg.PendingAfter), Limit: cfg.Limit})
	if err != nil {
		return report, fmt.Errorf("sweep: list open batches: %w", err)
	}
	var msgs []queue.Outgoing
	finished := map[string]bool{} // per task: no batch of it needs work
	for _, b := range batches {
		if cfg.TaskID != "" && b.TaskID != cfg.TaskID {
			continue
		}
		done, seen := finished[b.TaskID]
		if !seen {
			t, err := s.Store.GetTask(ctx, b.TaskID)
			if err != nil {
				errs = append(errs, fmt.Errorf("task of batch %s/%d: %w", b.TaskID, b.No, err))
				continue
			}
			// A cancelled or failed task's open batches stay as they are:
			// its remaining rows are not to run.
			done = t.State.Final()
			finished[b.TaskID] = done
		}
		if done {
			continue
		}
		stale := b.State == store.BatchPending || (b.State == store.BatchRunning && b.LeaseUntil.Before(now))
		if stale && b.Attempt >= cfg.MaxClaims {
			if err := s.failStuck(ctx, b, now, log); err != nil {
				errs = append(errs, err)
			} else {
				report.BatchesFailed++
			}
			continue
		}
		switch {
		case b.State == store.BatchPending:
			err := s.Store.TouchBatch(ctx, store.TouchBatchParams{TaskID: b.TaskID, BatchNo: b.No, Attempt: b.Attempt, Now: now})
			if isConflict(err) {
				continue // claimed meanwhile
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("touch batch %s/%d: %w", b.TaskID, b.No, err))
				continue
			}
			report.Requeued++
			log.Info("sweeper re-enqueued a batch that waited too long", "task", b.TaskID, "batch", b.No, "waiting_since", b.UpdatedAt)
		case b.State == store.BatchRunning && b.LeaseUntil.Before(now):
			err := s.Store.ReleaseBatch(ctx, store.ReleaseBatchParams{
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
			log.Warn("sweeper reset an expired lease", "task", b.TaskID, "batch", b.No, "owner", b.Owner, "lease_until", b.LeaseUntil)
		default:
			continue
		}
		msgs = append(msgs, queue.Outgoing{Body: EncodeBatchMessage(b.TaskID, b.No)})
	}
	for start := 0; start < len(msgs); start += sendChunk {
		if err := s.Queue.Send(ctx, msgs[start:min(start+sendChunk, len(msgs))]); err != nil {
			errs = append(errs, fmt.Errorf("re-enqueue: %w", err))
		}
	}

	if s.Exports == nil {
		return report, errors.Join(errs...)
	}
	report.ExportsStarted, errs = s.startMissingExports(ctx, cfg, now, log, errs)
	return report, errors.Join(errs...)
}

// startMissingExports starts the export of recent tasks whose batches are all
// done but that are still not exported after PendingAfter.
func (s *Sweeper) startMissingExports(ctx context.Context, cfg SweeperConfig, now time.Time, log *slog.Logger, errs []error) (int, []error) {
	started := 0
	tasks, err := s.Store.ListTasks(ctx, cfg.RecentTasks)
	if err != nil {
		errs = append(errs, fmt.Errorf("list recent tasks: %w", err))
	}
	for _, t := range tasks {
		if cfg.TaskID != "" && t.ID != cfg.TaskID {
			continue
		}
		// A cancelled task still needs its partial result written.
		cancelled := t.State == store.TaskCancelled && t.ResultKey == ""
		ready := t.BatchesTotal > 0 && t.BatchesDone >= t.BatchesTotal && !t.State.Final()
		if !(cancelled || ready) || !t.UpdatedAt.Before(now.Add(-cfg.PendingAfter)) {
			continue
		}
		if err := s.Exports.StartExport(ctx, t.ID); err != nil {
			errs = append(errs, fmt.Errorf("start export of %s: %w", t.ID, err))
			continue
		}
		started++
		log.Warn("sweeper started an export that never started", "task", t.ID, "state", t.State)
	}
	return started, errs
}

// failStuck claims a batch that keeps failing to finish and fails its
// remaining rows as stuck, so its task can finish and be exported.
func (s *Sweeper) failStuck(ctx context.Context, b store.Batch, now time.Time, log *slog.Logger) error {
	claimed, err := s.Store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: b.TaskID, BatchNo: b.No, Owner: "sweeper", Now: now, LeaseUntil: now.Add(5 * time.Minute)})
	if isConflict(err) {
		return nil // a worker has it right now
	}
	if err != nil {
		return fmt.Errorf("claim stuck batch %s/%d: %w", b.TaskID, b.No, err)
	}
	rows, err := s.Store.ListRows(ctx, store.ListRowsParams{TaskID: b.TaskID, FromNo: b.FirstRow, ToNo: b.FirstRow + b.RowCount - 1})
	if err != nil {
		return fmt.Errorf("rows of stuck batch %s/%d: %w", b.TaskID, b.No, err)
	}
	var succeeded, failed, skipped int
	for _, r := range rows {
		switch r.State {
		case store.RowSucceeded:
			succeeded++
			continue
		case store.RowSkipped:
			skipped++
			continue
		case store.RowFailed:
			failed++
			continue
		}
		res := r.RowResult
		res.State, res.ErrorClass = store.RowFailed, ClassStuck
		res.Error = fmt.Sprintf("the batch was claimed %d times without finishing (its worker keeps dying); last error: %s", b.Attempt, b.LastError)
		if err := s.Store.SaveRowResult(ctx, store.SaveRowResultParams{TaskID: b.TaskID, BatchNo: b.No, Attempt: claimed.Attempt, RowNo: r.No, Result: res, Now: now}); err != nil {
			return fmt.Errorf("fail row %d of stuck batch %s/%d: %w", r.No, b.TaskID, b.No, err)
		}
		failed++
	}
	task, err := s.Store.FinishBatch(ctx, store.FinishBatchParams{TaskID: b.TaskID, BatchNo: b.No, Attempt: claimed.Attempt, Succeeded: succeeded, Failed: failed, Skipped: skipped, Now: now})
	if err != nil {
		return fmt.Errorf("finish stuck batch %s/%d: %w", b.TaskID, b.No, err)
	}
	log.Error("sweeper failed the remaining rows of a stuck batch", "task", b.TaskID, "batch", b.No, "claims", b.Attempt, "last_error", b.LastError)
	if s.Exports != nil && task.BatchesDone >= task.BatchesTotal {
		if err := s.Exports.StartExport(ctx, task.ID); err != nil {
			return fmt.Errorf("start export of %s: %w", task.ID, err)
		}
	}
	return nil
}
