package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/queue"
)

// LocalWorkers is the embedded runtime's stand-in for the SQS event source
// mapping: goroutines that poll the queue, hand each message to the
// generator and settle the message as the generator decides.
type LocalWorkers struct {
	queue queue.Queue
	gen   *Generator
	cfg   LocalWorkersConfig
	// sampled is when the queue's backlog was last recorded (Unix nanos).
	sampled atomic.Int64

	// busy counts the batches in hand per group (principal), but for the
	// detached ones.
	mu   sync.Mutex
	busy map[string]int
	// detached are the batches worked beside the workers.
	detached sync.WaitGroup
}

// groupReceiver is a queue that can deliver the messages of every group
// but some (sqlitequeue.Queue).
type groupReceiver interface {
	ReceiveOutside(ctx context.Context, max int, busy []string) ([]queue.Delivery, error)
}

// BatchesInFlight is how many batches the embedded runtime works on at once
// for a generator of concurrency calls in flight over batches of
// batchSize rows: enough batches to fill the calls, and one more. A batch
// is done only when its last call returns, so batches that share one
// limiter drain in step and end together; without a spare, the limiter
// sat idle for a call's latency at every hand-over (5,000 rows at 2,000 a
// minute in batches of 100 ran at 1,938 a minute with two batches in
// flight, 1,968 with three: 1.033 and 1.016 of the bound).
func BatchesInFlight(concurrency, batchSize int) int {
	return 3 + max(concurrency, 0)/max(batchSize, 1)
}

// LocalWorkersConfig tunes the workers. Zero fields take the defaults;
// NewLocalWorkers applies them and validates the result, once.
type LocalWorkersConfig struct {
	// Workers is the number of batches processed at once. Defaults to 2.
	Workers int
	// Visibility is the queue's visibility timeout; the message is kept
	// invisible this long past each lease renewal. Defaults to 5 minutes.
	Visibility time.Duration
	// PollInterval is the wait after an empty receive. Defaults to 100ms.
	PollInterval time.Duration
	// Clock times the polls. Defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Metrics receives the use case's metrics. Defaults to recording
	// nothing.
	Metrics metrics.Recorder
}

func (c LocalWorkersConfig) withDefaults() LocalWorkersConfig {
	c.Workers = cmp.Or(c.Workers, 2)
	c.Visibility = cmp.Or(c.Visibility, 5*time.Minute)
	c.PollInterval = cmp.Or(c.PollInterval, 100*time.Millisecond)
	c.Clock = orClock(c.Clock)
	c.Logger = orLogger(c.Logger)
	c.Metrics = metrics.Or(c.Metrics)
	return c
}

func (c LocalWorkersConfig) validate() error {
	if c.Workers < 1 || c.Visibility <= 0 || c.PollInterval <= 0 {
		return fmt.Errorf("config: Workers %d, Visibility %v, PollInterval %v: each must be positive", c.Workers, c.Visibility, c.PollInterval)
	}
	return nil
}

// NewLocalWorkers returns workers that feed messages from q to gen. It
// applies cfg's defaults and panics if a port is nil or cfg is invalid: a
// mistake in the wiring, caught at start-up.
func NewLocalWorkers(q queue.Queue, gen *Generator, cfg LocalWorkersConfig) *LocalWorkers {
	cfg = cfg.withDefaults()
	if err := errors.Join(required("Queue", q), required("Generator", gen), cfg.validate()); err != nil {
		panic("pipeline.NewLocalWorkers: " + err.Error())
	}
	return &LocalWorkers{queue: q, gen: gen, cfg: cfg, busy: map[string]int{}}
}

// Run processes messages until ctx ends. It returns nil on cancellation;
// per-message failures are logged and left to the queue's redelivery.
func (w *LocalWorkers) Run(ctx context.Context) error { return w.RunUntil(ctx, nil) }

// RunUntil is Run that also stops once drain is closed: no new message is
// taken, the batches in hand start no new row, their calls in flight finish
// and are saved, and the batches are handed back (Delivery.Stop); it
// returns then (under ctx, which may still cut them short).
//
// Beside the Workers, when the queue can leave groups out (groupReceiver),
// one newcomer worker takes, while every worker holds a batch, only the
// batches of principals that have none in hand: the queue serves the
// principals in turn and the generator shares its row slots among them,
// but a principal who arrives while every worker holds a batch of
// another's would otherwise wait for one of those batches to end (half a
// minute for 100 rows at a third of a 600-a-minute quota) before its
// first one starts. A third principal arriving meanwhile waits for the
// next batch to end.
func (w *LocalWorkers) RunUntil(ctx context.Context, drain <-chan struct{}) error {
	var wg sync.WaitGroup
	for range w.cfg.Workers {
		wg.Go(func() {
			w.loop(ctx, drain, func(ctx context.Context) ([]queue.Delivery, error) { return w.queue.Receive(ctx, 1) })
		})
	}
	if gr, ok := w.queue.(groupReceiver); ok {
		wg.Go(func() {
			w.loop(ctx, drain, func(ctx context.Context) ([]queue.Delivery, error) {
				busy, held := w.busyGroups()
				if held < w.cfg.Workers {
					return nil, nil // a worker is free: the queue's turns are enough
				}
				return gr.ReceiveOutside(ctx, 1, busy)
			})
		})
	}
	wg.Wait()
	w.detached.Wait()
	return nil
}

