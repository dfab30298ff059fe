package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/sqlitedb"
	"github.com/batchgen/batchgen/internal/store"
)

const (
	// rowColumns are bound per row by PutRows.
	rowColumns = `task_id, no, sheet_row, cells, state, output, error, error_class, attempts, latency_ms, cached,
		provider, input_tokens, output_tokens, cached_input_tokens, fresh`
	// rowColumnCount is the number of columns in rowColumns.
	rowColumnCount = 16
	// rowsPerStatement keeps one multi-row INSERT well under SQLite's
	// 32,766 bound variables.
	rowsPerStatement = 500
	// rowsPerTx bounds how long a large split holds the write connection,
	// so that workers' claims and results interleave with it.
	rowsPerTx = 10_000
)

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
			if !r.State.Valid() {
				return fmt.Errorf("row %d: invalid state %q", r.No, r.State)
			}
			cells, err := json.Marshal(r.Values)
			if err != nil {
				return fmt.Errorf("row %d: encode values: %w", r.No, err)
			}
			args = append(args, r.TaskID, r.No, r.SheetRow, string(cells), r.State, r.Output, r.Error,
				r.ErrorClass, r.Attempts, r.LatencyMS, r.Cached, r.Provider, r.InputTokens, r.OutputTokens, r.CachedInputTokens, r.Fresh)
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
	// The upper bound is a plain range on the primary key, never
	// "(? = 0 OR no <= ?)": SQLite cannot bound an index range with an OR,
	// so that form scanned every row after FromNo for each batch (quadratic
	// in the task's size: 30% of a 100,000-row run's CPU).
	to := p.ToNo
	if to <= 0 {
		to = math.MaxInt64
	}
	st, err := s.readStmts.Get(ctx, listRowsSQL)
	if err != nil {
		return nil, fmt.Errorf("list rows of %s: %w", p.TaskID, err)
	}
	rows, err := st.QueryContext(ctx, p.TaskID, p.FromNo, to, limit)
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
			&r.ErrorClass, &r.Attempts, &r.LatencyMS, &r.Cached,
			&r.Provider, &r.InputTokens, &r.OutputTokens, &r.CachedInputTokens, &r.Fresh); err != nil {
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

// listRowsSQL reads rows ?2..?3 of task ?1, at most ?4 (-1: all).
const listRowsSQL = `SELECT task_id, no, sheet_row, cells, state, output, error,
		error_class, attempts, latency_ms, cached, provider, input_tokens, output_tokens, cached_input_tokens, fresh
	FROM rows
	WHERE task_id = ? AND no BETWEEN ? AND ?
	ORDER BY no LIMIT ?`

// SaveRowResults writes a group in one transaction: it checks the batch's
// fence and row range, updates each row that is still PENDING, adds the
// group's final rows to the batch's saved counts, inserts the cache entries
// that are new, and reads the task's state for TaskCancelled. Any refused
// row rolls the whole group back.
func (s *Store) SaveRowResults(ctx context.Context, p store.SaveRowResultsParams) (store.SaveRowResultsResult, error) {
	what := fmt.Sprintf("save %d row results of batch %s/%d (attempt %d)", len(p.Rows), p.TaskID, p.BatchNo, p.Attempt)
	if err := p.Validate(); err != nil {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: %w", what, err)
	}
	if len(p.Rows) == 0 && len(p.Cache) == 0 {
		return store.SaveRowResultsResult{}, nil
	}
	st, err := s.saveStmts(ctx, p.Cache)
	if err != nil {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: %w", what, err)
	}
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback()
	var (
		state, taskState         string
		attempt, first, rowCount int
	)
	err = sqlitedb.InTx(ctx, tx, st.fence).QueryRowContext(ctx, p.TaskID, p.BatchNo).Scan(&state, &attempt, &first, &rowCount, &taskState)
	if errors.Is(err, sql.ErrNoRows) {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: no such batch: %w", what, store.ErrNotFound)
	}
	if err != nil {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: read batch: %w", what, err)
	}
	if state != string(store.BatchRunning) || attempt != p.Attempt {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: batch is %s under attempt %d: %w", what, state, attempt, store.ErrConflict)
	}
	if len(p.Rows) > 0 {
		stmt := sqlitedb.InTx(ctx, tx, st.update)
		for _, w := range p.Rows {
			if w.RowNo < first || w.RowNo >= first+rowCount {
				return store.SaveRowResultsResult{}, fmt.Errorf("%s: row %d is not in the batch (rows %d..%d): %w",
					what, w.RowNo, first, first+rowCount-1, store.ErrConflict)
			}
			r := w.Result
			if r.State == "" {
				r.State = store.RowPending
			}
			res, err := stmt.ExecContext(ctx, r.State, r.Output, r.Error, r.ErrorClass, r.Attempts, r.LatencyMS, r.Cached,
				r.Provider, r.InputTokens, r.OutputTokens, r.CachedInputTokens, millis(p.Now), p.TaskID, w.RowNo)
			if err != nil {
				return store.SaveRowResultsResult{}, fmt.Errorf("%s: row %d: %w", what, w.RowNo, err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return store.SaveRowResultsResult{}, fmt.Errorf("%s: row %d: %w", what, w.RowNo, err)
			} else if n == 0 {
				// Rows become final all at once per save, so a final row
				// holding exactly this write means this very save was
				// applied before (a retry of one whose answer was lost):
				// it is that save, and nothing is written or counted again.
				var echo int
				err := tx.QueryRowContext(ctx, `SELECT count(*) FROM rows WHERE task_id = ? AND no = ? AND state = ? AND output = ?
					AND attempts = ? AND updated_at = ?`, p.TaskID, w.RowNo, r.State, r.Output, r.Attempts, millis(p.Now)).Scan(&echo)
				if err != nil {
					return store.SaveRowResultsResult{}, fmt.Errorf("%s: row %d: %w", what, w.RowNo, err)
				}
				if echo > 0 {
					return store.SaveRowResultsResult{TaskCancelled: taskState == string(store.TaskCancelled)}, nil
				}
				return store.SaveRowResultsResult{}, fmt.Errorf("%s: row %d is missing or already final: %w", what, w.RowNo, store.ErrConflict)
			}
		}
		if c := p.Saved(); c.Done() > 0 {
			if _, err := sqlitedb.InTx(ctx, tx, st.count).ExecContext(ctx, c.Succeeded, c.Failed, c.Skipped, p.TaskID, p.BatchNo); err != nil {
				return store.SaveRowResultsResult{}, fmt.Errorf("%s: count saved rows: %w", what, err)
			}
		}
	}
	if err := s.putCached(ctx, tx, st.cache, p.Cache); err != nil {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: commit: %w", what, err)
	}
	return store.SaveRowResultsResult{TaskCancelled: taskState == string(store.TaskCancelled)}, nil
}

// saveStatements are SaveRowResults' prepared statements; cache is nil
// when the group caches nothing.
type saveStatements struct{ fence, update, count, cache *sql.Stmt }

// saveStmts prepares (once) the statements of a group that caches entries,
// before its transaction begins (see inTx).
func (s *Store) saveStmts(ctx context.Context, entries []store.CacheEntry) (saveStatements, error) {
	var st saveStatements
	var err error
	if st.fence, err = s.writeStmts.Get(ctx, `SELECT b.state, b.attempt, b.first_row, b.row_count, t.state
		FROM batches b JOIN tasks t ON t.id = b.task_id
		WHERE b.task_id = ? AND b.no = ?`); err != nil {
		return st, fmt.Errorf("read batch: %w", err)
	}
	if st.update, err = s.writeStmts.Get(ctx, `UPDATE rows SET
				state = ?, output = ?, error = ?, error_class = ?, attempts = ?, latency_ms = ?, cached = ?,
				provider = ?, input_tokens = ?, output_tokens = ?, cached_input_tokens = ?, updated_at = ?
			WHERE task_id = ? AND no = ? AND state = 'PENDING'`); err != nil {
		return st, fmt.Errorf("update rows: %w", err)
	}
	if st.count, err = s.writeStmts.Get(ctx, `UPDATE batches SET
				saved_succeeded = saved_succeeded + ?, saved_failed = saved_failed + ?, saved_skipped = saved_skipped + ?
			WHERE task_id = ? AND no = ?`); err != nil {
		return st, fmt.Errorf("count saved rows: %w", err)
	}
	if n := len(distinctKeys(entries)); n > 0 {
		// The text depends only on n, which a group bounds (store.MaxSaveRows).
		if st.cache, err = s.writeStmts.Get(ctx, `INSERT INTO cache (key, output, created_at, expires_at) VALUES `+placeholders(n, 4)+putCachedSQL); err != nil {
			return st, fmt.Errorf("put %d cache entries: %w", n, err)
		}
	}
	return st, nil
}

// distinctKeys returns entries without the repeats of a key, the first
// one kept: one statement may write a row once, and the first output stays.
func distinctKeys(entries []store.CacheEntry) []store.CacheEntry {
	seen := make(map[string]bool, len(entries))
	out := make([]store.CacheEntry, 0, len(entries))
	for _, c := range entries {
		if !seen[c.Key] {
			seen[c.Key] = true
			out = append(out, c)
		}
	}
	return out
}

// putCachedSQL inserts cache entries whose keys are not cached, and
// replaces those whose entry has expired; a live entry keeps its output.
const putCachedSQL = ` ON CONFLICT (key) DO UPDATE SET
	output = excluded.output, created_at = excluded.created_at, expires_at = excluded.expires_at
	WHERE cache.expires_at IS NOT NULL AND cache.expires_at <= excluded.created_at`

// expiresAt is when an entry cached at now stops being reused (NULL for
// never).
func (s *Store) expiresAt(now time.Time) sql.NullInt64 {
	if s.cacheTTL < 0 {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: now.Add(s.cacheTTL).UnixMilli(), Valid: true}
}

// putCached writes the cache entries of a group (see putCachedSQL) with
// ins, the statement saveStmts prepared for them.
func (s *Store) putCached(ctx context.Context, tx *sql.Tx, ins *sql.Stmt, entries []store.CacheEntry) error {
	entries = distinctKeys(entries)
	if len(entries) == 0 {
		return nil
	}
	now := s.clock.Now()
	args := make([]any, 0, 4*len(entries))
	for _, c := range entries {
		args = append(args, c.Key, c.Output, now.UnixMilli(), s.expiresAt(now))
	}
	if _, err := sqlitedb.InTx(ctx, tx, ins).ExecContext(ctx, args...); err != nil {
		return fmt.Errorf("put %d cache entries: %w", len(entries), err)
	}
	return nil
}

// GetCached returns the cached outputs of keys, in one query per
// cacheKeysPerQuery keys.
func (s *Store) GetCached(ctx context.Context, keys []string) (map[string]string, error) {
	out := make(map[string]string, len(keys))
	for start := 0; start < len(keys); start += cacheKeysPerQuery {
		part := keys[start:min(start+cacheKeysPerQuery, len(keys))]
		args := make([]any, len(part))
		for i, k := range part {
			args[i] = k
		}
		args = append(args, s.clock.Now().UnixMilli())
		rows, err := s.read.QueryContext(ctx, `SELECT key, output FROM cache WHERE key IN (`+
			strings.TrimSuffix(strings.Repeat("?, ", len(part)), ", ")+`) AND (expires_at IS NULL OR expires_at > ?)`, args...)
		if err != nil {
			return nil, fmt.Errorf("get %d cached outputs: %w", len(part), err)
		}
		for rows.Next() {
			var k, o string
			if err := rows.Scan(&k, &o); err != nil {
				rows.Close()
				return nil, fmt.Errorf("get cached outputs: %w", err)
			}
			out[k] = o
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("get cached outputs: %w", err)
		}
	}
	return out, nil
}

// cacheKeysPerQuery bounds the bound variables of one GetCached query.
const cacheKeysPerQuery = 500

// PutCached stores output under key unless the key is already cached (and
// not expired).
func (s *Store) PutCached(ctx context.Context, key, output string) error {
	now := s.clock.Now()
	_, err := s.write.ExecContext(ctx, `INSERT INTO cache (key, output, created_at, expires_at) VALUES (?, ?, ?, ?)`+putCachedSQL,
		key, output, now.UnixMilli(), s.expiresAt(now))
	if err != nil {
		return fmt.Errorf("put cached %s: %w", key, err)
	}
	return nil
}
