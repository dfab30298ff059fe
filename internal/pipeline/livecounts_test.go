package pipeline_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// batchList is a BatchLister over fixed batches, counting its reads.
type batchList struct {
	batches []store.Batch
	err     error
	reads   int
}

func (l *batchList) ListBatches(context.Context, store.ListBatchesParams) ([]store.Batch, error) {
	l.reads++
	return l.batches, l.err
}

// TestLiveCounts: while a task generates, its rows done are its batches'
// saved counts added up (finished and running batches alike), never less
// than its own counters; a task that is not generating, or whose batches
// are all finished, is shown as stored without a read.
func TestLiveCounts(t *testing.T) {
	running := store.Task{ID: "t", State: store.TaskRunning, RowsTotal: 300, BatchesTotal: 3, BatchesDone: 1,
		RowsSucceeded: 98, RowsFailed: 2}
	batches := []store.Batch{
		{No: 1, State: store.BatchDone, Saved: store.RowCounts{Succeeded: 98, Failed: 2}},
		{No: 2, State: store.BatchRunning, Saved: store.RowCounts{Succeeded: 40, Skipped: 1}},
		{No: 3, State: store.BatchRunning, Saved: store.RowCounts{Succeeded: 10, Failed: 1}},
	}
	legacy := []store.Batch{{No: 1, State: store.BatchDone}, {No: 2, State: store.BatchRunning, Saved: store.RowCounts{Succeeded: 5}}}
	exporting := running
	exporting.State, exporting.BatchesDone = store.TaskExporting, 3
	allDone := running
	allDone.BatchesDone = 3
	tests := []struct {
		name      string
		task      store.Task
		batches   []store.Batch
		want      store.RowCounts
		wantReads int
	}{
		{"running: the batches' saved rows", running, batches, store.RowCounts{Succeeded: 148, Failed: 3, Skipped: 1}, 1},
		{"batches without counts: at least the task's own", running, legacy, store.RowCounts{Succeeded: 98, Failed: 2}, 1},
		{"exporting: as stored", exporting, batches, store.RowCounts{Succeeded: 98, Failed: 2}, 0},
		{"every batch finished: as stored", allDone, batches, store.RowCounts{Succeeded: 98, Failed: 2}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &batchList{batches: tt.batches}
			got, err := pipeline.LiveCounts(t.Context(), l, tt.task)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got.Counts()); d != "" {
				t.Errorf("counts (-want +got):\n%s", d)
			}
			if l.reads != tt.wantReads {
				t.Errorf("%d batch listings, want %d", l.reads, tt.wantReads)
			}
		})
	}
	t.Run("a failed read keeps the stored counts", func(t *testing.T) {
		got, err := pipeline.LiveCounts(t.Context(), &batchList{err: errors.New("throttled")}, running)
		if err == nil {
			t.Error("no error for a failed read")
		}
		if got.Counts() != running.Counts() {
			t.Errorf("counts %+v after a failed read, want the task's %+v", got.Counts(), running.Counts())
		}
	})
}
