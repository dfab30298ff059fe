// Package sqlitequeue is a small at-least-once queue in a SQLite database,
// for the embedded runtime. It shares the task store's file (pass
// sqlitestore's (*Store).DB()), so one data directory holds everything.
//
// Its semantics are those of SQS, so that the pipeline behaves the same on
// both runtimes and both adapters pass queuetest: every delivery gets a new
// random receipt (a stale receipt makes ChangeVisibility return
// queue.ErrNotFound and Delete do nothing), a receive count, a visibility
// timeout, delayed sends, and a dead-letter state that a message enters,
// instead of being delivered, once it has been received MaxReceive times.
//
// Why not maragu.dev/goqite: v0.4 exposes neither the receive count (the
// pipeline grades its retry delays by it) nor a dead-letter queue, and it
// reads the wall clock directly, so visibility and delays cannot be tested
// with a fake clock. This package is about as small and takes a clock.Clock.
package sqlitequeue

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/sqlitedb"
)

var (
	_ queue.Queue       = (*Queue)(nil)
	_ queue.DeadLetters = (*Queue)(nil)
	_ queue.Backlog     = (*Queue)(nil)
)

//go:embed migrations/*.sql
var migrations embed.FS

// component names this package's row in the schema_version table it shares
// with the task store.
const component = "sqlitequeue"

// messagesPerStatement keeps one multi-row INSERT under SQLite's
// bound-variable limit.
const messagesPerStatement = 500

// Config configures a Queue.
type Config struct {
	// Name tells apart queues on one database. Defaults to "default".
	Name string
	// Visibility is how long a received message stays hidden before it is
	// delivered again. Defaults to 30s.
	Visibility time.Duration
	// MaxReceive is how many times a message is delivered; when it would
	// become visible after that, it is dead-lettered instead. Defaults to 5.
	MaxReceive int
	// Clock tells the time for visibility and delays. Defaults to clock.Real{}.
	Clock clock.Clock
}

// Queue is a SQLite-backed queue. Its methods are safe for concurrent use,
// also by several processes on one database file.
type Queue struct {
	db         *sql.DB
	name       string
	visibility time.Duration
	maxReceive int
	clock      clock.Clock
	// stmts holds the statements of receive and delete, prepared once: a
	// run receives and deletes once a batch, and parsing the turn query
	// each time was a twentieth of a 100,000-row run's CPU.
	stmts *sqlitedb.StmtCache
}

