package embedded

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
)

// WorkConfig says how a data directory's queue is worked.
type WorkConfig struct {
	// Workers is how many batches are processed at once
	// (pipeline.BatchesInFlight of the providers' concurrency).
	Workers int
	// Visibility is the queue's visibility timeout. Defaults to
	// pipeline.LocalWorkers' (5 minutes).
	Visibility time.Duration
	// SweepAfter is the sweeper's PendingAfter: how long a batch may sit
	// unchanged before it is sent again or its lease reset. The sweeper
	// runs every fifth of it, at least every second.
	SweepAfter time.Duration
	// TaskID, when set, keeps the sweeper to one task: `batchgen run`
	// sweeps only its own task, whose queue it owns.
	TaskID string
	// Exports starts the exports the sweeper finds never started.
	// Required.
	Exports pipeline.ExportStarter
	// Logger defaults to discarding; Metrics to recording nothing.
	Logger  *slog.Logger
	Metrics metrics.Recorder
}

// Work is a running data directory's workers and sweeper: the workers
// process the queue's batches, and the sweeper covers what they cannot (a
// batch whose message was lost or whose lease outlived a stuck worker, an
// export that never started).
type Work struct {
	drain       chan struct{}
	drainOnce   sync.Once
	stop        context.CancelFunc
	workersDone chan struct{}
	sweeperDone chan struct{}
}

// Start starts the workers of gen on q and the sweeper of st until ctx
// ends or Stop is called. The workers' context is ctx without its
// cancellation: Stop ends them, so that a command can drain them first.
func Start(ctx context.Context, st store.Store, q queue.Queue, gen *pipeline.Generator, cfg WorkConfig) *Work {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	workCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	w := &Work{drain: make(chan struct{}), stop: stop, workersDone: make(chan struct{}), sweeperDone: make(chan struct{})}
	workers := pipeline.NewLocalWorkers(q, gen, pipeline.LocalWorkersConfig{
		Workers: cfg.Workers, Visibility: cfg.Visibility, Logger: logger, Metrics: cfg.Metrics,
	})
	go func() {
		defer close(w.workersDone)
		_ = workers.RunUntil(workCtx, w.drain)
	}()
	sweeper := pipeline.NewSweeper(st, q, cfg.Exports, pipeline.SweeperConfig{
		TaskID: cfg.TaskID, PendingAfter: cfg.SweepAfter, Logger: logger, Metrics: cfg.Metrics,
	})
	go func() {
		defer close(w.sweeperDone)
		t := time.NewTicker(max(cfg.SweepAfter/5, time.Second))
		defer t.Stop()
		for {
			select {
			case <-workCtx.Done():
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if rep, err := sweeper.Sweep(workCtx); err != nil && workCtx.Err() == nil {
				logger.Warn("sweep failed", "error", err)
			} else if rep != (pipeline.SweepReport{}) {
				logger.Info("sweep", "requeued", rep.Requeued, "leases_reset", rep.LeasesReset, "exports_started", rep.ExportsStarted)
			}
		}
	}()
	return w
}

// Drain stops the workers gracefully: no new message is taken, no new row
// starts, and the calls in flight finish and are saved
// (pipeline.LocalWorkers.RunUntil). Wait says when they are done.
func (w *Work) Drain() { w.drainOnce.Do(func() { close(w.drain) }) }

// Wait waits for the drained workers for at most grace (forever when grace
// is negative), and reports whether they finished.
func (w *Work) Wait(grace time.Duration) bool {
	if grace < 0 {
		<-w.workersDone
		return true
	}
	select {
	case <-w.workersDone:
		return true
	case <-time.After(grace):
		return false
	}
}

// Stop cuts the workers and the sweeper off (calls in flight are
// abandoned; their rows run again) and waits for them to return.
func (w *Work) Stop() {
	w.stop()
	<-w.workersDone
	<-w.sweeperDone
}
