package sqlitequeue_test

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/queue/queuetest"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// openDB opens a task store on a new file, as the embedded runtime does, and
// returns its shared database and path.
func openDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "batchgen.db")
	s, err := sqlitestore.Open(path, sqlitestore.Options{})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s.DB(), path
}

// newQueue returns a queue on a new database.
func newQueue(t *testing.T, cfg sqlitequeue.Config) *sqlitequeue.Queue {
	t.Helper()
	db, _ := openDB(t)
	q, err := sqlitequeue.New(db, cfg)
	if err != nil {
		t.Fatalf("new queue: %v", err)
	}
	return q
}

func TestConformance(t *testing.T) {
	queuetest.Run(t, func(t *testing.T, cfg queuetest.Config) queue.Queue {
		return newQueue(t, sqlitequeue.Config{Visibility: cfg.Visibility, MaxReceive: cfg.MaxReceive})
	})
}

var start = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeQueue returns a queue on a new database driven by a fake clock.
func fakeQueue(t *testing.T, maxReceive int) (*sqlitequeue.Queue, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(start)
	return newQueue(t, sqlitequeue.Config{Name: "work", Visibility: 30 * time.Second, MaxReceive: maxReceive, Clock: clk}), clk
}

// send sends bodies and fails the test on an error.
func send(t *testing.T, q queue.Queue, bodies ...string) {
	t.Helper()
	var msgs []queue.Outgoing
	for _, b := range bodies {
		msgs = append(msgs, queue.Outgoing{Body: []byte(b)})
	}
	if err := q.Send(t.Context(), msgs); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// bodies receives up to 10 messages and returns their bodies and receive counts.
func bodies(t *testing.T, q queue.Queue) []string {
	t.Helper()
	ds, err := q.Receive(t.Context(), 10)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%s#%d", d.Body, d.ReceiveCount))
	}
	return out
}

// receiveOne receives exactly one message or fails the test.
func receiveOne(t *testing.T, q queue.Queue) queue.Delivery {
	t.Helper()
	ds, err := q.Receive(t.Context(), 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive = %d messages, %v; want 1", len(ds), err)
	}
	return ds[0]
}

// TestTimeline walks one queue through visibility, delays, retries and the
// dead-letter state on a fake clock, checking what Receive returns at each step.
func TestTimeline(t *testing.T) {
	q, clk := fakeQueue(t, 3)
	ctx := t.Context()
	if err := q.Send(ctx, []queue.Outgoing{
		{Body: []byte("a")},
		{Body: []byte("b")},
		{Body: []byte("delayed"), Delay: 45 * time.Second},
	}); err != nil {
		t.Fatalf("send: %v", err)
	}
	steps := []struct {
		name    string
		advance time.Duration
		want    []string // body#receiveCount, in send order
	}{
		{"first delivery, oldest first", 0, []string{"a#1", "b#1"}},
		{"in flight", 29 * time.Second, nil},
		{"visibility expired", time.Second, []string{"a#2", "b#2"}},
		{"delay not over", 14 * time.Second, nil},
		{"delay over", time.Second, []string{"delayed#1"}},
		{"third delivery", 15 * time.Second, []string{"a#3", "b#3"}},
		{"delayed again", 15 * time.Second, []string{"delayed#2"}},
		{"exhausted messages are dead-lettered, not delivered", 15 * time.Second, nil},
		{"last delivery of the delayed one", time.Hour, []string{"delayed#3"}},
		{"all dead", time.Hour, nil},
	}
	for _, st := range steps {
		clk.Advance(st.advance)
		if d := cmp.Diff(st.want, bodies(t, q)); d != "" {
			t.Fatalf("%s: received (-want +got):\n%s", st.name, d)
		}
	}

	dead, err := q.ListDead(ctx, 10)
	if err != nil {
		t.Fatalf("list dead: %v", err)
	}
	var got []string
	for _, d := range dead {
		got = append(got, fmt.Sprintf("%s#%d", d.Body, d.ReceiveCount))
		if d.Receipt != "" {
			t.Errorf("dead letter %s has receipt %q, want none", d.ID, d.Receipt)
		}
	}
	if d := cmp.Diff([]string{"a#3", "b#3", "delayed#3"}, got); d != "" {
		t.Errorf("dead letters (-want +got):\n%s", d)
	}
	if dead, err := q.ListDead(ctx, 2); err != nil || len(dead) != 2 {
		t.Errorf("ListDead(2) = %d messages, %v; want 2", len(dead), err)
	}

	n, err := q.Redrive(ctx)
	if err != nil || n != 3 {
		t.Fatalf("redrive = %d, %v; want 3", n, err)
	}
	if d := cmp.Diff([]string{"a#1", "b#1", "delayed#1"}, bodies(t, q)); d != "" {
		t.Errorf("after redrive (-want +got):\n%s", d)
	}
	if n, err := q.Redrive(ctx); err != nil || n != 0 {
		t.Errorf("second redrive = %d, %v; want 0", n, err)
	}
}

