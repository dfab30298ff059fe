package pipeline

import (
	"context"
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
	// batches and the task, and returns the task with the batch numbers to
	// enqueue; none when there is nothing to run.
	ReopenTask(ctx context.Context, taskID, errorClass string, now time.Time) (store.Task, []int, error)
}

// Reopen re-queues a finished task's failed rows: succeeded rows keep their
// results (they are not billed again) and the cache still answers prompts
// seen before. It returns the reopened task and how many batches were
// enqueued; zero means there was nothing to retry.
func Reopen(ctx context.Context, r Reopener, q queue.Queue, taskID, errorClass string, now time.Time) (store.Task, int, error) {
	task, batches, err := r.ReopenTask(ctx, taskID, errorClass, now)
	if err != nil {
		return store.Task{}, 0, fmt.Errorf("reopen task %s: %w", taskID, err)
	}
	msgs := make([]queue.Outgoing, 0, sendChunk)
	for i, no := range batches {
		msgs = append(msgs, queue.Outgoing{Body: EncodeBatchMessage(taskID, no)})
		if len(msgs) == sendChunk || i == len(batches)-1 {
			if err := q.Send(ctx, msgs); err != nil {
				// The batches are PENDING; the sweeper re-enqueues them.
				return task, 0, fmt.Errorf("reopen task %s: enqueue: %w", taskID, err)
			}
			msgs = msgs[:0]
		}
	}
	return task, len(batches), nil
}