// New creates the queue's table in db if needed and returns the queue named
// cfg.Name. db should serialise writes (sqlitestore's DB() is a one-connection
// pool with IMMEDIATE transactions); the Queue does not close it.
func New(db *sql.DB, cfg Config) (*Queue, error) {
	if cfg.Visibility < 0 || cfg.MaxReceive < 0 {
		return nil, fmt.Errorf("new queue %q: negative Visibility or MaxReceive", cfg.Name)
	}
	if cfg.Name == "" {
		cfg.Name = "default"
	}
	if cfg.Visibility == 0 {
		cfg.Visibility = 30 * time.Second
	}
	if cfg.MaxReceive == 0 {
		cfg.MaxReceive = 5
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if err := sqlitedb.Migrate(context.Background(), db, component, migrations); err != nil {
		return nil, fmt.Errorf("new queue %q: %w", cfg.Name, err)
	}
	return &Queue{db: db, name: cfg.Name, visibility: cfg.Visibility, maxReceive: cfg.MaxReceive, clock: cfg.Clock,
		stmts: sqlitedb.NewStmtCache(db)}, nil
}

// Send enqueues msgs in one transaction, so either all or none are sent.
func (q *Queue) Send(ctx context.Context, msgs []queue.Outgoing) error {
	if len(msgs) == 0 {
		return nil
	}
	what := fmt.Sprintf("send %d messages to queue %s", len(msgs), q.name)
	for i, m := range msgs {
		if m.Delay < 0 {
			return fmt.Errorf("%s: message %d: negative delay %v", what, i, m.Delay)
		}
	}
	now := q.clock.Now().UnixMilli()
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback()
	for start := 0; start < len(msgs); start += messagesPerStatement {
		part := msgs[start:min(start+messagesPerStatement, len(msgs))]
		args := make([]any, 0, 4*len(part))
		for _, m := range part {
			body := m.Body
			if body == nil {
				body = []byte{} // nil binds as NULL
			}
			args = append(args, q.name, body, now+m.Delay.Milliseconds(), now, m.Group)
		}
		tuple := "(?, ?, ?, NULL, 0, 0, ?, ?)"
		if _, err := tx.ExecContext(ctx, `INSERT INTO queue_messages
			(queue, body, visible_at, receipt, receive_count, dead, created_at, grp) VALUES `+
			strings.TrimSuffix(strings.Repeat(tuple+", ", len(part)), ", "), args...); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", what, err)
	}
	return nil
}

// buryExhausted dead-letters the visible messages that have been received
// MaxReceive times already, so they are never delivered again.
func (q *Queue) buryExhausted(ctx context.Context, tx *sql.Tx, bury *sql.Stmt, now int64) error {
	_, err := sqlitedb.InTx(ctx, tx, bury).ExecContext(ctx, q.name, now, q.maxReceive)
	if err != nil {
		return fmt.Errorf("dead-letter exhausted messages: %w", err)
	}
	return nil
}

// Receive delivers up to max visible messages, hiding them for the
// visibility timeout. It serves the groups (queue.Outgoing.Group) that have
// messages visible in turn: the group served least recently first, then
// the others, round and round, each time with its oldest visible message.
// So a group with a backlog of thousands takes every other message while a
// second group has work waiting, instead of all of them until its backlog
// is gone. With one group, the oldest visible messages come first. It never
// waits for messages to arrive.
func (q *Queue) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	return q.receive(ctx, max, nil)
}

// ReceiveOutside is Receive of the messages of groups other than busy
// ones: for a worker kept for principals that have nothing in flight, so
// that a newcomer's first batch starts at once instead of after one of the
// batches in hand (pipeline.LocalWorkers).
func (q *Queue) ReceiveOutside(ctx context.Context, max int, busy []string) ([]queue.Delivery, error) {
	return q.receive(ctx, max, busy)
}

