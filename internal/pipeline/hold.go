package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
)

// A task asked to be quoted first (store.Terms.Sample) is split but held
// (store.TaskHeld): the splitter sends only its sample's messages, which
// the generators answer online as any batch's rows, and its owner reads
// the quote (QuoteTask) and starts it (Starter.Start) or cancels it. The
// task keeps the sample's answers, so the run does not pay for them again.

// MaxSample is the most rows a quote may ask to be answered first: a
// sample is to measure tokens per row, not to run the job.
const MaxSample = 1000

// CheckSample refuses a sample size that is not a count of rows within
// MaxSample. name is what the caller calls the setting (--sample, sample).
func CheckSample(name string, n int) error {
	if n < 0 || n > MaxSample {
		return fmt.Errorf("%s %d: must be 0 (no quote) to %d rows", name, n, MaxSample)
	}
	return nil
}

// sampleSlice is one batch's share of a sample.
type sampleSlice struct{ batchNo, rows int }

// samplePlan spreads a sample of n rows over task's batches: the first
// rows of batches spread evenly over the task, so that a sheet sorted by
// anything (short descriptions first, one category after another) is
// measured across its length.
func samplePlan(task store.Task, n int) []sampleSlice {
	batches := min(n, task.BatchesTotal)
	out := make([]sampleSlice, 0, batches)
	for i := range batches {
		want := n / batches
		if i < n%batches {
			want++
		}
		out = append(out, sampleSlice{batchNo: 1 + i*task.BatchesTotal/batches, rows: want})
	}
	return out
}

// SampleMessages are the queue messages that answer a sample of n of
// task's rows: one per batch the sample takes rows from, each saying how
// many (BatchMessage.Sample).
func SampleMessages(task store.Task, n int) []queue.Outgoing {
	plan := samplePlan(task, n)
	msgs := make([]queue.Outgoing, len(plan))
	for i, s := range plan {
		msgs[i] = BatchMessage{TaskID: task.ID, BatchNo: s.batchNo, Owner: task.Owner, Sample: s.rows}.Outgoing(0)
	}
	return msgs
}

// Starter starts held tasks: the API's POST /api/tasks/{id}/start.
type Starter struct {
	Store store.Store
	Queue queue.Queue
	// Exports starts the export of a task whose sample answered every row.
	Exports ExportStarter
}

// StartParams say which held task to start, and with what terms.
type StartParams struct {
	TaskID string
	// Change, when non-nil, changes the task's terms before it starts (the
	// plan its owner chose from the quote: mode, deadline, cap).
	Change func(*store.Terms)
	Now    time.Time
}

// Start moves a held task to RUNNING (store.EventStart) and sends its
// unfinished batches. It returns the task and how many batches were sent.
// A task that is not held is a *StateError; a task whose sample answered
// every row goes straight to its export.
func (s Starter) Start(ctx context.Context, p StartParams) (store.Task, int, error) {
	task, err := s.Store.GetTask(ctx, p.TaskID)
	if err != nil {
		return store.Task{}, 0, fmt.Errorf("start task %s: %w", p.TaskID, err)
	}
	if !store.EventStart.Allows(task.State) {
		return task, 0, &StateError{Task: task, Action: "started", Event: store.EventStart}
	}
	if p.Change != nil {
		terms := task.Terms
		p.Change(&terms)
		if terms != task.Terms {
			// Held: nothing but its sample reads the terms yet, and the
			// sample runs online whatever they say.
			if task, err = s.Store.SetTerms(ctx, task.ID, terms); err != nil {
				return store.Task{}, 0, fmt.Errorf("start task %s: set terms: %w", p.TaskID, err)
			}
		}
	}
	task, err = s.Store.TransitionTask(ctx, store.EventStart.Params(task.ID, p.Now))
	if isConflict(err) {
		cur, gerr := s.Store.GetTask(ctx, p.TaskID)
		if gerr != nil {
			return store.Task{}, 0, fmt.Errorf("start task %s: %w", p.TaskID, gerr)
		}
		return cur, 0, &StateError{Task: cur, Action: "started", Event: store.EventStart}
	}
	if err != nil {
		return store.Task{}, 0, fmt.Errorf("start task %s: %w", p.TaskID, err)
	}
	if task.NeedsExport() {
		// The sample answered every row (a small sheet).
		if s.Exports == nil {
			return task, 0, nil // the sweeper starts it
		}
		if _, err := StartExportOnce(ctx, s.Store, s.Exports, task, p.Now); err != nil {
			return task, 0, fmt.Errorf("start task %s: %w", p.TaskID, err)
		}
		return task, 0, nil
	}
	batches, err := s.Store.ListBatches(ctx, store.ListBatchesParams{TaskID: task.ID, States: []store.BatchState{store.BatchPending, store.BatchRunning}})
	if err != nil {
		return task, 0, fmt.Errorf("start task %s: list batches: %w", task.ID, err)
	}
	nos := make([]int, len(batches))
	for i, b := range batches {
		nos[i] = b.No
	}
	if err := s.Queue.Send(ctx, BatchMessages(task, nos)); err != nil {
		// The task is RUNNING with its batches PENDING: the sweeper sends
		// them once they have waited its PendingAfter.
		return task, 0, fmt.Errorf("start task %s: enqueue %d batches: %w", task.ID, len(nos), err)
	}
	return task, len(nos), nil
}
