-- What became of the rows of a result sent back in (JSON, store.RerunCounts); '' for any other task.
ALTER TABLE tasks ADD COLUMN rerun TEXT NOT NULL DEFAULT '';