func (q *Queue) receive(ctx context.Context, max int, busy []string) ([]queue.Delivery, error) {
	what := "receive from queue " + q.name
	st, err := q.receiveStmts(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return q.deliveries(ctx, what, max, func(tx *sql.Tx, now int64) (*sql.Rows, error) {
		groups, err := q.groupsInTurn(ctx, sqlitedb.InTx(ctx, tx, st.groups), now)
		if err != nil {
			return nil, err
		}
		groups = slices.DeleteFunc(groups, func(g string) bool { return slices.Contains(busy, g) })
		hide := now + q.visibility.Milliseconds()
		if len(groups) == 0 {
			return sqlitedb.InTx(ctx, tx, st.none).QueryContext(ctx)
		}
		if len(groups) == 1 && len(busy) == 0 {
			// One group (a run's own queue): no turns to take.
			return sqlitedb.InTx(ctx, tx, st.oldest).QueryContext(ctx, hide, q.name, now, max)
		}
		ids, served, err := q.takeTurns(ctx, sqlitedb.InTx(ctx, tx, st.heads), now, groups, max)
		if err != nil {
			return nil, err
		}
		// The turns: the groups served, in the order of their last message
		// taken, move behind every other group.
		turn := sqlitedb.InTx(ctx, tx, st.turn)
		for _, grp := range served {
			if _, err := turn.ExecContext(ctx, q.name, grp); err != nil {
				return nil, fmt.Errorf("record the turn of group %q: %w", grp, err)
			}
		}
		return sqlitedb.InTx(ctx, tx, st.take).QueryContext(ctx, hide, jsonIDs(ids))
	})
}

// The statements of a receive, prepared once (Queue.stmts).
const (
	buryExhaustedSQL = `UPDATE queue_messages SET dead = 1, receipt = NULL
		WHERE queue = ? AND dead = 0 AND visible_at <= ? AND receive_count >= ?`
	// noMessagesSQL answers a receive with nothing to deliver in the
	// shape of a delivery.
	noMessagesSQL = `SELECT id, receipt, body, receive_count, grp FROM queue_messages WHERE 0`
	// takeOldestSQL delivers the oldest visible messages: a queue with one
	// group has no turns to take.
	takeOldestSQL = `UPDATE queue_messages SET
			receive_count = receive_count + 1,
			receipt = lower(hex(randomblob(16))),
			visible_at = ?
		WHERE id IN (SELECT id FROM queue_messages
			WHERE queue = ? AND dead = 0 AND visible_at <= ?
			ORDER BY visible_at, id LIMIT ?)
		RETURNING id, receipt, body, receive_count, grp`
	// groupsInTurnSQL: see groupsInTurn.
	groupsInTurnSQL = `
WITH RECURSIVE groups(grp) AS (
	SELECT MIN(grp) FROM queue_messages WHERE queue = ?1 AND dead = 0
	UNION ALL
	SELECT (SELECT MIN(grp) FROM queue_messages WHERE queue = ?1 AND dead = 0 AND grp > groups.grp)
	FROM groups WHERE groups.grp IS NOT NULL
),
heads AS (
	SELECT grp, (SELECT id FROM queue_messages m
		WHERE m.queue = ?1 AND m.dead = 0 AND m.grp = groups.grp AND m.visible_at <= ?2
		ORDER BY m.visible_at, m.id LIMIT 1) AS id
	FROM groups WHERE grp IS NOT NULL
)
SELECT heads.grp FROM heads
LEFT JOIN queue_groups g ON g.queue = ?1 AND g.grp = heads.grp
WHERE heads.id IS NOT NULL
ORDER BY COALESCE(g.turn, 0), heads.id`
	// groupHeadsSQL lists a group's visible messages, oldest first.
	groupHeadsSQL = `SELECT id FROM queue_messages
			WHERE queue = ? AND dead = 0 AND grp = ? AND visible_at <= ?
			ORDER BY visible_at, id LIMIT ?`
	// recordTurnSQL moves a group served behind every other.
	recordTurnSQL = `INSERT INTO queue_groups (queue, grp, turn)
			VALUES (?1, ?2, (SELECT COALESCE(MAX(turn), 0) + 1 FROM queue_groups WHERE queue = ?1))
			ON CONFLICT (queue, grp) DO UPDATE SET turn = excluded.turn`
	// takeIDsSQL delivers the messages of a JSON array of ids.
	takeIDsSQL = `UPDATE queue_messages SET
			receive_count = receive_count + 1,
			receipt = lower(hex(randomblob(16))),
			visible_at = ?
		WHERE id IN (SELECT value FROM json_each(?))
		RETURNING id, receipt, body, receive_count, grp`
)

// receiveStmtSet is the prepared statements of a receive.
type receiveStmtSet struct{ groups, none, oldest, heads, turn, take *sql.Stmt }

// receiveStmts gets a receive's statements. They must be had before its
// transaction begins (sqlitedb.InTx).
func (q *Queue) receiveStmts(ctx context.Context) (receiveStmtSet, error) {
	var st receiveStmtSet
	for _, s := range []struct {
		to    **sql.Stmt
		query string
	}{
		{&st.groups, groupsInTurnSQL}, {&st.none, noMessagesSQL}, {&st.oldest, takeOldestSQL},
		{&st.heads, groupHeadsSQL}, {&st.turn, recordTurnSQL}, {&st.take, takeIDsSQL},
	} {
		var err error
		if *s.to, err = q.stmts.Get(ctx, s.query); err != nil {
			return receiveStmtSet{}, err
		}
	}
	return st, nil
}

// groupsInTurn lists the groups with messages visible at now, the one
// served least recently (or never) first, ties to the older message. The
// groups come from a skip scan of the group index: a few lookups a group,
// however many messages wait.
func (q *Queue) groupsInTurn(ctx context.Context, groupsStmt *sql.Stmt, now int64) ([]string, error) {
	rows, err := groupsStmt.QueryContext(ctx, q.name, now)
	if err != nil {
		return nil, fmt.Errorf("list the groups waiting: %w", err)
	}
	defer rows.Close()
	var groups []string
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			return nil, fmt.Errorf("list the groups waiting: %w", err)
		}
		groups = append(groups, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the groups waiting: %w", err)
	}
	return groups, nil
}

