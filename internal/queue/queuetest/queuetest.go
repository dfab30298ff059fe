// Package queuetest is the conformance suite for queue.Queue adapters (and
// queue.DeadLetters where an adapter has it).
//
// The suite runs on real time, because a hosted queue (SQS, or an emulator
// of it) cannot take a fake clock. It keeps that fast by using short
// visibility timeouts (1-2 s, whole seconds as SQS requires), by running
// subtests in parallel, and by polling with deadlines instead of sleeping:
// a test waits only as long as the behaviour it checks takes.
//
// What the suite asks of an adapter beyond the doc comments in package queue:
//   - newQueue returns a new, empty queue with the given Config that no other
//     test uses; the adapter cleans it up with t.Cleanup.
//   - Receive on an empty queue returns within receiveBound (5 s), so long
//     polling, if any, must be shorter.
//   - Receive honours max up to 10 (the SQS limit); the suite never asks more.
package queuetest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/queue"
)

// Config is the queue configuration a subtest needs.
type Config struct {
	// Visibility is the queue's visibility timeout: how long a received
	// message stays hidden. The suite uses whole seconds.
	Visibility time.Duration
	// MaxReceive is how many times a message is delivered before it goes to
	// the dead-letter queue.
	MaxReceive int

	// detectsStaleReceipts and atLeastOnce are the adapter's capabilities,
	// set by RunWith.
	detectsStaleReceipts bool
	atLeastOnce          bool
	servesGroupsInTurn   bool
}

// Capabilities are guarantees an adapter may not be able to give.
type Capabilities struct {
	// DetectsStaleReceipts: ChangeVisibility with the receipt of an earlier
	// delivery of a message that has since been received again returns
	// queue.ErrNotFound. SQS cannot tell (it accepts any receipt of a
	// message that is in flight), so callers must not rely on it.
	DetectsStaleReceipts bool
	// AtLeastOnce: the queue may deliver a message again while an earlier
	// delivery is still hidden. An SQS standard queue promises at-least-once
	// delivery only ("on rare occasions ... you might get that message copy
	// again"), and moto shows it under concurrent receives; the generator's
	// conditional claims are what make a second delivery harmless. An
	// emulator shows it too when it loses an answer and the SDK asks again.
	// For such an adapter the concurrent-receivers and batch-send checks
	// ask that every message arrive at least once, that duplicates stay
	// rare, and that the queue be empty afterwards, instead of exactly once.
	AtLeastOnce bool
	// ServesGroupsInTurn: Receive takes from the groups with messages
	// waiting in turn (queue.Outgoing.Group), so one group's backlog does
	// not hold another's messages back. An SQS fair queue shares its
	// consumers among groups by its own measures (in-flight and processing
	// time shares), which neither moto nor a test can reproduce, so the
	// order is checked on the embedded queue only; every adapter must
	// deliver messages with a group.
	ServesGroupsInTurn bool
}

const (
	// receiveBound is how long Receive on an empty queue may take.
	receiveBound = 5 * time.Second
	// pollInterval paces the polling loops.
	pollInterval = 50 * time.Millisecond
	// slack absorbs scheduling and emulator latency in deadlines.
	slack = 5 * time.Second
)

// defaultConfig is used by subtests that do not depend on the values.
var defaultConfig = Config{Visibility: 2 * time.Second, MaxReceive: 5}

// Run runs the queue conformance suite.
func Run(t *testing.T, newQueue func(t *testing.T, cfg Config) queue.Queue) {
	t.Helper()
	RunWith(t, Capabilities{DetectsStaleReceipts: true, ServesGroupsInTurn: true}, newQueue)
}

