package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

// StateError is an operator action refused because of the task's state:
// cancelling a finished task, retrying a failed one. Its message names the
// state and what would be allowed, for the user as is. It matches
// store.ErrConflict with errors.Is.
type StateError struct {
	// Task is the task as it is now.
	Task store.Task
	// Action is what was refused, e.g. "cancelled" or "retried".
	Action string
	// Event is the lifecycle event that was refused; its source states are
	// those in which Action is possible.
	Event store.TaskEvent
}

func (e *StateError) Error() string {
	return fmt.Sprintf("task %s is %s; only a %s task can be %s", e.Task.ID, e.Task.State, store.JoinStates(e.Event.From()), e.Action)
}

// Is makes a StateError match store.ErrConflict.
func (e *StateError) Is(target error) bool { return target == store.ErrConflict }

// ExportNotStartedError is a task that was cancelled but whose partial
// result could not be started or written. The task stays CANCELLED and the
// sweeper (or a later export) writes the result; callers report it.
type ExportNotStartedError struct {
	Task store.Task
	Err  error
}

func (e *ExportNotStartedError) Error() string {
	return fmt.Sprintf("task %s is cancelled, but exporting its partial result failed: %v", e.Task.ID, e.Err)
}
func (e *ExportNotStartedError) Unwrap() error { return e.Err }

// CancelParams say which task to cancel and why.
type CancelParams struct {
	TaskID string
	// Reason is recorded as the task's error, e.g. "cancelled by operator".
	Reason string
	// Now is the time of the cancel.
	Now time.Time
	// Exports, when non-nil, starts the export of the partial result at
	// once. Leave it nil when a running worker will export it (it sees the
	// cancel) or when the sweeper should.
	Exports ExportStarter
}

// Cancel stops a task: no new row starts (running batches see the state and
// stop claiming rows), rows in flight finish, and the export writes a
// partial result that marks the rows that never ran not_started. An unknown
// task is store.ErrNotFound; a task that is no longer pending or running is
// a *StateError. When the export cannot be started the task is still
// cancelled and the error is an *ExportNotStartedError.
func Cancel(ctx context.Context, st store.Store, p CancelParams) (store.Task, error) {
	var task store.Task
	for attempt := 1; ; attempt++ {
		var err error
		cancel := store.EventCancel.Params(p.TaskID, p.Now)
		cancel.Error = p.Reason
		task, err = st.TransitionTask(ctx, cancel)
		if err == nil {
			break
		}
		switch {
		case errors.Is(err, store.ErrNotFound):
			return store.Task{}, fmt.Errorf("cancel task %s: %w", p.TaskID, store.ErrNotFound)
		case errors.Is(err, store.ErrConflict):
			cur, gerr := st.GetTask(ctx, p.TaskID)
			if gerr != nil {
				return store.Task{}, fmt.Errorf("cancel task %s: read its state: %w", p.TaskID, gerr)
			}
			if !store.EventCancel.Allows(cur.State) || attempt == 3 {
				return cur, &StateError{Task: cur, Action: "cancelled", Event: store.EventCancel}
			}
			// It moved under us (PENDING -> RUNNING): try again.
		default:
			return store.Task{}, fmt.Errorf("cancel task %s: %w", p.TaskID, err)
		}
	}
	if p.Exports != nil {
		if err := p.Exports.StartExport(ctx, p.TaskID, task.ExportGen); err != nil {
			return task, &ExportNotStartedError{Task: task, Err: err}
		}
	}
	return task, nil
}

// StartExport runs the export in-process, for callers that have no
// separate export trigger (the embedded runtime with no run active).
func (e *Exporter) StartExport(ctx context.Context, taskID string, _ int) error {
	_, err := e.Export(ctx, taskID)
	return err
}
