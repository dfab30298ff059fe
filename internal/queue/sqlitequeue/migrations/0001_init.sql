-- Messages of every named queue on this database. Times are INTEGER Unix
-- milliseconds. A dead-lettered message stays in place with dead = 1, so a
-- redrive is one UPDATE and nothing is copied between tables.

CREATE TABLE queue_messages (
    id            INTEGER PRIMARY KEY AUTOINCREMENT, -- never reused: it is the message ID
    queue         TEXT NOT NULL,
    body          BLOB NOT NULL,
    visible_at    INTEGER NOT NULL,
    receipt       TEXT,             -- token of the current delivery; NULL until received
    receive_count INTEGER NOT NULL,
    dead          INTEGER NOT NULL,
    created_at    INTEGER NOT NULL
) STRICT;

-- Receive: the oldest visible live messages of one queue, in index order.
CREATE INDEX queue_messages_visible ON queue_messages (queue, dead, visible_at, id);