// RunWith is Run for an adapter with fewer capabilities: the checks of a
// capability it lacks are left out.
func RunWith(t *testing.T, caps Capabilities, newQueue func(t *testing.T, cfg Config) queue.Queue) {
	t.Helper()
	tests := []struct {
		name string
		cfg  Config
		fn   func(t *testing.T, q queue.Queue, cfg Config)
	}{
		{"SendReceiveDelete", defaultConfig, testSendReceiveDelete},
		{"ReceiveEmpty", defaultConfig, testReceiveEmpty},
		{"VisibilityTimeout", Config{Visibility: time.Second, MaxReceive: 5}, testVisibilityTimeout},
		// A long timeout, so that only ChangeVisibility can bring it back early.
		{"ChangeVisibilityZero", Config{Visibility: 30 * time.Second, MaxReceive: 5}, testChangeVisibilityZero},
		{"ChangeVisibilityLonger", Config{Visibility: time.Second, MaxReceive: 5}, testChangeVisibilityLonger},
		{"DeleteIdempotent", defaultConfig, testDeleteIdempotent},
		{"DelayedSend", Config{Visibility: 30 * time.Second, MaxReceive: 5}, testDelayedSend},
		{"BatchSend", Config{Visibility: time.Second, MaxReceive: 5}, testBatchSend},
		{"MaxReceive", Config{Visibility: 30 * time.Second, MaxReceive: 2}, testMaxReceive},
		{"ConcurrentReceivers", Config{Visibility: 20 * time.Second, MaxReceive: 5}, testConcurrentReceivers},
		{"Groups", Config{Visibility: 30 * time.Second, MaxReceive: 5}, testGroups},
	}
	for _, tt := range tests {
		tt.cfg.detectsStaleReceipts = caps.DetectsStaleReceipts
		tt.cfg.atLeastOnce = caps.AtLeastOnce
		tt.cfg.servesGroupsInTurn = caps.ServesGroupsInTurn
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newQueue(t, tt.cfg), tt.cfg)
		})
	}
}

// send sends bodies in one call and fails the test if it cannot.
func send(t *testing.T, q queue.Queue, bodies ...string) {
	t.Helper()
	msgs := make([]queue.Outgoing, len(bodies))
	for i, b := range bodies {
		msgs[i] = queue.Outgoing{Body: []byte(b)}
	}
	if err := q.Send(t.Context(), msgs); err != nil {
		t.Fatalf("send %d messages: %v", len(msgs), err)
	}
}

// receive calls Receive once and fails the test on an error.
func receive(t *testing.T, q queue.Queue, max int) []queue.Delivery {
	t.Helper()
	ds, err := q.Receive(t.Context(), max)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	if len(ds) > max {
		t.Fatalf("received %d messages, asked for at most %d", len(ds), max)
	}
	return ds
}

// receiveOne polls until exactly one message arrives, or fails the test
// after timeout.
func receiveOne(t *testing.T, q queue.Queue, timeout time.Duration) queue.Delivery {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		switch ds := receive(t, q, 1); len(ds) {
		case 1:
			return ds[0]
		case 0:
		default:
			t.Fatalf("received %d messages, want 1", len(ds))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message arrived within %v", timeout)
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal("test cancelled while waiting for a message")
		}
	}
}

// expectNone polls Receive for d and fails the test if any message arrives.
func expectNone(t *testing.T, q queue.Queue, d time.Duration, why string) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if ds := receive(t, q, 10); len(ds) > 0 {
			t.Fatalf("%s: received %q (receive count %d), want nothing", why, ds[0].Body, ds[0].ReceiveCount)
		}
		if time.Now().After(deadline) {
			return
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			return
		}
	}
}

// checkDelivery fails the test unless d carries body on its count-th receive.
func checkDelivery(t *testing.T, d queue.Delivery, body string, count int) {
	t.Helper()
	if string(d.Body) != body || d.ReceiveCount != count || d.ID == "" || d.Receipt == "" {
		t.Fatalf("delivery = {ID %q Receipt %q Body %q ReceiveCount %d}, want body %q, receive count %d, an ID and a receipt",
			d.ID, d.Receipt, d.Body, d.ReceiveCount, body, count)
	}
}

func testSendReceiveDelete(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	send(t, q, `{"task_id":"t1","batch_no":1}`)
	d := receiveOne(t, q, slack)
	checkDelivery(t, d, `{"task_id":"t1","batch_no":1}`, 1)
	if err := q.Delete(ctx, d.Receipt); err != nil {
		t.Fatalf("delete: %v", err)
	}
	expectNone(t, q, cfg.Visibility+time.Second, "after delete, past the visibility timeout")
}

func testReceiveEmpty(t *testing.T, q queue.Queue, _ Config) {
	start := time.Now()
	if ds := receive(t, q, 10); len(ds) != 0 {
		t.Fatalf("received %d messages from an empty queue", len(ds))
	}
	if took := time.Since(start); took > receiveBound {
		t.Errorf("Receive on an empty queue took %v, want under %v", took, receiveBound)
	}
}

