package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
)

// Reopener puts a finished task's failed rows back to work. sqlitestore
// implements it; it is a separate interface because reopening is an
// operator action, not part of the hot path every store must serve.
type Reopener interface {
	// ReopenTask resets the FAILED rows of class errorClass (all failed rows
	// when empty) to PENDING with a fresh attempt budget, reopens their
	// batches (recounting their Saved) and the task, and returns the task
	// with the batch numbers to enqueue; none when there is nothing to run. A task that is not
	// SUCCEEDED, PARTIAL or CANCELLED is store.ErrConflict.
	ReopenTask(ctx context.Context, taskID, errorClass string, now time.Time) (store.Task, []int, error)
}

// Reopen re-queues a finished task's failed rows: succeeded rows keep their
// results (they are not billed again) and the cache still answers prompts
// seen before. It returns the reopened task and how many batches were
// enqueued; zero means there was nothing to retry. A task in another state
// (FAILED: rejected input or a failed export) is a *StateError. With
// ownsWorkers (the caller holds the task's only workers: see
// Retrier.OwnsWorkers) a batch still leased by a process that died (a
// cancelled run killed mid-batch) is released first, so the retry claims
// it at once instead of waiting for the lease to run out.
func Reopen(ctx context.Context, r RetryStore, q queue.Queue, taskID, errorClass string, now time.Time, ownsWorkers bool) (store.Task, int, error) {
	task, batches, err := r.ReopenTask(ctx, taskID, errorClass, now)
	if errors.Is(err, store.ErrConflict) {
		if cur, gerr := r.GetTask(ctx, taskID); gerr == nil {
			return cur, 0, &StateError{Task: cur, Action: "retried", Event: store.EventReopen}
		}
	}
	if err != nil {
		return store.Task{}, 0, fmt.Errorf("reopen task %s: %w", taskID, err)
	}
	if ownsWorkers {
		if _, err := releaseDeadLeases(ctx, r, taskID, now); err != nil {
			return task, 0, fmt.Errorf("reopen task %s: %w", taskID, err)
		}
	}
	if err := q.Send(ctx, BatchMessages(task, batches)); err != nil {
		// The batches are PENDING; the sweeper re-enqueues them.
		return task, 0, fmt.Errorf("reopen task %s: enqueue: %w", taskID, err)
	}
	return task, len(batches), nil
}

// Resume makes an unfinished task whose workers are known to be dead (the
// embedded runtime holds its data directory's lock, so no other process
// works it) runnable at once, instead of waiting for leases and visibility
// timeouts to run out: every RUNNING batch is released and every unfinished
// batch gets a fresh message (duplicates are harmless: claims are
// conditional). It returns how many batches were re-enqueued.
func Resume(ctx context.Context, st store.Store, q queue.Queue, task store.Task, now time.Time) (int, error) {
	nos, err := releaseDeadLeases(ctx, st, task.ID, now)
	if err != nil {
		return 0, fmt.Errorf("resume task %s: %w", task.ID, err)
	}
	if err := q.Send(ctx, BatchMessages(task, nos)); err != nil {
		return 0, fmt.Errorf("resume task %s: enqueue: %w", task.ID, err)
	}
	return len(nos), nil
}

// releaseDeadLeases hands every RUNNING batch of a task whose workers are
// known to be dead back (PENDING), and returns the numbers of its
// unfinished batches.
func releaseDeadLeases(ctx context.Context, st store.Store, taskID string, now time.Time) ([]int, error) {
	batches, err := st.ListBatches(ctx, store.ListBatchesParams{TaskID: taskID, States: []store.BatchState{store.BatchPending, store.BatchRunning}})
	if err != nil {
		return nil, fmt.Errorf("list batches: %w", err)
	}
	nos := make([]int, 0, len(batches))
	for _, b := range batches {
		if b.State == store.BatchRunning {
			err := st.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: taskID, BatchNo: b.No, Attempt: b.Attempt, LastError: "previous run stopped", Now: now})
			if err != nil && !errors.Is(err, store.ErrConflict) {
				return nil, fmt.Errorf("release batch %d: %w", b.No, err)
			}
		}
		nos = append(nos, b.No)
	}
	return nos, nil
}

// RetryStore is what Retry needs of a store: the port and reopening.
type RetryStore interface {
	store.Store
	Reopener
}

// RetryParams say which task to retry and with what.
type RetryParams struct {
	TaskID string
	// ErrorClass limits the retry to rows that failed with this class;
	// empty retries every failed row.
	ErrorClass string
	// Provider and Model are what the retry would call. When set they must
	// be the task's own: the cache and the result columns are per model.
	// Empty skips the check (a deployed stack's generator runs the task's
	// own spec).
	Provider, Model string
	// Now is the time of the retry.
	Now time.Time
}

// RetryOutcome says what Retry did.
type RetryOutcome struct {
	// Task is the task as reopened (or as found, when resumed).
	Task store.Task
	// Resumed is set when the task was unfinished: its run stopped midway
	// and the retry just continues it.
	Resumed bool
	// Batches is how many batches were enqueued; zero for a finished task
	// with no failed rows to retry (its result can simply be written again).
	Batches int
}

