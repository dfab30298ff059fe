package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/sqlitedb"
	"github.com/batchgen/batchgen/internal/store"
)

const (
	batchColumns = `task_id, no, first_row, row_count, state, attempt, lease_until, owner, last_error, created_at, updated_at,
		saved_succeeded, saved_failed, saved_skipped`
	// batchesPerStatement keeps one multi-row INSERT under SQLite's bound-variable limit.
	batchesPerStatement = 1000
)

// scanBatch reads one row of batchColumns.
func scanBatch(sc scanner) (store.Batch, error) {
	var (
		b                       store.Batch
		lease, created, updated sql.NullInt64
	)
	if err := sc.Scan(&b.TaskID, &b.No, &b.FirstRow, &b.RowCount, &b.State, &b.Attempt, &lease,
		&b.Owner, &b.LastError, &created, &updated, &b.Saved.Succeeded, &b.Saved.Failed, &b.Saved.Skipped); err != nil {
		return store.Batch{}, err
	}
	b.LeaseUntil, b.CreatedAt, b.UpdatedAt = fromMillis(lease), fromMillis(created), fromMillis(updated)
	return b, nil
}

// PutBatches inserts batches that do not exist yet, in state PENDING with
// Attempt 0, in one transaction. Batches whose task does not exist fail with
// ErrNotFound.
func (s *Store) PutBatches(ctx context.Context, batches []store.Batch) error {
	if len(batches) == 0 {
		return nil
	}
	what := fmt.Sprintf("put %d batches of %s", len(batches), batches[0].TaskID)
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback()
	for start := 0; start < len(batches); start += batchesPerStatement {
		part := batches[start:min(start+batchesPerStatement, len(batches))]
		args := make([]any, 0, len(part)*9)
		for _, b := range part {
			if b.TaskID == "" {
				return fmt.Errorf("%s: batch %d: empty task ID", what, b.No)
			}
			updated := b.UpdatedAt
			if updated.IsZero() {
				updated = b.CreatedAt
			}
			args = append(args, b.TaskID, b.No, b.FirstRow, b.RowCount, millis(b.CreatedAt), millis(updated),
				b.Saved.Succeeded, b.Saved.Failed, b.Saved.Skipped)
		}
		tuple := "(?, ?, ?, ?, 'PENDING', 0, NULL, '', '', ?, ?, ?, ?, ?)"
		_, err := tx.ExecContext(ctx, `INSERT INTO batches (`+batchColumns+`) VALUES `+
			strings.TrimSuffix(strings.Repeat(tuple+", ", len(part)), ", ")+
			` ON CONFLICT (task_id, no) DO NOTHING`, args...)
		if isForeignKeyErr(err) {
			return fmt.Errorf("%s: task %s: %w", what, part[0].TaskID, store.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", what, err)
	}
	return nil
}

// GetBatch returns a batch or ErrNotFound.
func (s *Store) GetBatch(ctx context.Context, taskID string, no int) (store.Batch, error) {
	b, err := scanBatch(s.read.QueryRowContext(ctx, `SELECT `+batchColumns+` FROM batches
		WHERE task_id = ? AND no = ?`, taskID, no))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Batch{}, fmt.Errorf("get batch %s/%d: %w", taskID, no, store.ErrNotFound)
	}
	if err != nil {
		return store.Batch{}, fmt.Errorf("get batch %s/%d: %w", taskID, no, err)
	}
	return b, nil
}

// ListBatches returns batches of a task in batch order, optionally only
// those in p.States.
func (s *Store) ListBatches(ctx context.Context, p store.ListBatchesParams) ([]store.Batch, error) {
	query := `SELECT ` + batchColumns + ` FROM batches WHERE task_id = ?`
	args := []any{p.TaskID}
	if len(p.States) > 0 {
		query += ` AND state IN (` + strings.TrimSuffix(strings.Repeat("?, ", len(p.States)), ", ") + `)`
		for _, st := range p.States {
			args = append(args, st)
		}
	}
	out, err := sqlitedb.QueryAll(ctx, s.read, scanBatch, query+` ORDER BY no`, args...)
	if err != nil {
		return nil, fmt.Errorf("list batches of %s: %w", p.TaskID, err)
	}
	return out, nil
}

// ListOpenBatches returns unfinished, unparked batches of every task last
// changed before p.UpdatedBefore, after p.After, through the partial index
// batches_open_updated.
func (s *Store) ListOpenBatches(ctx context.Context, p store.ListOpenBatchesParams) ([]store.Batch, error) {
	query := `SELECT ` + batchColumns + ` FROM batches INDEXED BY batches_open_updated
		WHERE state <> 'DONE' AND parked = 0 AND updated_at < ?`
	args := []any{p.UpdatedBefore.UnixMilli()}
	if p.After.TaskID != "" {
		query += ` AND (updated_at, task_id, no) > (?, ?, ?)`
		args = append(args, p.After.UpdatedAt.UnixMilli(), p.After.TaskID, p.After.No)
	}
	query += ` ORDER BY updated_at, task_id, no`
	if p.Limit > 0 {
		query += ` LIMIT ?`
		args = append(args, p.Limit)
	}
	out, err := sqlitedb.QueryAll(ctx, s.read, scanBatch, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list open batches: %w", err)
	}
	return out, nil
}

// ParkBatch takes an open batch unchanged since p.UpdatedAt out of the
// partial index batches_open_updated.
func (s *Store) ParkBatch(ctx context.Context, p store.ParkBatchParams) error {
	what := fmt.Sprintf("park batch %s/%d", p.TaskID, p.BatchNo)
	n, err := sqlitedb.Exec(ctx, s.write, `UPDATE batches SET parked = 1
		WHERE task_id = ? AND no = ? AND state <> 'DONE' AND updated_at = ?`,
		p.TaskID, p.BatchNo, millis(p.UpdatedAt))
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n == 0 {
		cur, err := s.GetBatch(ctx, p.TaskID, p.BatchNo)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return fmt.Errorf("%s: batch is %s, changed at %s: %w", what, cur.State, cur.UpdatedAt.Format(time.RFC3339Nano), store.ErrConflict)
	}
	return nil
}

// ClaimBatch takes a PENDING batch, or a RUNNING one whose lease expired
// before p.Now, in one conditional UPDATE ... RETURNING.
func (s *Store) ClaimBatch(ctx context.Context, p store.ClaimBatchParams) (store.Batch, error) {
	what := fmt.Sprintf("claim batch %s/%d for %s", p.TaskID, p.BatchNo, p.Owner)
	b, err := scanBatch(s.write.QueryRowContext(ctx, `UPDATE batches SET
			state = 'RUNNING', attempt = attempt + 1, owner = ?, lease_until = ?, updated_at = ?, parked = 0
		WHERE task_id = ? AND no = ?
			AND (state = 'PENDING' OR (state = 'RUNNING' AND coalesce(lease_until, 0) < ?))
		RETURNING `+batchColumns,
		p.Owner, millis(p.LeaseUntil), millis(p.Now), p.TaskID, p.BatchNo, p.Now.UnixMilli()))
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return store.Batch{}, fmt.Errorf("%s: %w", what, err)
	}
	// Nothing changed: tell a missing batch from a taken or finished one.
	cur, err := s.GetBatch(ctx, p.TaskID, p.BatchNo)
	if err != nil {
		return store.Batch{}, fmt.Errorf("%s: %w", what, err)
	}
	return store.Batch{}, fmt.Errorf("%s: batch is %s (attempt %d by %q, lease until %s): %w",
		what, cur.State, cur.Attempt, cur.Owner, cur.LeaseUntil.Format("15:04:05.000"), store.ErrConflict)
}