func testVisibilityTimeout(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	send(t, q, "m")
	first := receiveOne(t, q, slack)
	received := time.Now()
	checkDelivery(t, first, "m", 1)
	var second queue.Delivery
	switch ds := receive(t, q, 10); {
	case len(ds) == 0:
		second = receiveOne(t, q, cfg.Visibility+slack)
	case time.Since(received) < cfg.Visibility/2:
		t.Fatalf("received %d messages while the only one is in flight", len(ds))
	default:
		second = ds[0] // a slow backend: the timeout passed during the call
	}
	if took := time.Since(received); took < cfg.Visibility/2 {
		t.Errorf("redelivered after %v, before the visibility timeout of %v", took, cfg.Visibility)
	}
	checkDelivery(t, second, "m", 2)
	if second.ID != first.ID {
		t.Errorf("redelivery has ID %q, want the message's ID %q", second.ID, first.ID)
	}
	if second.Receipt == first.Receipt {
		t.Errorf("redelivery reuses receipt %q, want a new one", first.Receipt)
	}

	// The first receipt is stale now.
	if cfg.detectsStaleReceipts {
		if err := q.ChangeVisibility(ctx, first.Receipt, 0); !errors.Is(err, queue.ErrNotFound) {
			t.Errorf("ChangeVisibility with a stale receipt: error = %v, want %v", err, queue.ErrNotFound)
		}
	}
	if err := q.Delete(ctx, first.Receipt); err != nil {
		t.Errorf("Delete with a stale receipt: %v, want nil", err)
	}
	if err := q.Delete(ctx, second.Receipt); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := q.ChangeVisibility(ctx, second.Receipt, 0); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("ChangeVisibility after delete: error = %v, want %v", err, queue.ErrNotFound)
	}
	expectNone(t, q, cfg.Visibility+time.Second, "after delete")
}

func testChangeVisibilityZero(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	send(t, q, "m")
	first := receiveOne(t, q, slack)
	if err := q.ChangeVisibility(ctx, first.Receipt, 0); err != nil {
		t.Fatalf("change visibility to 0: %v", err)
	}
	start := time.Now()
	second := receiveOne(t, q, slack)
	checkDelivery(t, second, "m", 2)
	if took := time.Since(start); took >= cfg.Visibility {
		t.Errorf("message came back after %v, want at once (visibility timeout %v)", took, cfg.Visibility)
	}
}

func testChangeVisibilityLonger(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	send(t, q, "m")
	d := receiveOne(t, q, slack)
	if err := q.ChangeVisibility(ctx, d.Receipt, 30*time.Second); err != nil {
		t.Fatalf("change visibility to 30s: %v", err)
	}
	expectNone(t, q, 3*cfg.Visibility, "after extending the visibility, past the original timeout")
	// It was hidden, not lost.
	if err := q.ChangeVisibility(ctx, d.Receipt, 0); err != nil {
		t.Fatalf("change visibility to 0: %v", err)
	}
	checkDelivery(t, receiveOne(t, q, slack), "m", 2)
}

func testDeleteIdempotent(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	send(t, q, "m")
	d := receiveOne(t, q, slack)
	for i := range 2 {
		if err := q.Delete(ctx, d.Receipt); err != nil {
			t.Fatalf("delete #%d: %v", i+1, err)
		}
	}
	expectNone(t, q, cfg.Visibility+time.Second, "after delete")
}

