package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/sqlitedb"
	"github.com/batchgen/batchgen/internal/store"
)

// ReopenTask puts the FAILED rows of a finished task (those of class
// errorClass, or all when it is empty) back to PENDING with a fresh attempt
// budget, reopens the batches that hold them (and, for a cancelled task, the
// batches that never finished), takes those batches' counts back out of the
// task, and sets the task RUNNING with no result. It returns the task and the
// batch numbers to enqueue, all in one transaction. When nothing is left to
// run it changes nothing and returns no batches. A task that is not
// SUCCEEDED, PARTIAL or CANCELLED gives ErrConflict.
func (s *Store) ReopenTask(ctx context.Context, taskID, errorClass string, now time.Time) (store.Task, []int, error) {
	what := fmt.Sprintf("reopen task %s", taskID)
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback()

	var state string
	err = tx.QueryRowContext(ctx, `SELECT state FROM tasks WHERE id = ?`, taskID).Scan(&state)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Task{}, nil, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	if !store.EventReopen.Allows(store.TaskState(state)) {
		return store.Task{}, nil, fmt.Errorf("%s: task is %s; only a finished or cancelled task can be retried: %w", what, state, store.ErrConflict)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE rows SET
			state = 'PENDING', output = '', error = '', error_class = '', attempts = 0, latency_ms = 0, cached = 0,
			provider = '', input_tokens = 0, output_tokens = 0, cached_input_tokens = 0, updated_at = ?
		WHERE task_id = ? AND state = 'FAILED' AND (? = '' OR error_class = ?)`,
		millis(now), taskID, errorClass, errorClass); err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: reset rows: %w", what, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE batches SET state = 'PENDING', lease_until = NULL, updated_at = ?
		WHERE task_id = ? AND state = 'DONE' AND EXISTS (
			SELECT 1 FROM rows r WHERE r.task_id = batches.task_id
				AND r.no BETWEEN batches.first_row AND batches.first_row + batches.row_count - 1
				AND r.state = 'PENDING')`, millis(now), taskID); err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: reopen batches: %w", what, err)
	}
	// Every batch not DONE now counts its final rows again (the reset ones
	// left them).
	if _, err := tx.ExecContext(ctx, `UPDATE batches SET
			saved_succeeded = (SELECT count(*) FROM rows r WHERE r.task_id = batches.task_id
				AND r.no BETWEEN batches.first_row AND batches.first_row + batches.row_count - 1 AND r.state = 'SUCCEEDED'),
			saved_failed = (SELECT count(*) FROM rows r WHERE r.task_id = batches.task_id
				AND r.no BETWEEN batches.first_row AND batches.first_row + batches.row_count - 1 AND r.state = 'FAILED'),
			saved_skipped = (SELECT count(*) FROM rows r WHERE r.task_id = batches.task_id
				AND r.no BETWEEN batches.first_row AND batches.first_row + batches.row_count - 1 AND r.state = 'SKIPPED')
		WHERE task_id = ? AND state <> 'DONE'`, taskID); err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: recount batches: %w", what, err)
	}
	// A cancelled task's unfinished batches may have been parked by the
	// sweeper: put them back in its index, as if changed now, so that a lost
	// message is found again.
	if _, err := tx.ExecContext(ctx, `UPDATE batches SET parked = 0,
			updated_at = CASE WHEN state = 'PENDING' THEN ? ELSE updated_at END
		WHERE task_id = ? AND state <> 'DONE'`, millis(now), taskID); err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: unpark batches: %w", what, err)
	}
	open, err := sqlitedb.QueryAll(ctx, tx, func(sc sqlitedb.Scanner) (no int, err error) { return no, sc.Scan(&no) },
		`SELECT no FROM batches WHERE task_id = ? AND state <> 'DONE' ORDER BY no`, taskID)
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: list open batches: %w", what, err)
	}
	if len(open) == 0 {
		t, err := s.GetTask(ctx, taskID)
		return t, nil, err // the deferred rollback keeps everything as it was
	}
	// Recount from the batches still DONE: their counts stay, the reopened
	// ones are added again by FinishBatch when they finish.
	t, err := scanTask(tx.QueryRowContext(ctx, `UPDATE tasks SET
			state = ?, result_key = '', error = '', finished_at = NULL, updated_at = ?, export_gen = export_gen + 1,
			batches_done = (SELECT count(*) FROM batches WHERE task_id = ? AND state = 'DONE'),
			rows_succeeded = (SELECT count(*) FROM rows r JOIN batches b ON b.task_id = r.task_id
				AND r.no BETWEEN b.first_row AND b.first_row + b.row_count - 1
				WHERE r.task_id = ? AND b.state = 'DONE' AND r.state = 'SUCCEEDED'),
			rows_failed = (SELECT count(*) FROM rows r JOIN batches b ON b.task_id = r.task_id
				AND r.no BETWEEN b.first_row AND b.first_row + b.row_count - 1
				WHERE r.task_id = ? AND b.state = 'DONE' AND r.state = 'FAILED'),
			rows_skipped = (SELECT count(*) FROM rows r JOIN batches b ON b.task_id = r.task_id
				AND r.no BETWEEN b.first_row AND b.first_row + b.row_count - 1
				WHERE r.task_id = ? AND b.state = 'DONE' AND r.state = 'SKIPPED'),
			(input_tokens, output_tokens, cached_input_tokens) = (SELECT
				coalesce(sum(r.input_tokens), 0), coalesce(sum(r.output_tokens), 0), coalesce(sum(r.cached_input_tokens), 0)
				FROM rows r JOIN batches b ON b.task_id = r.task_id
				AND r.no BETWEEN b.first_row AND b.first_row + b.row_count - 1
				WHERE r.task_id = ? AND b.state = 'DONE'),
			usage_by_provider = (SELECT json_group_object(provider, json_object(
				'input_tokens', i, 'output_tokens', o, 'cached_input_tokens', c))
				FROM (SELECT r.provider AS provider, sum(r.input_tokens) AS i, sum(r.output_tokens) AS o,
						sum(r.cached_input_tokens) AS c
					FROM rows r JOIN batches b ON b.task_id = r.task_id
						AND r.no BETWEEN b.first_row AND b.first_row + b.row_count - 1
					WHERE r.task_id = ? AND b.state = 'DONE'
					GROUP BY r.provider
					HAVING sum(r.input_tokens) + sum(r.output_tokens) + sum(r.cached_input_tokens) > 0))
		WHERE id = ?
		RETURNING `+taskColumns, store.EventReopen.To(), millis(now), taskID, taskID, taskID, taskID, taskID, taskID, taskID))
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: reset task: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: commit: %w", what, err)
	}
	return t, open, nil
}