// busyGroups lists the groups with a batch in hand, and how many batches
// are.
func (w *LocalWorkers) busyGroups() ([]string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	held := 0
	for _, n := range w.busy {
		held += n
	}
	return slices.Collect(maps.Keys(w.busy)), held
}

// hold counts a batch of group in hand until the returned func is called.
func (w *LocalWorkers) hold(group string) func() {
	w.mu.Lock()
	w.busy[group]++
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.busy[group]--; w.busy[group] == 0 {
			delete(w.busy, group)
		}
	}
}

func (w *LocalWorkers) loop(ctx context.Context, drain <-chan struct{}, receive func(context.Context) ([]queue.Delivery, error)) {
	for ctx.Err() == nil {
		select {
		case <-drain:
			return
		default:
		}
		w.sampleBacklog(ctx)
		ds, err := receive(ctx)
		if err != nil && ctx.Err() == nil {
			w.cfg.Logger.WarnContext(ctx, "receive from queue failed", "error", err)
		}
		if len(ds) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-drain:
				return
			case <-w.cfg.Clock.After(w.cfg.PollInterval):
			}
			continue
		}
		for _, d := range ds {
			if w.gen.WaitsForProviderBatches(ctx, d.Body) {
				// An economy task's batch waits hours for its provider
				// batches, holding no row slot: it is worked beside the
				// workers, so that it never holds one of them that long,
				// and every batch of the task joins the first provider
				// batches.
				w.detached.Go(func() { w.process(ctx, d, drain) })
				continue
			}
			w.handle(ctx, d, drain)
		}
	}
}

// sampleBacklog records the queue's depth and oldest age, at most once a
// second across the workers, when the queue can tell (queue.Backlog).
func (w *LocalWorkers) sampleBacklog(ctx context.Context) {
	b, ok := w.queue.(queue.Backlog)
	if !ok {
		return
	}
	now, last := w.cfg.Clock.Now().UnixNano(), w.sampled.Load()
	if now-last < int64(time.Second) || !w.sampled.CompareAndSwap(last, now) {
		return
	}
	visible, oldest, err := b.Backlog(ctx)
	if err != nil {
		return // a metric is not worth a log line per second
	}
	w.cfg.Metrics.Set(metrics.QueueDepth, float64(visible))
	w.cfg.Metrics.Set(metrics.QueueOldestAge, oldest.Seconds())
}

func (w *LocalWorkers) handle(ctx context.Context, d queue.Delivery, drain <-chan struct{}) {
	defer w.hold(d.Group)()
	w.process(ctx, d, drain)
}

// process runs the generator on one message and settles it. A panic (a
// bug) fails only this message, which the queue then redelivers and
// finally dead-letters, instead of taking every other batch of the run
// down with it.
func (w *LocalWorkers) process(ctx context.Context, d queue.Delivery, drain <-chan struct{}) {
	w.apply(ctx, d, w.generate(ctx, d, drain))
}

func (w *LocalWorkers) generate(ctx context.Context, d queue.Delivery, drain <-chan struct{}) (out Outcome) {
	defer func() {
		if p := recover(); p != nil {
			w.cfg.Logger.ErrorContext(ctx, "panic while processing a message; it will be redelivered and, if it keeps failing, dead-lettered",
				"message_id", d.ID, "panic", p, "stack", string(debug.Stack()))
			out = Outcome{Err: &PoisonError{Err: fmt.Errorf("panic: %v", p)}}
		}
	}()
	return w.gen.Process(ctx, Delivery{
		Body:         d.Body,
		ReceiveCount: d.ReceiveCount,
		KeepAlive: func(ctx context.Context) error {
			return w.queue.ChangeVisibility(ctx, d.Receipt, w.cfg.Visibility)
		},
		Stop: drain,
	})
}

// apply settles the message as Generator.Settle decides.
func (w *LocalWorkers) apply(ctx context.Context, d queue.Delivery, out Outcome) {
	// Settle even when shutting down: the outcome is already persisted.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	m := Message{ID: d.ID, Receipt: d.Receipt, Body: d.Body, ReceiveCount: d.ReceiveCount}
	s := w.gen.Settle(out)
	RecordSettlement(w.cfg.Metrics, s)
	if !s.Apply(actx, w.queue, m, w.cfg.Logger) {
		return
	}
	if err := w.queue.Delete(actx, d.Receipt); err != nil {
		w.cfg.Logger.WarnContext(ctx, "delete message failed; it will be redelivered and acknowledged then", "message_id", d.ID, "error", err)
	}
}

// ExportSignal is the embedded ExportStarter: it tells the run loop which
// tasks are ready, and the run loop calls Exporter.Export itself so export
// errors reach the user directly.
type ExportSignal struct {
	once sync.Once
	ch   chan string
}

// C returns the channel of task ids ready for export.
func (s *ExportSignal) C() <-chan string { return s.channel() }

func (s *ExportSignal) channel() chan string {
	s.once.Do(func() { s.ch = make(chan string, 16) })
	return s.ch
}

// StartExport signals that taskID is ready. It never blocks: if the run
// loop is behind, it will find the task ready when it looks.
func (s *ExportSignal) StartExport(_ context.Context, taskID string, _ int) error {
	select {
	case s.channel() <- taskID:
	default:
	}
	return nil
}
