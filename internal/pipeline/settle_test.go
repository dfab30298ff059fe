package pipeline_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// settled is a Settlement with its error reduced to its text, for cmp.
type settled struct {
	Action pipeline.SettleAction
	Delay  time.Duration
	Err    string
}

func project(s pipeline.Settlement) settled {
	p := settled{Action: s.Action, Delay: s.Delay}
	if s.Err != nil {
		p.Err = s.Err.Error()
	}
	return p
}

// TestSettle is the one table of what becomes of a processed message.
func TestSettle(t *testing.T) {
	t.Parallel()
	transient := errors.New("load task: throttled")
	poison := &pipeline.PoisonError{Err: errors.New("task x does not exist")}
	tests := []struct {
		name string
		out  pipeline.Outcome
		want settled
	}{
		{"done", pipeline.Outcome{Ack: true}, settled{Action: pipeline.SettleDelete}},
		{"ack wins over a stray delay", pipeline.Outcome{Ack: true, RetryAfter: time.Minute}, settled{Action: pipeline.SettleDelete}},
		{"released after round 2", pipeline.Outcome{RetryAfter: 60 * time.Second}, settled{Action: pipeline.SettleRetry, Delay: 60 * time.Second}},
		{"released at once (shutdown)", pipeline.Outcome{}, settled{Action: pipeline.SettleRetry}},
		{"transient failure", pipeline.Outcome{Err: transient}, settled{Action: pipeline.SettleRetry, Delay: 7 * time.Second, Err: transient.Error()}},
		{"handed back with progress", pipeline.Outcome{HandedBack: true, Progress: 3}, settled{Action: pipeline.SettleResend}},
		{"handed back without progress", pipeline.Outcome{HandedBack: true}, settled{Action: pipeline.SettleRetry}},
		{"handed back starved by the quota", pipeline.Outcome{HandedBack: true, QuotaStarved: true}, settled{Action: pipeline.SettleResend}},
		{"error wins over a hand-back", pipeline.Outcome{HandedBack: true, Progress: 3, Err: transient}, settled{Action: pipeline.SettleRetry, Delay: 7 * time.Second, Err: transient.Error()}},
		{"poison", pipeline.Outcome{Err: poison}, settled{Action: pipeline.SettleDeadLetter, Err: poison.Error()}},
		{"wrapped poison", pipeline.Outcome{Err: errors.Join(errors.New("handler"), poison)}, settled{Action: pipeline.SettleDeadLetter, Err: "handler\n" + poison.Error()}},
	}
	g := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{ErrorDelay: 7 * time.Second}).gen
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, project(g.Settle(tc.out))); diff != "" {
				t.Errorf("Settle(%+v) mismatch (-want +got):\n%s", tc.out, diff)
			}
		})
	}
	t.Run("default error delay", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
		g := pipeline.NewGenerator(e.store, sim.New(sim.Config{}), e.signal, pipeline.GeneratorConfig{})
		if got := g.Settle(pipeline.Outcome{Err: transient}).Delay; got != pipeline.DefaultErrorDelay {
			t.Errorf("transient failure retried after %v, want %v", got, pipeline.DefaultErrorDelay)
		}
	})
}

