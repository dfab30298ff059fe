-- The task's mode (store.Terms.Mode: '' online, economy, auto) and its deadline in Unix milliseconds (0 for none).
ALTER TABLE tasks ADD COLUMN mode TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN deadline INTEGER NOT NULL DEFAULT 0;