// TestListDeadWithoutReceive checks that exhausted messages show as dead
// even when no worker is receiving (the alarm must not depend on workers).
func TestListDeadWithoutReceive(t *testing.T) {
	q, clk := fakeQueue(t, 1)
	send(t, q, "poison")
	receiveOne(t, q)
	dead, err := q.ListDead(t.Context(), 10)
	if err != nil || len(dead) != 0 {
		t.Fatalf("ListDead while in flight = %d, %v; want none", len(dead), err)
	}
	clk.Advance(30 * time.Second)
	dead, err = q.ListDead(t.Context(), 10)
	if err != nil || len(dead) != 1 || string(dead[0].Body) != "poison" {
		t.Fatalf("ListDead after the visibility timeout = %+v, %v; want poison", dead, err)
	}
}

// TestStaleReceipt checks that a receipt from an earlier delivery neither
// deletes nor moves the message delivered since.
func TestStaleReceipt(t *testing.T) {
	q, clk := fakeQueue(t, 5)
	ctx := t.Context()
	send(t, q, "m")
	first := receiveOne(t, q)
	clk.Advance(30 * time.Second)
	second := receiveOne(t, q)
	if err := q.Delete(ctx, first.Receipt); err != nil {
		t.Fatalf("delete with a stale receipt: %v", err)
	}
	if err := q.ChangeVisibility(ctx, first.Receipt, 0); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("change visibility with a stale receipt: error = %v, want ErrNotFound", err)
	}
	if got := bodies(t, q); got != nil {
		t.Fatalf("stale ChangeVisibility made the message visible: %v", got)
	}
	// The current delivery is intact.
	if err := q.ChangeVisibility(ctx, second.Receipt, 0); err != nil {
		t.Fatalf("change visibility with the current receipt: %v", err)
	}
	if d := cmp.Diff([]string{"m#3"}, bodies(t, q)); d != "" {
		t.Errorf("after the stale delete (-want +got):\n%s", d)
	}
}