// TestSettlementApply carries out each action on the embedded queue.
func TestSettlementApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	newQueue := func(t *testing.T) (*sqlitequeue.Queue, *clock.Fake) {
		t.Helper()
		st, err := sqlitestore.Open(filepath.Join(t.TempDir(), "db.sqlite"), sqlitestore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: "settle", Visibility: time.Hour, MaxReceive: 5, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Send(ctx, []queue.Outgoing{{Body: []byte("batch 1")}}); err != nil {
			t.Fatal(err)
		}
		return q, clk
	}
	receive := func(t *testing.T, q *sqlitequeue.Queue) []queue.Delivery {
		t.Helper()
		ds, err := q.Receive(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	message := func(d queue.Delivery) pipeline.Message {
		return pipeline.Message{ID: d.ID, Receipt: d.Receipt, Body: d.Body, ReceiveCount: d.ReceiveCount}
	}

	t.Run("delete is left to the caller", func(t *testing.T) {
		t.Parallel()
		q, _ := newQueue(t)
		d := receive(t, q)[0]
		if !(pipeline.Settlement{Action: pipeline.SettleDelete}).Apply(ctx, q, message(d), log) {
			t.Error("Apply(delete) = false, want remove")
		}
	})
	t.Run("retry comes back after the delay", func(t *testing.T) {
		t.Parallel()
		q, clk := newQueue(t)
		d := receive(t, q)[0]
		if (pipeline.Settlement{Action: pipeline.SettleRetry, Delay: time.Minute}).Apply(ctx, q, message(d), log) {
			t.Error("Apply(retry) = true, want the message kept")
		}
		clk.Advance(59 * time.Second)
		if got := receive(t, q); len(got) != 0 {
			t.Fatalf("message back after 59s: %v", got)
		}
		clk.Advance(time.Second)
		if got := receive(t, q); len(got) != 1 || got[0].ID != d.ID {
			t.Fatalf("after the delay got %v, want the same message", got)
		}
	})
	t.Run("retry with a stale receipt sends a fresh copy", func(t *testing.T) {
		t.Parallel()
		q, clk := newQueue(t)
		d := receive(t, q)[0]
		// The visibility ran out while the batch ran; another worker got the
		// message and deleted it (it saw the batch owned).
		clk.Advance(time.Hour)
		again := receive(t, q)[0]
		if err := q.Delete(ctx, again.Receipt); err != nil {
			t.Fatal(err)
		}
		if !(pipeline.Settlement{Action: pipeline.SettleRetry, Delay: time.Minute}).Apply(ctx, q, message(d), log) {
			t.Error("Apply(retry, stale receipt) = false, want the stale delivery removed")
		}
		if got := receive(t, q); len(got) != 0 {
			t.Fatalf("fresh copy visible before its delay: %v", got)
		}
		clk.Advance(time.Minute)
		got := receive(t, q)
		if len(got) != 1 || string(got[0].Body) != "batch 1" {
			t.Fatalf("after the delay got %v, want a fresh copy of the body", got)
		}
	})
	t.Run("resend replaces the message with a fresh one", func(t *testing.T) {
		t.Parallel()
		q, _ := newQueue(t)
		d := receive(t, q)[0]
		if !(pipeline.Settlement{Action: pipeline.SettleResend}).Apply(ctx, q, message(d), log) {
			t.Fatal("Apply(resend) = false, want the received message removed")
		}
		if err := q.Delete(ctx, d.Receipt); err != nil {
			t.Fatal(err)
		}
		got := receive(t, q)
		if len(got) != 1 || got[0].ID == d.ID || string(got[0].Body) != "batch 1" || got[0].ReceiveCount != 1 {
			t.Fatalf("after resend got %+v, want a fresh copy received once", got)
		}
	})
	t.Run("dead-letter stays invisible", func(t *testing.T) {
		t.Parallel()
		q, clk := newQueue(t)
		d := receive(t, q)[0]
		s := pipeline.Settlement{Action: pipeline.SettleDeadLetter, Err: &pipeline.PoisonError{Err: errors.New("bad")}}
		if s.Apply(ctx, q, message(d), log) {
			t.Error("Apply(dead-letter) = true, want the message kept")
		}
		clk.Advance(59 * time.Minute)
		if got := receive(t, q); len(got) != 0 {
			t.Fatalf("poison back before the visibility timeout: %v", got)
		}
	})
}

// visibilityRecorder reports every ChangeVisibility on a channel.
type visibilityRecorder struct {
	queue.Queue
	changes chan time.Duration
}

func (q *visibilityRecorder) ChangeVisibility(ctx context.Context, receipt string, d time.Duration) error {
	q.changes <- d
	return q.Queue.ChangeVisibility(ctx, receipt, d)
}

// downStore fails every GetTask, like a throttled table.
type downStore struct{ store.Store }

func (downStore) GetTask(context.Context, string) (store.Task, error) {
	return store.Task{}, errors.New("database is locked")
}

// TestLocalWorkersSettleAsGeneratorDecides: the embedded workers carry out
// the generator's settlement: a transient failure comes back after the
// generator's ErrorDelay.
func TestLocalWorkersSettleAsGeneratorDecides(t *testing.T) {
	t.Parallel()
	e := newEnv(t, providerFunc(func(context.Context, llm.Request) (llm.Response, error) {
		return llm.Response{Text: "ok"}, nil
	}), pipeline.GeneratorConfig{ErrorDelay: 42 * time.Minute})
	e.splitProducts("settle", "{{id}}", 2, 2)
	e.useStore(downStore{e.store})
	rec := &visibilityRecorder{Queue: e.queue, changes: make(chan time.Duration, 10)}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	workers := pipeline.NewLocalWorkers(rec, e.gen, pipeline.LocalWorkersConfig{Workers: 1, PollInterval: 5 * time.Millisecond})
	done := make(chan struct{})
	go func() { defer close(done); _ = workers.Run(ctx) }()
	select {
	case d := <-rec.changes:
		if d != 42*time.Minute {
			t.Errorf("transient failure made visible again after %v, want the generator's ErrorDelay of 42m", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker never settled the failed message")
	}
	stop()
	<-done
}
