package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

// The use cases' side of the task lifecycle (store/lifecycle.go holds the
// table): starting an export once, re-exporting, and finishing a batch.
// Every path that ends a batch or starts an export goes through here.

// StartExportOnce starts the export of task when it needs one
// (store.Task.NeedsExport), once per export: only the caller whose
// conditional store.EventExport applies calls the starter, so a redelivered
// message, a second worker that also saw the last batch finish, or a sweep
// finds the task EXPORTING and leaves it alone. It leaves alone a task that
// is EXPORTING already (the sweeper starts again an export that never
// started) and a cancelled one (its cancel starts its export, or the
// sweeper does). It reports whether it started the export. A start that
// fails after the transition leaves the task EXPORTING; the sweeper starts
// it again once it has waited too long.
func StartExportOnce(ctx context.Context, st store.Store, ex ExportStarter, task store.Task, now time.Time) (bool, error) {
	if !task.NeedsExport() || !store.EventExport.Allows(task.State) {
		return false, nil
	}
	t, err := st.TransitionTask(ctx, store.EventExport.Params(task.ID, now))
	if isConflict(err) {
		return false, nil // exporting already, or finished
	}
	if err != nil {
		return false, fmt.Errorf("task %s: mark exporting: %w", task.ID, err)
	}
	if err := ex.StartExport(ctx, t.ID, t.ExportGen); err != nil {
		return false, fmt.Errorf("task %s: start export: %w", task.ID, err)
	}
	return true, nil
}

// Reexport exports a finished (SUCCEEDED or PARTIAL) task again from its
// stored rows, without a model call: for a task whose result file is gone
// (expired, deleted) when its input is dropped again. The task moves back to
// EXPORTING under its next export generation (store.EventReexport), so on
// AWS a new execution is started (the first one's name is taken for 90
// days). It reports whether it started the export; false when the task
// changed meanwhile (someone else re-exports it).
func Reexport(ctx context.Context, st store.Store, ex ExportStarter, task store.Task, now time.Time) (bool, error) {
	t, err := st.TransitionTask(ctx, store.EventReexport.Params(task.ID, now))
	if isConflict(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("re-export task %s: %w", task.ID, err)
	}
	if err := ex.StartExport(ctx, t.ID, t.ExportGen); err != nil {
		// The task is EXPORTING; the sweeper starts it again later.
		return false, fmt.Errorf("re-export task %s: start export: %w", task.ID, err)
	}
	return true, nil
}

// batchTally adds up a batch's row results for FinishBatch: the rows per
// final state, and the tokens, split by the provider label each row
// records so that a task routed over providers of different prices is
// priced at each one's own.
type batchTally struct {
	store.RowCounts
	// pending counts rows still to be generated (not final).
	pending    int
	usage      store.Usage
	byProvider map[string]store.Usage
}

// add counts one row's result.
func (t *batchTally) add(r store.RowResult) {
	t.usage = t.usage.Add(r.Usage)
	if r.Usage != (store.Usage{}) {
		if t.byProvider == nil {
			t.byProvider = map[string]store.Usage{}
		}
		t.byProvider[r.Provider] = t.byProvider[r.Provider].Add(r.Usage)
	}
	if r.State.Final() {
		t.RowCounts = t.Count(r.State)
	} else {
		t.pending++
	}
}

// finishBatch is the one end of a batch, for the generator and the
// sweeper alike: it marks batch b, as its claim returned it, DONE with
// the counts of tally, every one of its rows being final, and starts the
// export of its task when that was the last batch. write runs each store
// write (the generator retries transient failures, the sweeper writes
// once). The task returned is as FinishBatch left it, also with the error
// of an export that did not start (the zero Task when the batch was not
// finished); ErrConflict means the batch was finished (or taken) by
// someone else, who counts it.
func finishBatch(ctx context.Context, st store.Store, ex ExportStarter, b store.Batch, tally batchTally, now time.Time,
	write func(func() error) error) (store.Task, error) {
	if tally.pending > 0 {
		return store.Task{}, fmt.Errorf("finish batch %s/%d: %d rows are not finished", b.TaskID, b.No, tally.pending)
	}
	var task store.Task
	err := write(func() error {
		var err error
		task, err = st.FinishBatch(ctx, store.FinishBatchParams{
			TaskID: b.TaskID, BatchNo: b.No, Attempt: b.Attempt,
			Succeeded: tally.Succeeded, Failed: tally.Failed, Skipped: tally.Skipped,
			Usage: tally.usage, UsageByProvider: tally.byProvider, Now: now,
		})
		return err
	})
	if err != nil {
		return store.Task{}, fmt.Errorf("finish batch %s/%d: %w", b.TaskID, b.No, err)
	}
	if _, err := StartExportOnce(ctx, st, ex, task, now); err != nil {
		// The batch is done; a redelivery of its message finds it DONE and
		// starts the export again (Generator.ensureExport), as does the
		// sweeper.
		return task, err
	}
	return task, nil
}

// saveGroupLen is how many of n row results, from the first, go into one
// SaveRowResults call, size(i) being what the i-th adds with its cache
// entry (store.RowResultWrite.SaveSize, store.CacheEntry.SaveSize): at most
// store.MaxSaveRows, and no more than store.MaxSaveBytes (DynamoDB's
// transaction holds 100 items and 4 MB), but always at least one. Every
// writer of row results (the generator's flusher, the sweeper) splits its
// groups by it.
func saveGroupLen(n int, size func(i int) int) int {
	total := store.SaveRowResultsParams{}.Size() // the batch's fence
	for i := range n {
		total += size(i)
		if i == store.MaxSaveRows || (i > 0 && total > store.MaxSaveBytes) {
			return i
		}
	}
	return n
}
