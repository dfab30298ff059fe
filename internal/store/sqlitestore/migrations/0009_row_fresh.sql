-- A row the user flagged or cleared in a result sent back in asks for a new
-- answer: the result cache is not read for it.
ALTER TABLE rows ADD COLUMN fresh INTEGER NOT NULL DEFAULT 0;