// takeTurns picks up to max visible messages from groups in turn (groups
// in the order they are due), and returns their ids and the groups served,
// in the order of the last message each gave.
func (q *Queue) takeTurns(ctx context.Context, headsStmt *sql.Stmt, now int64, groups []string, max int) ([]any, []string, error) {
	heads := make([][]int64, len(groups))
	for i, g := range groups {
		rows, err := headsStmt.QueryContext(ctx, q.name, g, now, max)
		if err != nil {
			return nil, nil, fmt.Errorf("read group %q: %w", g, err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, nil, fmt.Errorf("read group %q: %w", g, err)
			}
			heads[i] = append(heads[i], id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("read group %q: %w", g, err)
		}
	}
	var ids []any
	last := make([]int, len(groups)) // position of each group's last pick, 0 for none
	for taken := true; taken && len(ids) < max; {
		taken = false
		for i := range groups {
			if len(ids) == max || len(heads[i]) == 0 {
				continue
			}
			ids = append(ids, heads[i][0])
			heads[i] = heads[i][1:]
			last[i] = len(ids)
			taken = true
		}
	}
	order := make([]int, 0, len(groups))
	for i := range groups {
		if last[i] > 0 {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(last[a], last[b]) })
	served := make([]string, len(order))
	for k, i := range order {
		served[k] = groups[i]
	}
	return ids, served, nil
}

// jsonIDs is ids as a JSON array, for one statement whatever their number.
func jsonIDs(ids []any) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// deliveries reads up to max deliveries with query in one transaction,
// after the messages that used up their receives are buried: the shared
// frame of Receive and ListDead.
func (q *Queue) deliveries(ctx context.Context, what string, max int, query func(tx *sql.Tx, now int64) (*sql.Rows, error)) ([]queue.Delivery, error) {
	if max < 1 {
		return nil, fmt.Errorf("%s: max %d, want at least 1", what, max)
	}
	bury, err := q.stmts.Get(ctx, buryExhaustedSQL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	now := q.clock.Now().UnixMilli()
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback()
	if err := q.buryExhausted(ctx, tx, bury, now); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	rows, err := query(tx, now)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ds, err := scanDeliveries(rows)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("%s: commit: %w", what, err)
	}
	return ds, nil
}

// scanDeliveries reads id, receipt token, body, receive count, group rows, closes
// them and returns the deliveries ordered by message ID.
func scanDeliveries(rows *sql.Rows) ([]queue.Delivery, error) {
	defer rows.Close()
	type delivery struct {
		id int64
		d  queue.Delivery
	}
	var out []delivery
	for rows.Next() {
		var (
			id    int64
			token sql.NullString
			d     queue.Delivery
		)
		if err := rows.Scan(&id, &token, &d.Body, &d.ReceiveCount, &d.Group); err != nil {
			return nil, err
		}
		d.ID = strconv.FormatInt(id, 10)
		if token.Valid {
			d.Receipt = d.ID + "." + token.String
		}
		out = append(out, delivery{id, d})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b delivery) int { return cmp.Compare(a.id, b.id) })
	ds := make([]queue.Delivery, len(out))
	for i, o := range out {
		ds[i] = o.d
	}
	return ds, nil
}

// parseReceipt splits a receipt into the message ID and delivery token.
func parseReceipt(receipt string) (int64, string, error) {
	idText, token, ok := strings.Cut(receipt, ".")
	id, err := strconv.ParseInt(idText, 10, 64)
	if !ok || err != nil || token == "" {
		return 0, "", fmt.Errorf("malformed receipt %q", receipt)
	}
	return id, token, nil
}

