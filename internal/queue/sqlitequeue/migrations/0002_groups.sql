-- The group (tenant) of each message: Receive serves the groups with work
-- waiting in turn, as an SQS fair queue shares its consumers among
-- MessageGroupIds. '' is the group of messages sent without one.
ALTER TABLE queue_messages ADD COLUMN grp TEXT NOT NULL DEFAULT '';

-- Receive: the groups (a skip scan) and each one's oldest visible message.
CREATE INDEX queue_messages_group ON queue_messages (queue, dead, grp, visible_at, id);

-- When each group was last served: turn grows by one with every message
-- Receive takes, so the group with the smallest turn has waited longest.
CREATE TABLE queue_groups (
    queue TEXT NOT NULL,
    grp   TEXT NOT NULL,
    turn  INTEGER NOT NULL,
    PRIMARY KEY (queue, grp)
) STRICT, WITHOUT ROWID;
