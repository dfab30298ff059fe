package main

import (
	"context"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// countDone counts rows already finished, so a continued run's progress
// starts where the last one stopped: the task's counts as saved so far
// (pipeline.LiveCounts: a listing of its batches, not of its rows).
func countDone(ctx context.Context, st store.Store, task store.Task) (int, error) {
	t, err := pipeline.LiveCounts(ctx, st, task)
	return t.Counts().Done(), err
}
