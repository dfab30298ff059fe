-- The fleet ledger of capped tasks (store.Allowances): the cap it was opened under and what is left.
CREATE TABLE allowances (
    task_id TEXT PRIMARY KEY,
    cap     REAL NOT NULL,
    left    REAL NOT NULL
);
