package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/batchgen/batchgen/internal/store"
)

var _ store.Allowances = (*Store)(nil)

// TakeAllowance implements store.Allowances. SQLite has one writer at a
// time, so the read and the write of one transaction cannot interleave
// with another taking.
func (s *Store) TakeAllowance(ctx context.Context, taskID string, limit, need, want float64) (taken, left float64, err error) {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("take allowance of task %s: %w", taskID, err)
	}
	defer tx.Rollback()
	var capped float64
	err = tx.QueryRowContext(ctx, `SELECT cap, left FROM allowances WHERE task_id = ?`, taskID).Scan(&capped, &left)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && capped != limit) {
		return 0, 0, fmt.Errorf("take allowance of task %s: no ledger under a cap of %v: %w", taskID, limit, store.ErrNotFound)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("take allowance of task %s: %w", taskID, err)
	}
	if left < need {
		return 0, left, nil
	}
	taken = min(want, left)
	if _, err := tx.ExecContext(ctx, `UPDATE allowances SET left = left - ? WHERE task_id = ?`, taken, taskID); err != nil {
		return 0, 0, fmt.Errorf("take allowance of task %s: %w", taskID, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, fmt.Errorf("take allowance of task %s: %w", taskID, err)
	}
	return taken, left - taken, nil
}

// OpenAllowance implements store.Allowances.
func (s *Store) OpenAllowance(ctx context.Context, taskID string, limit, spent float64) error {
	_, err := s.write.ExecContext(ctx, `INSERT INTO allowances (task_id, cap, left) VALUES (?, ?, ?)
		ON CONFLICT (task_id) DO UPDATE SET cap = excluded.cap, left = excluded.left WHERE allowances.cap <> excluded.cap`,
		taskID, limit, limit-spent)
	if err != nil {
		return fmt.Errorf("open allowance of task %s: %w", taskID, err)
	}
	return nil
}

// ReturnAllowance implements store.Allowances.
func (s *Store) ReturnAllowance(ctx context.Context, taskID string, limit, amount float64) error {
	_, err := s.write.ExecContext(ctx, `UPDATE allowances SET left = left + ? WHERE task_id = ? AND cap = ?`, amount, taskID, limit)
	if err != nil {
		return fmt.Errorf("return allowance of task %s: %w", taskID, err)
	}
	return nil
}
