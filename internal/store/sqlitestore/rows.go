package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/batchgen/batchgen/internal/store"
)

const (
	// rowColumns are bound per row by PutRows.
	rowColumns = `task_id, no, sheet_row, cells, state, output, error, error_class, attempts, latency_ms, cached`
	// rowColumnCount is the number of columns in rowColumns.
	rowColumnCount = 11
	// rowsPerStatement keeps one multi-row INSERT well under SQLite's
	// 32,766 bound variables.
	rowsPerStatement = 500
	// rowsPerTx bounds how long a large split holds the write connection,
	// so that workers' claims and results interleave with it.
	rowsPerTx = 10_000
)

// validRowState reports whether st is a state a row may be stored in.
func validRowState(st store.RowState) bool {
	switch st {
	case store.RowPending, store.RowSucceeded, store.RowFailed, store.RowSkipped:
		return true
	}
	return false
}

// PutRows inserts rows that do not exist yet, with multi-row INSERT ... ON
// CONFLICT DO NOTHING statements in transactions of rowsPerTx rows. Rows
// whose task does not exist fail with ErrNotFound.
func (s *Store) PutRows(ctx context.Context, rows []store.Row) error {
	args := make([]any, 0, rowsPerStatement*rowColumnCount)
	for start := 0; start < len(rows); start += rowsPerTx {
		chunk := rows[start:min(start+rowsPerTx, len(rows))]
		if err := s.putRowsTx(ctx, chunk, args); err != nil {
			first := chunk[0]
			return fmt.Errorf("put rows %s/%d..%d: %w", first.TaskID, first.No, chunk[len(chunk)-1].No, err)
		}
	}
	return nil
}

// putRowsTx inserts rows in one transaction; args is scratch space.
func (s *Store) putRowsTx(ctx context.Context, rows []store.Row, args []any) error {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	var full *sql.Stmt // prepared once for all full-size statements
	for start := 0; start < len(rows); start += rowsPerStatement {
		part := rows[start:min(start+rowsPerStatement, len(rows))]
		args = args[:0]
		for _, r := range part {
			if r.TaskID == "" {
				return fmt.Errorf("row %d: empty task ID", r.No)
			}
			if r.State == "" {
				r.State = store.RowPending
			}
			if !validRowState(r.State) {
				return fmt.Errorf("row %d: invalid state %q", r.No, r.State)
			}
			cells, err := json.Marshal(r.Values)
			if err != nil {
				return fmt.Errorf("row %d: encode values: %w", r.No, err)
			}
			args = append(args, r.TaskID, r.No, r.SheetRow, string(cells), r.State, r.Output, r.Error,
				r.ErrorClass, r.Attempts, r.LatencyMS, r.Cached)
		}
		query := `INSERT INTO rows (` + rowColumns + `) VALUES ` + placeholders(len(part), rowColumnCount) +
			` ON CONFLICT (task_id, no) DO NOTHING`
		if len(part) == rowsPerStatement {
			if full == nil {
				if full, err = tx.PrepareContext(ctx, query); err != nil {
					return fmt.Errorf("prepare insert: %w", err)
				}
				defer full.Close()
			}
			_, err = full.ExecContext(ctx, args...)
		} else {
			_, err = tx.ExecContext(ctx, query, args...)
		}
		if isForeignKeyErr(err) {
			return fmt.Errorf("task %s: %w", part[0].TaskID, store.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// ListRows returns rows of a task in row order.
func (s *Store) ListRows(ctx context.Context, p store.ListRowsParams) ([]store.Row, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	rows, err := s.read.QueryContext(ctx, `SELECT task_id, no, sheet_row, cells, state, output, error,
			error_class, attempts, latency_ms, cached
		FROM rows
		WHERE task_id = ? AND no >= ? AND (? = 0 OR no <= ?)
		ORDER BY no LIMIT ?`, p.TaskID, p.FromNo, p.ToNo, p.ToNo, limit)
	if err != nil {
		return nil, fmt.Errorf("list rows of %s: %w", p.TaskID, err)
	}
	defer rows.Close()
	var out []store.Row
	for rows.Next() {
		var (
			r     store.Row
			cells string
		)
		if err := rows.Scan(&r.TaskID, &r.No, &r.SheetRow, &cells, &r.State, &r.Output, &r.Error,
			&r.ErrorClass, &r.Attempts, &r.LatencyMS, &r.Cached); err != nil {
			return nil, fmt.Errorf("list rows of %s: %w", p.TaskID, err)
		}
		if err := json.Unmarshal([]byte(cells), &r.Values); err != nil {
			return nil, fmt.Errorf("list rows of %s: decode row %d: %w", p.TaskID, r.No, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list rows of %s: %w", p.TaskID, err)
	}
	return out, nil
}

// SaveRowResult records a row's result in one UPDATE that is fenced on the
// batch's state and attempt and on the row's range and current state.
func (s *Store) SaveRowResult(ctx context.Context, p store.SaveRowResultParams) error {
	what := fmt.Sprintf("save result of row %s/%d (batch %d, attempt %d)", p.TaskID, p.RowNo, p.BatchNo, p.Attempt)
	r := p.Result
	if r.State == "" {
		r.State = store.RowPending
	}
	if !validRowState(r.State) {
		return fmt.Errorf("%s: invalid state %q", what, r.State)
	}
	res, err := s.write.ExecContext(ctx, `UPDATE rows SET
			state = ?, output = ?, error = ?, error_class = ?, attempts = ?, latency_ms = ?, cached = ?, updated_at = ?
		WHERE task_id = ? AND no = ? AND state NOT IN ('SUCCEEDED', 'SKIPPED')
			AND EXISTS (SELECT 1 FROM batches b
				WHERE b.task_id = rows.task_id AND b.no = ? AND b.state = 'RUNNING' AND b.attempt = ?
					AND rows.no BETWEEN b.first_row AND b.first_row + b.row_count - 1)`,
		r.State, r.Output, r.Error, r.ErrorClass, r.Attempts, r.LatencyMS, r.Cached, millis(p.Now),
		p.TaskID, p.RowNo, p.BatchNo, p.Attempt)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: batch not held by this attempt, row outside it, or row already final: %w", what, store.ErrConflict)
	}
	return nil
}

// GetCached returns the cached output for key and whether there was one.
func (s *Store) GetCached(ctx context.Context, key string) (string, bool, error) {
	var out string
	err := s.read.QueryRowContext(ctx, `SELECT output FROM cache WHERE key = ?`, key).Scan(&out)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("get cached %s: %w", key, err)
	}
	return out, true, nil
}

// PutCached stores output under key unless the key is already cached.
func (s *Store) PutCached(ctx context.Context, key, output string) error {
	_, err := s.write.ExecContext(ctx, `INSERT INTO cache (key, output, created_at) VALUES (?, ?, ?)
		ON CONFLICT (key) DO NOTHING`, key, output, s.clock.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("put cached %s: %w", key, err)
	}
	return nil
}