// Delete removes the message if receipt is its current delivery. A stale
// receipt (deleted, or redelivered since) changes nothing and is not an error.
func (q *Queue) Delete(ctx context.Context, receipt string) error {
	id, token, err := parseReceipt(receipt)
	if err != nil {
		return fmt.Errorf("delete from queue %s: %w", q.name, err)
	}
	del, err := q.stmts.Get(ctx, `DELETE FROM queue_messages WHERE id = ? AND queue = ? AND receipt = ?`)
	if err == nil {
		_, err = del.ExecContext(ctx, id, q.name, token)
	}
	if err != nil {
		return fmt.Errorf("delete message %d from queue %s: %w", id, q.name, err)
	}
	return nil
}

// ChangeVisibility makes the message of receipt visible again after d (0: at
// once). It returns queue.ErrNotFound when receipt is not the message's
// current delivery.
func (q *Queue) ChangeVisibility(ctx context.Context, receipt string, d time.Duration) error {
	id, token, err := parseReceipt(receipt)
	if err != nil {
		return fmt.Errorf("change visibility in queue %s: %w", q.name, err)
	}
	what := fmt.Sprintf("change visibility of message %d in queue %s to %v", id, q.name, d)
	if d < 0 {
		return fmt.Errorf("%s: negative duration", what)
	}
	n, err := sqlitedb.Exec(ctx, q.db, `UPDATE queue_messages SET visible_at = ?
		WHERE id = ? AND queue = ? AND receipt = ? AND dead = 0`,
		q.clock.Now().Add(d).UnixMilli(), id, q.name, token)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: receipt is not the current delivery: %w", what, queue.ErrNotFound)
	}
	return nil
}

// ListDead returns up to max dead-lettered messages, oldest first, without
// removing them. It first dead-letters exhausted messages that are due, so
// the list does not depend on whether anyone has called Receive since.
// The deliveries carry no receipt.
func (q *Queue) ListDead(ctx context.Context, max int) ([]queue.Delivery, error) {
	return q.deliveries(ctx, "list dead letters of queue "+q.name, max, func(tx *sql.Tx, _ int64) (*sql.Rows, error) {
		return tx.QueryContext(ctx, `SELECT id, NULL, body, receive_count, grp FROM queue_messages
		WHERE queue = ? AND dead = 1 ORDER BY id LIMIT ?`, q.name, max)
	})
}

// Redrive makes every dead-lettered message visible again with a receive
// count of zero and returns how many it moved.
func (q *Queue) Redrive(ctx context.Context) (int, error) {
	n, err := sqlitedb.Exec(ctx, q.db, `UPDATE queue_messages
		SET dead = 0, receive_count = 0, receipt = NULL, visible_at = ?
		WHERE queue = ? AND dead = 1`, q.clock.Now().UnixMilli(), q.name)
	if err != nil {
		return 0, fmt.Errorf("redrive queue %s: %w", q.name, err)
	}
	return int(n), nil
}

// Backlog counts the live messages visible now and the age of the oldest
// live message (dead letters are not work waiting).
func (q *Queue) Backlog(ctx context.Context) (int, time.Duration, error) {
	now := q.clock.Now().UnixMilli()
	var visible int
	var oldest sql.NullInt64
	err := q.db.QueryRowContext(ctx, `SELECT
		COALESCE(SUM(CASE WHEN visible_at <= ? THEN 1 ELSE 0 END), 0), MIN(created_at)
		FROM queue_messages WHERE queue = ? AND dead = 0`, now, q.name).Scan(&visible, &oldest)
	if err != nil {
		return 0, 0, fmt.Errorf("backlog of queue %s: %w", q.name, err)
	}
	var age time.Duration
	if oldest.Valid {
		age = time.Duration(max(now-oldest.Int64, 0)) * time.Millisecond
	}
	return visible, age, nil
}