func TestChangeVisibility(t *testing.T) {
	tests := []struct {
		name    string
		d       time.Duration
		advance time.Duration
		want    []string
	}{
		{"zero shows at once", 0, 0, []string{"m#2"}},
		{"shorter than the timeout", 5 * time.Second, 5 * time.Second, []string{"m#2"}},
		{"longer holds past the timeout", 5 * time.Minute, 4 * time.Minute, nil},
		{"longer ends", 5 * time.Minute, 5 * time.Minute, []string{"m#2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, clk := fakeQueue(t, 5)
			send(t, q, "m")
			d := receiveOne(t, q)
			if err := q.ChangeVisibility(t.Context(), d.Receipt, tt.d); err != nil {
				t.Fatalf("change visibility: %v", err)
			}
			clk.Advance(tt.advance)
			if diff := cmp.Diff(tt.want, bodies(t, q)); diff != "" {
				t.Errorf("received (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNamedQueuesAreSeparate(t *testing.T) {
	db, _ := openDB(t)
	clk := clock.NewFake(start)
	work, err := sqlitequeue.New(db, sqlitequeue.Config{Name: "work", Clock: clk})
	if err != nil {
		t.Fatalf("new work queue: %v", err)
	}
	export, err := sqlitequeue.New(db, sqlitequeue.Config{Name: "export", Clock: clk})
	if err != nil {
		t.Fatalf("new export queue: %v", err)
	}
	send(t, work, "w")
	send(t, export, "e")
	if d := cmp.Diff([]string{"w#1"}, bodies(t, work)); d != "" {
		t.Errorf("work queue (-want +got):\n%s", d)
	}
	d := receiveOne(t, export)
	if err := work.ChangeVisibility(t.Context(), d.Receipt, 0); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("another queue's receipt: error = %v, want ErrNotFound", err)
	}
}

// TestMessagesSurviveReopen checks that messages are kept in the file: a
// restarted process finds the in-flight ones again after their timeout.
func TestMessagesSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "batchgen.db")
	clk := clock.NewFake(start)
	for i, want := range [][]string{{"a#1", "b#1"}, {"a#2", "b#2"}} {
		s, err := sqlitestore.Open(path, sqlitestore.Options{})
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		q, err := sqlitequeue.New(s.DB(), sqlitequeue.Config{Clock: clk})
		if err != nil {
			t.Fatalf("new queue %d: %v", i, err)
		}
		if i == 0 {
			send(t, q, "a", "b")
		}
		if d := cmp.Diff(want, bodies(t, q)); d != "" {
			t.Errorf("run %d received (-want +got):\n%s", i, d)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
		clk.Advance(time.Minute)
	}
}

func TestInvalidInput(t *testing.T) {
	q, _ := fakeQueue(t, 5)
	ctx := t.Context()
	db, _ := openDB(t)
	tests := []struct {
		name string
		call func() error
	}{
		{"negative visibility", func() error {
			_, err := sqlitequeue.New(db, sqlitequeue.Config{Visibility: -time.Second})
			return err
		}},
		{"negative max receive", func() error {
			_, err := sqlitequeue.New(db, sqlitequeue.Config{MaxReceive: -1})
			return err
		}},
		{"negative delay", func() error { return q.Send(ctx, []queue.Outgoing{{Body: []byte("x"), Delay: -time.Second}}) }},
		{"receive zero", func() error { _, err := q.Receive(ctx, 0); return err }},
		{"list dead zero", func() error { _, err := q.ListDead(ctx, 0); return err }},
		{"malformed receipt on delete", func() error { return q.Delete(ctx, "not-a-receipt") }},
		{"malformed receipt on change", func() error { return q.ChangeVisibility(ctx, "12.", 0) }},
		{"negative visibility change", func() error { return q.ChangeVisibility(ctx, "1.abc", -time.Second) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); err == nil {
				t.Error("succeeded, want an error")
			}
		})
	}
	// Nothing above sent a message.
	if got := bodies(t, q); got != nil {
		t.Errorf("queue holds %v after refused calls, want nothing", got)
	}
}

func TestEmptyAndNilBodies(t *testing.T) {
	q, _ := fakeQueue(t, 5)
	if err := q.Send(t.Context(), []queue.Outgoing{{Body: nil}, {Body: []byte{}}}); err != nil {
		t.Fatalf("send: %v", err)
	}
	if d := cmp.Diff([]string{"#1", "#1"}, bodies(t, q)); d != "" {
		t.Errorf("received (-want +got):\n%s", d)
	}
	if err := q.Send(t.Context(), nil); err != nil {
		t.Errorf("send nothing: %v", err)
	}
}

// benchQueue is a queue on a fresh database, closed with the benchmark.
func benchQueue(b *testing.B) *sqlitequeue.Queue {
	b.Helper()
	s, err := sqlitestore.Open(filepath.Join(b.TempDir(), "batchgen.db"), sqlitestore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	q, err := sqlitequeue.New(s.DB(), sqlitequeue.Config{})
	if err != nil {
		b.Fatal(err)
	}
	return q
}

func BenchmarkSendReceiveDelete(b *testing.B) {
	q := benchQueue(b)
	ctx := b.Context()
	msgs := make([]queue.Outgoing, 10)
	for i := range msgs {
		msgs[i] = queue.Outgoing{Body: []byte(`{"task_id":"t","batch_no":1}`)}
	}
	for b.Loop() {
		if err := q.Send(ctx, msgs); err != nil {
			b.Fatal(err)
		}
		ds, err := q.Receive(ctx, 10)
		if err != nil || len(ds) != 10 {
			b.Fatalf("receive = %d, %v", len(ds), err)
		}
		for _, d := range ds {
			if err := q.Delete(ctx, d.Receipt); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestBacklog: the depth counts what a worker could receive now; the age is
// the oldest live message's, in flight or delayed included; dead letters
// are not backlog.
func TestBacklog(t *testing.T) {
	t.Parallel()
	q, clk := fakeQueue(t, 1)
	ctx := t.Context()
	type backlog struct {
		Visible int
		Oldest  time.Duration
	}
	check := func(step string, want backlog) {
		t.Helper()
		v, o, err := q.Backlog(ctx)
		if err != nil {
			t.Fatalf("%s: Backlog: %v", step, err)
		}
		if diff := cmp.Diff(want, backlog{v, o}); diff != "" {
			t.Errorf("%s: backlog (-want +got):\n%s", step, diff)
		}
	}
	check("empty", backlog{})
	if err := q.Send(ctx, []queue.Outgoing{{Body: []byte("a")}, {Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(5 * time.Second)
	if err := q.Send(ctx, []queue.Outgoing{{Body: []byte("c"), Delay: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	check("two visible, one delayed", backlog{Visible: 2, Oldest: 5 * time.Second})
	ds, err := q.Receive(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %v, %v", ds, err)
	}
	clk.Advance(time.Second)
	check("one in flight", backlog{Visible: 1, Oldest: 6 * time.Second})
	clk.Advance(time.Minute) // a's visibility ends; with MaxReceive 1 it is buried at the next receive
	if _, err := q.Receive(ctx, 10); err != nil {
		t.Fatal(err)
	}
	check("a dead-lettered, b and c in flight", backlog{Visible: 0, Oldest: 66 * time.Second})
}

// BenchmarkReceiveFromBacklog: one receive and delete while 20,000 messages
// of two groups wait (a 200,000-row task in batches of 10 beside a small
// one): taking turns must cost a few index lookups a group, not a scan of
// the backlog.
func BenchmarkReceiveFromBacklog(b *testing.B) {
	q := benchQueue(b)
	ctx := b.Context()
	var msgs []queue.Outgoing
	for i := range 20_000 {
		group := "big"
		if i%1000 == 0 {
			group = "small"
		}
		msgs = append(msgs, queue.Outgoing{Body: []byte(`{"task_id":"t","batch_no":1}`), Group: group})
	}
	if err := q.Send(ctx, msgs); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		ds, err := q.Receive(ctx, 1)
		if err != nil || len(ds) != 1 {
			b.Fatalf("receive = %d, %v", len(ds), err)
		}
		if err := q.Send(ctx, []queue.Outgoing{{Body: ds[0].Body, Group: ds[0].Group}}); err != nil {
			b.Fatal(err)
		}
		if err := q.Delete(ctx, ds[0].Receipt); err != nil {
			b.Fatal(err)
		}
	}
}
