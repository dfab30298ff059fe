-- The task's spending cap (store.Task.MaxCost), in the price table's currency; 0 for none.
ALTER TABLE tasks ADD COLUMN max_cost REAL NOT NULL DEFAULT 0;
