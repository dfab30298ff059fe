package sqlitestore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

var _ store.ProviderBatches = (*Store)(nil)

// RecordProviderBatch implements store.ProviderBatches.
func (s *Store) RecordProviderBatch(ctx context.Context, taskID string, e store.ProviderBatch) error {
	lines, err := json.Marshal(e.Lines)
	if err != nil {
		return fmt.Errorf("record provider batch %s of task %s: %w", e.Key, taskID, err)
	}
	if e.Lines == nil {
		lines = []byte("[]")
	}
	_, err = s.write.ExecContext(ctx, `INSERT INTO provider_batches (task_id, key, kind, job, lines, submitted)
		VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (task_id, key, kind, job) DO NOTHING`,
		taskID, e.Key, e.Kind(), e.Job, string(lines), e.Submitted.UnixMilli())
	if err != nil {
		return fmt.Errorf("record provider batch %s of task %s: %w", e.Key, taskID, err)
	}
	return nil
}

// ListProviderBatches implements store.ProviderBatches.
func (s *Store) ListProviderBatches(ctx context.Context, taskID string) ([]store.ProviderBatch, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT key, kind, job, lines, submitted FROM provider_batches
		WHERE task_id = ? ORDER BY submitted, key, CASE kind WHEN 'intent' THEN 0 WHEN 'ended' THEN 2 ELSE 1 END, job`, taskID)
	if err != nil {
		return nil, fmt.Errorf("list provider batches of task %s: %w", taskID, err)
	}
	defer rows.Close()
	var out []store.ProviderBatch
	for rows.Next() {
		var e store.ProviderBatch
		var kind, lines string
		var submitted int64
		if err := rows.Scan(&e.Key, &kind, &e.Job, &lines, &submitted); err != nil {
			return nil, fmt.Errorf("list provider batches of task %s: %w", taskID, err)
		}
		if err := json.Unmarshal([]byte(lines), &e.Lines); err != nil {
			return nil, fmt.Errorf("list provider batches of task %s: batch %s: lines: %w", taskID, e.Key, err)
		}
		if len(e.Lines) == 0 {
			e.Lines = nil
		}
		e.Intent, e.Gone, e.Ended = kind == "intent", kind == "gone", kind == "ended"
		e.Submitted = time.UnixMilli(submitted).UTC()
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list provider batches of task %s: %w", taskID, err)
	}
	return out, nil
}
