package embedded

import (
	"context"
	"fmt"

	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// DeadLetters is the dead-letter queue of a whole data directory, as the
// operator commands see it: the server's queue (ServeQueue) and every
// task's own (TaskQueue, `batchgen run`'s) in one, the way a stack's one
// SQS dead-letter queue holds every task's.
type DeadLetters struct {
	// Store is the data directory's database, opened without its lock
	// (OpenStore) or with it.
	Store *sqlitestore.Store
}

var _ queue.DeadLetters = DeadLetters{}

// queues opens the server's queue and each task's.
func (d DeadLetters) queues(ctx context.Context) ([]queue.DeadLetters, error) {
	tasks, err := d.Store.ListTasks(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	names := []string{ServeQueue}
	for _, t := range tasks {
		names = append(names, TaskQueue(t.ID))
	}
	out := make([]queue.DeadLetters, 0, len(names))
	for _, name := range names {
		q, err := OpenQueue(d.Store, name)
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, nil
}

// ListDead returns up to max dead-lettered messages of every queue of the
// data directory.
func (d DeadLetters) ListDead(ctx context.Context, max int) ([]queue.Delivery, error) {
	qs, err := d.queues(ctx)
	if err != nil {
		return nil, err
	}
	var out []queue.Delivery
	for _, q := range qs {
		if len(out) >= max {
			break
		}
		ds, err := q.ListDead(ctx, max-len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, ds...)
	}
	return out, nil
}

// Redrive moves every dead-lettered message back to the queue it came
// from, where the next `batchgen run`, `retry` or `serve` works it.
func (d DeadLetters) Redrive(ctx context.Context) (int, error) {
	qs, err := d.queues(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, q := range qs {
		n, err := q.Redrive(ctx)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