// RenewLease extends the lease of a RUNNING batch still at p.Attempt.
func (s *Store) RenewLease(ctx context.Context, p store.RenewLeaseParams) error {
	what := fmt.Sprintf("renew lease of batch %s/%d (attempt %d)", p.TaskID, p.BatchNo, p.Attempt)
	return s.fencedBatchUpdate(ctx, what, `UPDATE batches SET lease_until = ?, updated_at = ?, parked = 0
		WHERE task_id = ? AND no = ? AND state = 'RUNNING' AND attempt = ?`,
		millis(p.LeaseUntil), millis(p.Now), p.TaskID, p.BatchNo, p.Attempt)
}

// ReleaseBatch hands a RUNNING batch still at p.Attempt back as PENDING.
// The owner stays, for operators; a non-empty p.LastError replaces the
// recorded one.
func (s *Store) ReleaseBatch(ctx context.Context, p store.ReleaseBatchParams) error {
	what := fmt.Sprintf("release batch %s/%d (attempt %d)", p.TaskID, p.BatchNo, p.Attempt)
	return s.fencedBatchUpdate(ctx, what, `UPDATE batches SET
			state = 'PENDING', lease_until = NULL, last_error = coalesce(nullif(?, ''), last_error), updated_at = ?, parked = 0
		WHERE task_id = ? AND no = ? AND state = 'RUNNING' AND attempt = ?`,
		p.LastError, millis(p.Now), p.TaskID, p.BatchNo, p.Attempt)
}

