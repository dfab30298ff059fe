-- Tasks, their batches and rows, and the result cache.
-- Times are INTEGER Unix milliseconds (UTC); NULL stands for the zero time.
-- STRICT tables so that a wrongly typed bind fails loudly instead of being stored.

CREATE TABLE tasks (
    id             TEXT PRIMARY KEY,
    state          TEXT NOT NULL,
    spec           TEXT NOT NULL, -- JSON of store.TaskSpec
    source         TEXT NOT NULL,
    sheet          TEXT NOT NULL,
    header         TEXT NOT NULL, -- JSON array of the input column names
    rows_total     INTEGER NOT NULL,
    batches_total  INTEGER NOT NULL,
    batches_done   INTEGER NOT NULL,
    rows_succeeded INTEGER NOT NULL,
    rows_failed    INTEGER NOT NULL,
    rows_skipped   INTEGER NOT NULL,
    result_key     TEXT NOT NULL,
    error          TEXT NOT NULL,
    created_at     INTEGER,
    updated_at     INTEGER,
    finished_at    INTEGER
) STRICT;

-- ListTasks: newest first without sorting the whole table.
CREATE INDEX tasks_by_created ON tasks (created_at DESC, id DESC);

CREATE TABLE batches (
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    no          INTEGER NOT NULL,
    first_row   INTEGER NOT NULL,
    row_count   INTEGER NOT NULL,
    state       TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_until INTEGER,
    owner       TEXT NOT NULL,
    last_error  TEXT NOT NULL,
    created_at  INTEGER,
    updated_at  INTEGER,
    PRIMARY KEY (task_id, no)
) STRICT;

-- The sweeper's sparse index: finished batches, the vast majority over
-- time, are not in it, so finding stale PENDING batches and expired leases
-- never scans finished work.
CREATE INDEX batches_open ON batches (state, lease_until, updated_at) WHERE state <> 'DONE';
CREATE INDEX batches_open_updated ON batches (updated_at) WHERE state <> 'DONE';

CREATE TABLE rows (
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    no          INTEGER NOT NULL,
    sheet_row   INTEGER NOT NULL,
    cells       TEXT NOT NULL, -- JSON array of the input cells
    state       TEXT NOT NULL,
    output      TEXT NOT NULL,
    error       TEXT NOT NULL,
    error_class TEXT NOT NULL,
    attempts    INTEGER NOT NULL,
    latency_ms  INTEGER NOT NULL,
    cached      INTEGER NOT NULL,
    updated_at  INTEGER,
    PRIMARY KEY (task_id, no)
) STRICT;

CREATE TABLE cache (
    key        TEXT PRIMARY KEY,
    output     TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
