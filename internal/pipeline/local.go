package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/queue"
)

// LocalWorkers is the embedded runtime's stand-in for the SQS event source
// mapping: goroutines that poll the queue, hand each message to the
// generator and apply its outcome to the message.
type LocalWorkers struct {
	Queue     queue.Queue
	Generator *Generator
	// Workers is the number of batches processed at once. Defaults to 2.
	Workers int
	// Visibility is the queue's visibility timeout; the message is kept
	// invisible this long past each lease renewal. Defaults to 5 minutes.
	Visibility time.Duration
	// PollInterval is the wait after an empty receive. Defaults to 100ms.
	PollInterval time.Duration
	Clock        clock.Clock
	Logger       *slog.Logger
}

// Run processes messages until ctx ends. It returns nil on cancellation;
// per-message failures are logged and left to the queue's redelivery.
func (w *LocalWorkers) Run(ctx context.Context) error { return w.RunUntil(ctx, nil) }

// RunUntil is Run that also stops taking new messages once drain is closed,
// returning after the messages in hand are processed (under ctx, which may
// still cut them short).
func (w *LocalWorkers) RunUntil(ctx context.Context, drain <-chan struct{}) error {
	workers := w.Workers
	if workers <= 0 {
		workers = 2
	}
	if w.Visibility <= 0 {
		w.Visibility = 5 * time.Minute
	}
	if w.PollInterval <= 0 {
		w.PollInterval = 100 * time.Millisecond
	}
	if w.Clock == nil {
		w.Clock = clock.Real{}
	}
	if w.Logger == nil {
		w.Logger = slog.New(slog.DiscardHandler)
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(ctx, drain)
		}()
	}
	wg.Wait()
	return nil
}

func (w *LocalWorkers) loop(ctx context.Context, drain <-chan struct{}) {
	for ctx.Err() == nil {
		select {
		case <-drain:
			return
		default:
		}
		ds, err := w.Queue.Receive(ctx, 1)
		if err != nil && ctx.Err() == nil {
			w.Logger.Warn("receive from queue failed", "error", err)
		}
		if len(ds) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-drain:
				return
			case <-w.Clock.After(w.PollInterval):
			}
			continue
		}
		for _, d := range ds {
			w.handle(ctx, d)
		}
	}
}

func (w *LocalWorkers) handle(ctx context.Context, d queue.Delivery) {
	out := w.process(ctx, d)
	w.apply(ctx, d, out)
}

// process runs the generator on one message. A panic (a bug) fails only
// this message, which the queue then redelivers and finally dead-letters,
// instead of taking every other batch of the run down with it.
func (w *LocalWorkers) process(ctx context.Context, d queue.Delivery) (out Outcome) {
	defer func() {
		if p := recover(); p != nil {
			w.Logger.Error("panic while processing a message; it will be redelivered and, if it keeps failing, dead-lettered",
				"message_id", d.ID, "panic", p, "stack", string(debug.Stack()))
			out = Outcome{Err: &PoisonError{Err: fmt.Errorf("panic: %v", p)}}
		}
	}()
	return w.Generator.Process(ctx, Delivery{
		Body:         d.Body,
		ReceiveCount: d.ReceiveCount,
		KeepAlive: func(ctx context.Context) error {
			return w.Queue.ChangeVisibility(ctx, d.Receipt, w.Visibility)
		},
	})
}

// apply settles the message as Generator.Settle decides.
func (w *LocalWorkers) apply(ctx context.Context, d queue.Delivery, out Outcome) {
	// Settle even when shutting down: the outcome is already persisted.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	m := Message{ID: d.ID, Receipt: d.Receipt, Body: d.Body, ReceiveCount: d.ReceiveCount}
	if !w.Generator.Settle(out).Apply(actx, w.Queue, m, w.Logger) {
		return
	}
	if err := w.Queue.Delete(actx, d.Receipt); err != nil {
		w.Logger.Warn("delete message failed; it will be redelivered and acknowledged then", "message_id", d.ID, "error", err)
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
