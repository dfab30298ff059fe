-- Rows a quote asked to be answered before the task starts (store.Terms.Sample); 0 for none.
ALTER TABLE tasks ADD COLUMN sample INTEGER NOT NULL DEFAULT 0;
