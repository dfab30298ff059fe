-- The principal a task belongs to; only its owner sees it through the API.
-- Tasks from before owners were recorded came from the CLI, whose principal
-- is "local".
ALTER TABLE tasks ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';

-- ListTasksByOwner: one owner's tasks newest first, without reading others'.
CREATE INDEX tasks_by_owner ON tasks (owner, created_at DESC, id DESC);
