-- The export generation: bumped when a finished task is reopened (retried),
-- so each export round is started once under its own name.
ALTER TABLE tasks ADD COLUMN export_gen INTEGER NOT NULL DEFAULT 0;
