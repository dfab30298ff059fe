-- Which provider answered a row and the tokens its call was billed for, and
-- the task's sums of them, for the estimated cost of a task.
ALTER TABLE rows ADD COLUMN provider TEXT NOT NULL DEFAULT '';
ALTER TABLE rows ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rows ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rows ADD COLUMN cached_input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN cached_input_tokens INTEGER NOT NULL DEFAULT 0;