// MismatchError is a retry asked of another provider or model than the
// task ran with.
type MismatchError struct {
	Task            store.Task
	Provider, Model string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("task %s ran with --provider %s --model %s, not %s %s; retry with the same (the endpoint and key may differ)",
		e.Task.ID, e.Task.Spec.Provider, e.Task.Spec.Model, e.Provider, e.Model)
}

// Retrier puts tasks back to work, for every runtime: a finished task has
// its failed rows reopened (see Reopen); an unfinished one is resumed when
// the retrier owns the task's workers, and refused otherwise.
type Retrier struct {
	Store RetryStore
	Queue queue.Queue
	// OwnsWorkers is set by a caller that holds the only workers of its
	// tasks (the embedded runtime, under its data directory's lock): an
	// unfinished task is then a run that stopped midway and is resumed, and
	// batches leased by a process that died are released at once. Without
	// it (a deployed stack, or the API, whose workers may be running the
	// task) an unfinished task is a *StateError and leases run out as
	// they do.
	OwnsWorkers bool
}

// Retry puts task p.TaskID back to work. An unknown task is
// store.ErrNotFound, a task in a state that cannot be retried a
// *StateError (which matches store.ErrConflict), another provider or model
// a *MismatchError. When the task was reopened but its batches could not
// all be enqueued, the error is returned with the reopened task: the
// sweeper enqueues the batches that wait.
func (r Retrier) Retry(ctx context.Context, p RetryParams) (RetryOutcome, error) {
	task, err := r.Store.GetTask(ctx, p.TaskID)
	if err != nil {
		return RetryOutcome{}, fmt.Errorf("retry task %s: %w", p.TaskID, err)
	}
	if (p.Provider != "" || p.Model != "") && (task.Spec.Provider != p.Provider || task.Spec.Model != p.Model) {
		return RetryOutcome{Task: task}, &MismatchError{Task: task, Provider: p.Provider, Model: p.Model}
	}
	if !task.State.Final() {
		if !r.OwnsWorkers {
			return RetryOutcome{}, &StateError{Task: task, Action: "retried", Event: store.EventReopen}
		}
		n, err := Resume(ctx, r.Store, r.Queue, task, p.Now)
		return RetryOutcome{Task: task, Resumed: true, Batches: n}, err
	}
	reopened, n, err := Reopen(ctx, r.Store, r.Queue, task.ID, p.ErrorClass, p.Now, r.OwnsWorkers)
	if err != nil {
		return RetryOutcome{Task: reopened}, err
	}
	return RetryOutcome{Task: reopened, Batches: n}, nil
}

// ResumeReport counts what ResumeUnfinished did.
type ResumeReport struct {
	// Tasks counts running tasks whose batches were re-enqueued.
	Tasks int
	// Batches counts the batches re-enqueued.
	Batches int
	// Exports counts exports started again: tasks that were EXPORTING, and
	// cancelled tasks whose partial result was never written.
	Exports int
}

// ResumeUnfinished is Resume for every unfinished task of a store whose
// workers are all known to be dead: the embedded server (`batchgen
// serve`) calls it at start-up, holding its data directory's lock, so
// whatever was in flight when it stopped continues. RUNNING tasks get their
// batches back on q; EXPORTING tasks, and CANCELLED tasks without a result,
// are exported again through exports. PENDING tasks are left alone: a split
// that died halfway continues when its input is taken again (the drop
// folder still holds it). It carries on past per-task failures and returns
// them joined.
func ResumeUnfinished(ctx context.Context, st store.Store, q queue.Queue, exports ExportStarter, now time.Time) (ResumeReport, error) {
	tasks, err := st.ListTasks(ctx, 0)
	if err != nil {
		return ResumeReport{}, fmt.Errorf("resume unfinished tasks: list tasks: %w", err)
	}
	var report ResumeReport
	var errs []error
	for _, t := range tasks {
		switch {
		case t.State == store.TaskPending:
			// Its split continues when its input is taken again.
		case t.State == store.TaskRunning && t.NeedsExport():
			// Stopped between finishing its last batch and starting the
			// export.
			started, err := StartExportOnce(ctx, st, exports, t, now)
			if err != nil {
				errs = append(errs, fmt.Errorf("resume task %s: %w", t.ID, err))
				continue
			}
			if started {
				report.Exports++
			}
		case t.State == store.TaskRunning:
			n, err := Resume(ctx, st, q, t, now)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			report.Tasks++
			report.Batches += n
		case t.NeedsExport():
			// Exporting, or cancelled without its partial result.
			if err := exports.StartExport(ctx, t.ID, t.ExportGen); err != nil {
				errs = append(errs, fmt.Errorf("resume task %s: export: %w", t.ID, err))
				continue
			}
			report.Exports++
		}
	}
	return report, errors.Join(errs...)
}
