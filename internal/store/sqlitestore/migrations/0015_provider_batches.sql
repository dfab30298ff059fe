-- The journal of the provider batches each economy task sent (store.ProviderBatches): one row per
-- entry, so that writers never rewrite each other's. kind is intent, job or gone; lines is a JSON
-- array of the batch's line ids; submitted is in Unix milliseconds.
CREATE TABLE provider_batches (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id   TEXT NOT NULL,
    key       TEXT NOT NULL,
    kind      TEXT NOT NULL,
    job       TEXT NOT NULL,
    lines     TEXT NOT NULL,
    submitted INTEGER NOT NULL,
    UNIQUE (task_id, key, kind, job)
);
