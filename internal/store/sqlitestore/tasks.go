package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/sqlitedb"
	"github.com/batchgen/batchgen/internal/store"
)

const taskColumns = `id, state, spec, source, sheet, header, rows_total, batches_total, batches_done,
	rows_succeeded, rows_failed, rows_skipped, result_key, error, created_at, updated_at, finished_at, encoding, export_gen, owner,
	input_tokens, output_tokens, cached_input_tokens, usage_by_provider, delimiter, rerun, max_cost, mode, deadline, sample`

// providerUsage is one provider's sums in the tasks.usage_by_provider JSON
// object; the names are the ones the SQL that maintains it uses.
type providerUsage struct {
	InputTokens       int64 `json:"input_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens"`
}

// encodeUsage encodes per-provider sums for tasks.usage_by_provider,
// leaving out labels without tokens.
func encodeUsage(byProvider map[string]store.Usage) (string, error) {
	m := make(map[string]providerUsage, len(byProvider))
	for label, u := range byProvider {
		if u != (store.Usage{}) {
			m[label] = providerUsage(u)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encode usage by provider: %w", err)
	}
	return string(b), nil
}

// decodeUsage reads tasks.usage_by_provider; an empty object gives nil.
func decodeUsage(s string) (map[string]store.Usage, error) {
	var m map[string]providerUsage
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]store.Usage, len(m))
	for label, u := range m {
		out[label] = store.Usage(u)
	}
	return out, nil
}

// scanTask reads one row of taskColumns.
func scanTask(sc scanner) (store.Task, error) {
	var (
		t                          store.Task
		spec, header, usage, rerun string
		created, updated, finished sql.NullInt64
		deadline                   int64
	)
	err := sc.Scan(&t.ID, &t.State, &spec, &t.Source, &t.Sheet, &header, &t.RowsTotal, &t.BatchesTotal,
		&t.BatchesDone, &t.RowsSucceeded, &t.RowsFailed, &t.RowsSkipped, &t.ResultKey, &t.Error,
		&created, &updated, &finished, &t.Encoding, &t.ExportGen, &t.Owner,
		&t.Usage.InputTokens, &t.Usage.OutputTokens, &t.Usage.CachedInputTokens, &usage, &t.Delimiter, &rerun, &t.MaxCost, &t.Mode, &deadline, &t.Sample)
	if err != nil {
		return store.Task{}, err
	}
	if t.UsageByProvider, err = decodeUsage(usage); err != nil {
		return store.Task{}, fmt.Errorf("decode usage by provider of task %s: %w", t.ID, err)
	}
	if err := json.Unmarshal([]byte(spec), &t.Spec); err != nil {
		return store.Task{}, fmt.Errorf("decode spec of task %s: %w", t.ID, err)
	}
	if err := json.Unmarshal([]byte(header), &t.Header); err != nil {
		return store.Task{}, fmt.Errorf("decode header of task %s: %w", t.ID, err)
	}
	if rerun != "" {
		if err := json.Unmarshal([]byte(rerun), &t.Rerun); err != nil {
			return store.Task{}, fmt.Errorf("decode rerun counts of task %s: %w", t.ID, err)
		}
	}
	t.CreatedAt, t.UpdatedAt, t.FinishedAt = fromMillis(created), fromMillis(updated), fromMillis(finished)
	t.Deadline = fromMillis(sql.NullInt64{Int64: deadline, Valid: deadline != 0})
	return t, nil
}