// TouchBatch bumps updated_at of a batch still PENDING at p.Attempt.
func (s *Store) TouchBatch(ctx context.Context, p store.TouchBatchParams) error {
	what := fmt.Sprintf("touch batch %s/%d (attempt %d)", p.TaskID, p.BatchNo, p.Attempt)
	return s.fencedBatchUpdate(ctx, what, `UPDATE batches SET updated_at = ?, parked = 0
		WHERE task_id = ? AND no = ? AND state = 'PENDING' AND attempt = ?`,
		millis(p.Now), p.TaskID, p.BatchNo, p.Attempt)
}

// fencedBatchUpdate runs a single conditional UPDATE and turns "no row
// matched" into ErrConflict.
func (s *Store) fencedBatchUpdate(ctx context.Context, what, query string, args ...any) error {
	n, err := sqlitedb.Exec(ctx, s.write, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: batch not RUNNING under this attempt: %w", what, store.ErrConflict)
	}
	return nil
}

// addUsageSQL is the task's usage_by_provider plus the batch's (the one
// parameter, the same JSON layout), summed per label inside the UPDATE so
// that the task's split grows in the same statement as its sums.
const addUsageSQL = `(SELECT json_group_object(label, json_object(
		'input_tokens', i, 'output_tokens', o, 'cached_input_tokens', c))
	FROM (SELECT key AS label,
			sum(json_extract(value, '$.input_tokens')) AS i,
			sum(json_extract(value, '$.output_tokens')) AS o,
			sum(json_extract(value, '$.cached_input_tokens')) AS c
		FROM (SELECT key, value FROM json_each(tasks.usage_by_provider)
			UNION ALL SELECT key, value FROM json_each(?))
		GROUP BY key))`

// FinishBatch marks a RUNNING batch at p.Attempt DONE and adds its counts to
// the task, in one transaction, and returns the updated task.
func (s *Store) FinishBatch(ctx context.Context, p store.FinishBatchParams) (store.Task, error) {
	what := fmt.Sprintf("finish batch %s/%d (attempt %d)", p.TaskID, p.BatchNo, p.Attempt)
	if err := p.Check(); err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	batchUsage, err := encodeUsage(p.UsageByProvider)
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback()
	n, err := sqlitedb.Exec(ctx, tx, `UPDATE batches SET state = 'DONE', lease_until = NULL, updated_at = ?,
			saved_succeeded = ?, saved_failed = ?, saved_skipped = ?
		WHERE task_id = ? AND no = ? AND state = 'RUNNING' AND attempt = ?`,
		millis(p.Now), p.Succeeded, p.Failed, p.Skipped, p.TaskID, p.BatchNo, p.Attempt)
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	if n == 0 {
		// The very finish sent again (store.Store's FinishBatch contract: a
		// caller retrying a finish whose answer it lost) is that finish.
		var echo int
		err := tx.QueryRowContext(ctx, `SELECT count(*) FROM batches WHERE task_id = ? AND no = ? AND state = 'DONE' AND attempt = ?
			AND updated_at = ? AND saved_succeeded = ? AND saved_failed = ? AND saved_skipped = ?`,
			p.TaskID, p.BatchNo, p.Attempt, millis(p.Now), p.Succeeded, p.Failed, p.Skipped).Scan(&echo)
		if err != nil {
			return store.Task{}, fmt.Errorf("%s: %w", what, err)
		}
		if echo == 0 {
			return store.Task{}, fmt.Errorf("%s: batch not RUNNING under this attempt: %w", what, store.ErrConflict)
		}
		t, err := scanTask(tx.QueryRowContext(ctx, `SELECT `+taskColumns+` FROM tasks WHERE id = ?`, p.TaskID))
		if err != nil {
			return store.Task{}, fmt.Errorf("%s: read task back: %w", what, err)
		}
		return t, nil
	}
	t, err := scanTask(tx.QueryRowContext(ctx, `UPDATE tasks SET
			batches_done = batches_done + 1,
			rows_succeeded = rows_succeeded + ?,
			rows_failed = rows_failed + ?,
			rows_skipped = rows_skipped + ?,
			input_tokens = input_tokens + ?,
			output_tokens = output_tokens + ?,
			cached_input_tokens = cached_input_tokens + ?,
			usage_by_provider = `+addUsageSQL+`,
			updated_at = ?
		WHERE id = ?
		RETURNING `+taskColumns, p.Succeeded, p.Failed, p.Skipped,
		p.Usage.InputTokens, p.Usage.OutputTokens, p.Usage.CachedInputTokens, batchUsage, millis(p.Now), p.TaskID))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Task{}, fmt.Errorf("%s: task: %w", what, store.ErrNotFound)
	}
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return store.Task{}, fmt.Errorf("%s: commit: %w", what, err)
	}
	return t, nil
}
