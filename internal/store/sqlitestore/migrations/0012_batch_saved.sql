-- The rows of a batch that hold a final result (store.Batch.Saved), kept by
-- SaveRowResults group by group, so that progress moves with each group
-- saved instead of a whole batch at a time.
ALTER TABLE batches ADD COLUMN saved_succeeded INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN saved_failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN saved_skipped INTEGER NOT NULL DEFAULT 0;
-- Batches stored before: count their rows once.
UPDATE batches SET
	saved_succeeded = (SELECT count(*) FROM rows r WHERE r.task_id = batches.task_id
		AND r.no BETWEEN batches.first_row AND batches.first_row + batches.row_count - 1 AND r.state = 'SUCCEEDED'),
	saved_failed = (SELECT count(*) FROM rows r WHERE r.task_id = batches.task_id
		AND r.no BETWEEN batches.first_row AND batches.first_row + batches.row_count - 1 AND r.state = 'FAILED'),
	saved_skipped = (SELECT count(*) FROM rows r WHERE r.task_id = batches.task_id
		AND r.no BETWEEN batches.first_row AND batches.first_row + batches.row_count - 1 AND r.state = 'SKIPPED');