// CreateTask inserts t, or returns ErrConflict if its ID exists. An empty
// State is stored as PENDING.
func (s *Store) CreateTask(ctx context.Context, t store.Task) error {
	if t.ID == "" {
		return errors.New("create task: empty ID")
	}
	if t.State == "" {
		t.State = store.TaskPending
	}
	spec, err := json.Marshal(t.Spec)
	if err != nil {
		return fmt.Errorf("create task %s: encode spec: %w", t.ID, err)
	}
	header, err := json.Marshal(t.Header)
	if err != nil {
		return fmt.Errorf("create task %s: encode header: %w", t.ID, err)
	}
	usage, err := encodeUsage(t.UsageByProvider)
	if err != nil {
		return fmt.Errorf("create task %s: %w", t.ID, err)
	}
	rerun := ""
	if t.Rerun != nil {
		b, err := json.Marshal(t.Rerun)
		if err != nil {
			return fmt.Errorf("create task %s: encode rerun counts: %w", t.ID, err)
		}
		rerun = string(b)
	}
	n, err := sqlitedb.Exec(ctx, s.write, `INSERT INTO tasks (`+taskColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING`,
		t.ID, t.State, string(spec), t.Source, t.Sheet, string(header), t.RowsTotal, t.BatchesTotal,
		t.BatchesDone, t.RowsSucceeded, t.RowsFailed, t.RowsSkipped, t.ResultKey, t.Error,
		millis(t.CreatedAt), millis(t.UpdatedAt), millis(t.FinishedAt), t.Encoding, t.ExportGen, t.Owner,
		t.Usage.InputTokens, t.Usage.OutputTokens, t.Usage.CachedInputTokens, usage, t.Delimiter, rerun, t.MaxCost, t.Mode, deadlineMillis(t.Deadline), t.Sample)
	if err != nil {
		return fmt.Errorf("create task %s: %w", t.ID, err)
	}
	if n == 0 {
		if cur, err := s.GetTask(ctx, t.ID); err == nil && store.SameCreate(cur, t) {
			return nil // this very create, repeated
		}
		return fmt.Errorf("create task %s: %w", t.ID, store.ErrConflict)
	}
	return nil
}

// SetTerms implements store.Store.
func (s *Store) SetTerms(ctx context.Context, taskID string, terms store.Terms) (store.Task, error) {
	t, err := scanTask(s.write.QueryRowContext(ctx, `UPDATE tasks SET max_cost = ?, mode = ?, deadline = ?, sample = ? WHERE id = ? RETURNING `+taskColumns,
		terms.MaxCost, terms.Mode, deadlineMillis(terms.Deadline), terms.Sample, taskID))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Task{}, fmt.Errorf("set terms of task %s: %w", taskID, store.ErrNotFound)
	}
	if err != nil {
		return store.Task{}, fmt.Errorf("set terms of task %s: %w", taskID, err)
	}
	return t, nil
}

// deadlineMillis is a deadline as its column keeps it: 0 for none.
func deadlineMillis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// getTaskSQL reads one task by its id.
const getTaskSQL = `SELECT ` + taskColumns + ` FROM tasks WHERE id = ?`

// GetTask returns the task or ErrNotFound.
func (s *Store) GetTask(ctx context.Context, id string) (store.Task, error) {
	// Prepared once: a batch reads its task several times.
	st, err := s.readStmts.Get(ctx, getTaskSQL)
	if err != nil {
		return store.Task{}, fmt.Errorf("get task %s: %w", id, err)
	}
	t, err := scanTask(st.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Task{}, fmt.Errorf("get task %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return store.Task{}, fmt.Errorf("get task %s: %w", id, err)
	}
	return t, nil
}

// ListTasks returns tasks newest first, at most limit (0: all).
func (s *Store) ListTasks(ctx context.Context, limit int) ([]store.Task, error) {
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	tasks, err := sqlitedb.QueryAll(ctx, s.read, scanTask, `SELECT `+taskColumns+` FROM tasks
		ORDER BY created_at DESC, id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return tasks, nil
}

// ListTasksByOwner returns p.Owner's tasks newest first (ties by id,
// descending) after p.After, from the tasks_by_owner index.
func (s *Store) ListTasksByOwner(ctx context.Context, p store.ListTasksByOwnerParams) ([]store.Task, error) {
	if p.Owner == "" {
		return nil, errors.New("list tasks by owner: empty owner")
	}
	limit := p.Limit
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	q := `SELECT ` + taskColumns + ` FROM tasks WHERE owner = ?`
	args := []any{p.Owner}
	if p.After.ID != "" {
		// Row values compare lexicographically: older, or as old with a
		// smaller id. NULL created_at (the zero time) sorts as -1.
		q += ` AND (coalesce(created_at, -1), id) < (?, ?)`
		after := millis(p.After.CreatedAt)
		if !after.Valid {
			after.Int64 = -1
		}
		args = append(args, after.Int64, p.After.ID)
	}
	tasks, err := sqlitedb.QueryAll(ctx, s.read, scanTask, q+` ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		err = fmt.Errorf("list tasks of %s: %w", p.Owner, err)
	}
	return tasks, err
}

// TransitionTask changes the task's state if it is in one of p.From, in one
// conditional UPDATE, and returns the updated task.
func (s *Store) TransitionTask(ctx context.Context, p store.TransitionTaskParams) (store.Task, error) {
	if err := p.Check(); err != nil {
		return store.Task{}, err
	}
	what := p.String()
	if len(p.From) > 0 {
		bump := 0
		if p.NextExportGen {
			bump = 1
		}
		// A recount, when given, replaces the counts and sums; NULLs keep
		// them.
		var in, out, cached, byProvider, succeeded, failed, skipped any
		if rc := p.Recount; rc != nil {
			enc, err := encodeUsage(rc.ByProvider)
			if err != nil {
				return store.Task{}, fmt.Errorf("%s: %w", what, err)
			}
			in, out, cached, byProvider = rc.Total.InputTokens, rc.Total.OutputTokens, rc.Total.CachedInputTokens, enc
			succeeded, failed, skipped = rc.Rows.Succeeded, rc.Rows.Failed, rc.Rows.Skipped
		}
		args := []any{p.To, millis(p.Now), p.Error, p.ResultKey, p.To.Final(), millis(p.Now), bump, in, out, cached, byProvider,
			succeeded, failed, skipped, p.ID}
		for _, st := range p.From {
			args = append(args, st)
		}
		t, err := scanTask(s.write.QueryRowContext(ctx, `UPDATE tasks SET
				state = ?,
				updated_at = ?,
				error = coalesce(nullif(?, ''), error),
				result_key = coalesce(nullif(?, ''), result_key),
				finished_at = CASE WHEN ? THEN ? ELSE finished_at END,
				export_gen = export_gen + ?,
				input_tokens = coalesce(?, input_tokens),
				output_tokens = coalesce(?, output_tokens),
				cached_input_tokens = coalesce(?, cached_input_tokens),
				usage_by_provider = coalesce(?, usage_by_provider),
				rows_succeeded = coalesce(?, rows_succeeded),
				rows_failed = coalesce(?, rows_failed),
				rows_skipped = coalesce(?, rows_skipped)
			WHERE id = ? AND state IN (`+strings.TrimSuffix(strings.Repeat("?, ", len(p.From)), ", ")+`)
			RETURNING `+taskColumns, args...))
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return store.Task{}, fmt.Errorf("%s: %w", what, err)
		}
	}
	// Nothing changed: tell a missing task from one in another state.
	cur, err := s.GetTask(ctx, p.ID)
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	return store.Task{}, fmt.Errorf("%s: task is %s, not one of %v: %w", what, cur.State, p.From, store.ErrConflict)
}
