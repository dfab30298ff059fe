-- Parked batches leave the sweeper's index: the leftover open batches of a
-- cancelled or finished task would otherwise fill the oldest end of it
-- forever and starve live work of the sweeper's attention. The index also
-- carries the listing's full order (updated_at, task_id, no) so that a
-- sweep pages through it with a cursor.
ALTER TABLE batches ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
DROP INDEX batches_open;
DROP INDEX batches_open_updated;
CREATE INDEX batches_open_updated ON batches (updated_at, task_id, no) WHERE state <> 'DONE' AND parked = 0;