func testDelayedSend(t *testing.T, q queue.Queue, _ Config) {
	ctx := t.Context()
	const delay = 2 * time.Second
	start := time.Now()
	err := q.Send(ctx, []queue.Outgoing{
		{Body: []byte("later"), Delay: delay},
		{Body: []byte("now")},
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	d := receiveOne(t, q, slack)
	checkDelivery(t, d, "now", 1)
	if time.Since(start) < delay/2 {
		// Still within the delay: the delayed message must be hidden.
		if ds := receive(t, q, 10); len(ds) != 0 {
			t.Fatalf("received %q during its delay", ds[0].Body)
		}
	}
	later := receiveOne(t, q, delay+slack)
	checkDelivery(t, later, "later", 1)
	if took := time.Since(start); took < delay/2 {
		t.Errorf("delayed message arrived after %v, want about %v", took, delay)
	}
}

func testBatchSend(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	var want []string
	for i := range 25 {
		want = append(want, fmt.Sprintf(`{"task_id":"t","batch_no":%d}`, i))
	}
	send(t, q, want...)
	// Received until every body has come, counting each: a queue that
	// delivers at least once may bring one again (a receive whose answer
	// was lost hides its messages until the visibility timeout, then they
	// come back; a send whose answer was lost is sent twice), so the loop
	// waits for every body rather than for 25 deliveries.
	seen := map[string]int{}
	deliveries := 0
	deadline := time.Now().Add(2 * slack)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for len(seen) < len(want) {
		ds := receive(t, q, 10)
		for _, d := range ds {
			seen[string(d.Body)]++
			deliveries++
			if err := q.Delete(ctx, d.Receipt); err != nil {
				t.Fatalf("delete: %v", err)
			}
		}
		if len(ds) > 0 {
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d messages before the deadline", len(seen), len(want))
		}
		<-tick.C
	}
	got := slices.Sorted(maps.Keys(seen))
	slices.Sort(want)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("bodies received (-want +got):\n%s", d)
	}
	switch extra := deliveries - len(seen); {
	case !cfg.atLeastOnce && extra > 0:
		t.Errorf("%d deliveries of %d messages, want each once", deliveries, len(want))
	case extra > len(want)/5:
		// A queue that ignored visibility would deliver most of them again.
		t.Errorf("%d duplicate deliveries of %d messages, want at most %d", extra, len(want), len(want)/5)
	}
	expectNone(t, q, cfg.Visibility+time.Second, "after deleting every message")
}

func testMaxReceive(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	send(t, q, "poison")
	var id string
	for i := 1; i <= cfg.MaxReceive; i++ {
		d := receiveOne(t, q, slack)
		checkDelivery(t, d, "poison", i)
		id = d.ID
		// Hand it back at once, as a crashing handler's timeout would.
		if err := q.ChangeVisibility(ctx, d.Receipt, 0); err != nil {
			t.Fatalf("change visibility: %v", err)
		}
	}
	expectNone(t, q, 2*time.Second, fmt.Sprintf("after %d receives", cfg.MaxReceive))

	dl, ok := q.(queue.DeadLetters)
	if !ok {
		return
	}
	dead := waitDead(t, dl, id)
	if string(dead.Body) != "poison" || dead.ReceiveCount < cfg.MaxReceive {
		t.Errorf("dead letter = {Body %q ReceiveCount %d}, want poison received at least %d times", dead.Body, dead.ReceiveCount, cfg.MaxReceive)
	}
	n, err := dl.Redrive(ctx)
	if err != nil {
		t.Fatalf("redrive: %v", err)
	}
	if n != 1 {
		t.Errorf("redrive moved %d messages, want 1", n)
	}
	d := receiveOne(t, q, slack)
	checkDelivery(t, d, "poison", 1)
	if err := q.Delete(ctx, d.Receipt); err != nil {
		t.Fatalf("delete: %v", err)
	}
	left, err := dl.ListDead(ctx, 10)
	if err != nil {
		t.Fatalf("list dead: %v", err)
	}
	if len(left) != 0 {
		t.Errorf("%d dead letters left after redrive, want none", len(left))
	}
}

// waitDead polls ListDead until the message id shows up, or fails the test.
func waitDead(t *testing.T, dl queue.DeadLetters, id string) queue.Delivery {
	t.Helper()
	deadline := time.Now().Add(2 * slack)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		ds, err := dl.ListDead(t.Context(), 10)
		if err != nil {
			t.Fatalf("list dead: %v", err)
		}
		for _, d := range ds {
			if d.ID == id {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %s not in the dead-letter queue within %v; it holds %d", id, 2*slack, len(ds))
		}
		<-tick.C
	}
}

func testConcurrentReceivers(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	const total, receivers = 100, 4
	var bodies []string
	for i := range total {
		bodies = append(bodies, fmt.Sprint(i))
	}
	send(t, q, bodies...)

	var (
		mu    sync.Mutex
		seen  = make(map[string]int)
		count int
		errs  []error
		wg    sync.WaitGroup
	)
	// Draining must finish within one visibility period, or a message could
	// legitimately come back; then "exactly once" would not hold.
	deadline := time.Now().Add(cfg.Visibility - time.Second)
	for range receivers {
		wg.Go(func() {
			for {
				mu.Lock()
				done := len(seen) >= total || len(errs) > 0
				mu.Unlock()
				if done || time.Now().After(deadline) {
					return
				}
				ds, err := q.Receive(ctx, 10)
				for _, d := range ds {
					if err == nil {
						err = q.Delete(ctx, d.Receipt)
					}
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, d := range ds {
					seen[string(d.Body)]++
					count++
				}
				mu.Unlock()
				if len(ds) == 0 {
					select {
					case <-time.After(pollInterval):
					case <-ctx.Done():
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("receivers: %v", err)
	}
	if !cfg.atLeastOnce {
		for _, b := range bodies {
			if seen[b] != 1 {
				t.Errorf("message %s received %d times, want once", b, seen[b])
			}
		}
		if count != total {
			t.Errorf("received %d deliveries, want %d", count, total)
		}
		return
	}
	for _, b := range bodies {
		if seen[b] == 0 {
			t.Errorf("message %s never received", b)
		}
	}
	// Duplicates are allowed but must stay the exception: a queue that
	// ignored visibility would deliver most messages several times.
	if extra := count - len(seen); extra > total/10 {
		t.Errorf("%d duplicate deliveries of %d messages, want at most %d", extra, total, total/10)
	}
	// Every delivery was deleted, a duplicate's receipt included, so nothing
	// may come back.
	if ds, err := q.Receive(ctx, 10); err != nil {
		t.Fatalf("receive after draining: %v", err)
	} else if len(ds) != 0 {
		t.Errorf("after draining, %d messages still delivered (first %q)", len(ds), ds[0].Body)
	}
}

// testGroups: messages sent with a group are delivered like any other; on
// a queue that serves groups in turn, a group that sent three messages
// after another sent fifty gets every other message until its three are
// taken, whether they are taken one at a time (each deleted before the
// next receive, as a single worker does) or ten at a time.
func testGroups(t *testing.T, q queue.Queue, cfg Config) {
	ctx := t.Context()
	var msgs []queue.Outgoing
	for i := range 50 {
		msgs = append(msgs, queue.Outgoing{Body: []byte(fmt.Sprintf("big-%02d", i)), Group: "big"})
	}
	if err := q.Send(ctx, msgs); err != nil {
		t.Fatalf("send the big group: %v", err)
	}
	msgs = nil
	for i := range 3 {
		msgs = append(msgs, queue.Outgoing{Body: []byte(fmt.Sprintf("small-%d", i)), Group: "small"})
	}
	if err := q.Send(ctx, msgs); err != nil {
		t.Fatalf("send the small group: %v", err)
	}
	var order []string
	deadline := time.Now().Add(slack)
	for len(order) < 8 && time.Now().Before(deadline) {
		for _, d := range receive(t, q, 1) {
			if group, _, _ := strings.Cut(string(d.Body), "-"); d.Group != group {
				t.Errorf("message %s delivered in group %q, want %q", d.Body, d.Group, group)
			}
			order = append(order, string(d.Body))
			if err := q.Delete(ctx, d.Receipt); err != nil {
				t.Fatalf("delete %s: %v", d.Body, err)
			}
		}
	}
	if len(order) < 8 {
		t.Fatalf("received %d messages one at a time within %v, want 8: %v", len(order), slack, order)
	}
	if !cfg.servesGroupsInTurn {
		return
	}
	want := []string{"big-00", "small-0", "big-01", "small-1", "big-02", "small-2", "big-03", "big-04"}
	if diff := cmp.Diff(want, order); diff != "" {
		t.Errorf("one at a time, the groups were not served in turn (-want +got):\n%s", diff)
	}
	// Ten at a time: a new small group among the big one's backlog.
	if err := q.Send(ctx, []queue.Outgoing{{Body: []byte("late-0"), Group: "late"}, {Body: []byte("late-1"), Group: "late"}}); err != nil {
		t.Fatalf("send the late group: %v", err)
	}
	var got []string
	for _, d := range receive(t, q, 10) {
		got = append(got, string(d.Body))
	}
	want = []string{"big-05", "big-06", "big-07", "big-08", "big-09", "big-10", "big-11", "big-12", "late-0", "late-1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ten at a time (-want +got, by message id):\n%s", diff)
	}
}
