package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// QueueVisibility is the embedded queue's visibility timeout: a message
// taken by a worker that died is delivered again after it.
const QueueVisibility = 5 * time.Minute

// maxReceive is the embedded queue's redrive threshold: above the retry
// rounds, so only messages that keep failing to be handled at all (poison)
// are dead-lettered.
const maxReceive = 10

// TaskQueue is the embedded queue of one task, as `batchgen run` works
// it: each run works only its own task's messages, so an abandoned task in
// the same data directory is never billed by a run of another sheet.
func TaskQueue(taskID string) string { return "batches-" + taskID }

// OpenQueue opens the queue called name in st's database with the
// engine's settings: for the operator commands that read a task's dead
// letters (TaskQueue) beside a running engine.
func OpenQueue(st *sqlitestore.Store, name string) (*sqlitequeue.Queue, error) {
	q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: name, Visibility: QueueVisibility, MaxReceive: maxReceive, Clock: clock.Real{}})
	if err != nil {
		return nil, fmt.Errorf("open queue %s: %w", name, err)
	}
	return q, nil
}

// EngineConfig says how an Engine calls the model, retries and exports.
type EngineConfig struct {
	// Queue names the data directory's queue the engine works: TaskQueue
	// for one task (run), or one queue for every task (serve).
	Queue string
	// Results is where exports write; the data directory's blob folder
	// when nil.
	Results blob.Store
	// InProcessExports makes the generator export a finished task itself
	// (serve, where nobody waits for it). Otherwise it only signals
	// (Engine.Signal), and the command that waits for the task exports it
	// (run), so that a failed export is that command's error.
	InProcessExports bool
	// Generator tunes the model calls and retries: Concurrency, Lease,
	// CallTimeout, CallsPerRound, Rounds, RetryDelays, Observer, Cache and
	// CacheMode. Clock, Logger, Metrics, Owner and the flushing of results
	// are the engine's.
	Generator pipeline.GeneratorConfig
	// Logger defaults to discarding; Metrics to recording nothing.
	Logger  *slog.Logger
	Metrics metrics.Recorder
}

// Engine is what works a data directory's tasks: its queue, the generator
// that calls the model and the exporter that writes results.
type Engine struct {
	Data      *DataDir
	Queue     queue.Queue
	Generator *pipeline.Generator
	Exporter  *pipeline.Exporter
	// Signal hears of the exports the generator asks for when they are not
	// in process; nil otherwise.
	Signal *pipeline.ExportSignal
	// Exports starts exports: the Signal, or the Exporter itself.
	Exports pipeline.ExportStarter
	logger  *slog.Logger
	metrics metrics.Recorder
}

// NewEngine builds the engine of data directory d that calls the model
// through router (the providers' router).
func NewEngine(d *DataDir, router llm.Provider, cfg EngineConfig) (*Engine, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	clk := clock.Real{}
	q, err := OpenQueue(d.Store, cfg.Queue)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", d.Dir, err)
	}
	results := cfg.Results
	if results == nil {
		results = d.Blobs
	}
	e := &Engine{Data: d, Queue: q, logger: logger, metrics: cfg.Metrics}
	e.Exporter = pipeline.NewExporter(d.Store, results, pipeline.ExporterConfig{Clock: clk, Logger: logger, Metrics: cfg.Metrics})
	e.Exports = e.Exporter
	if !cfg.InProcessExports {
		e.Signal = &pipeline.ExportSignal{}
		e.Exports = e.Signal
	}
	g := cfg.Generator
	g.Clock, g.Logger, g.Metrics = clk, logger, cfg.Metrics
	g.Owner = fmt.Sprintf("batchgen-%d", os.Getpid())
	// SQLite writes are local and cheap: group results only while a write
	// is under way, so a kill costs no more repeated calls than were in
	// flight; and a transaction costs SQLite far more than a row in it, so
	// under load the group is as large as the store allows.
	g.FlushInterval, g.FlushRows = pipeline.FlushAtOnce, store.MaxSaveRows
	if g.Economy.Journal == nil {
		// Beside the rows: a killed run finds its provider batches (and
		// those an older version journaled in the blobs).
		g.Economy.Journal = pipeline.LegacyJournal{Journal: d.Store, Blobs: d.Blobs}
	}
	e.Generator = pipeline.NewGenerator(d.Store, router, e.Exports, g)
	return e, nil
}

// Resume makes a task whose previous run was killed runnable at once: the
// engine's process holds the data directory's lock, so every RUNNING lease
// belongs to a dead process (pipeline.Resume).
func (e *Engine) Resume(ctx context.Context, task store.Task) error {
	n, err := pipeline.Resume(ctx, e.Data.Store, e.Queue, task, time.Now())
	if err != nil {
		return err
	}
	if n > 0 {
		e.logger.Info("recovered unfinished batches", "task_id", task.ID, "batches", n)
	}
	return nil
}

// TaskRun says how RunTask works one task and reports on it.
type TaskRun struct {
	// Workers and SweepAfter are the WorkConfig's.
	Workers    int
	SweepAfter time.Duration
	// Tick is called about twice a second and whenever a batch finishes,
	// while the task runs (the progress line); may be nil.
	Tick func()
	// Cancelled is called once the task is seen cancelled, before the rows
	// in flight are waited for; may be nil.
	Cancelled func()
}

// ErrInterrupted is RunTask's error when its context ended first: the rows
// finished so far are saved, and running the task again continues it.
var ErrInterrupted = errors.New("interrupted")

// RunTask works task until its batches are all done, then exports it. A
// task cancelled meanwhile stops taking rows, lets the rows in flight
// finish, and is exported as it is (the partial result). It needs an
// engine whose exports are signalled (not InProcessExports), and returns
// ErrInterrupted (wrapped) when ctx ends first.
func (e *Engine) RunTask(ctx context.Context, task store.Task, r TaskRun) error {
	if e.Signal == nil {
		return errors.New("run task: the engine exports in process; RunTask exports itself")
	}
	tick := func() {
		if r.Tick != nil {
			r.Tick()
		}
	}
	work := Start(ctx, e.Data.Store, e.Queue, e.Generator, WorkConfig{
		Workers: r.Workers, Visibility: QueueVisibility, SweepAfter: r.SweepAfter, TaskID: task.ID, Exports: e.Signal, Logger: e.logger,
	})
	defer work.Stop()
	ticker := time.NewTicker(500 * time.Millisecond)
	defer ticker.Stop()
	for {
		t, err := e.Data.Store.GetTask(ctx, task.ID)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("read task %s: %w", task.ID, err)
		}
		if err == nil && t.State == store.TaskCancelled {
			if r.Cancelled != nil {
				r.Cancelled()
			}
			// Let the rows in flight finish: stop taking messages, wait
			// for the workers, keep their context alive.
			work.Drain()
			work.Wait(-1)
			// Its provider batches too, before this process exits.
			e.Generator.CancelProviderBatches(task.ID)
			tick()
			if _, err := e.Exporter.Export(ctx, task.ID); err != nil {
				return fmt.Errorf("export the partial result: %w", err)
			}
			return nil
		}
		if err == nil && (!t.State.Generating() || t.BatchesFinished()) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("task %s: %w; finished rows are saved in %s", task.ID, ErrInterrupted, e.Data.Dir)
		case <-e.Signal.C():
		case <-ticker.C:
		}
		tick()
	}
	work.Stop()
	tick()
	if _, err := e.Exporter.Export(ctx, task.ID); err != nil {
		return fmt.Errorf("%w; the rows are saved: fix the problem and run the same command again", err)
	}
	return nil
}

// RebuildLostResult exports a finished task again from its stored rows when
// its result file is gone from the data directory (deleted by hand, or a
// data directory restored without its results), so rerunning the job or
// `batchgen retry` writes the result again without a model call, as a
// re-dropped file does on AWS (pipeline.Reexport). It returns the task as
// it is afterwards.
func (e *Engine) RebuildLostResult(ctx context.Context, task store.Task) (store.Task, error) {
	if !task.CanReexport() {
		return task, nil
	}
	r, err := e.Data.Blobs.Open(ctx, task.ResultKey)
	if err == nil {
		return task, r.Close()
	}
	if !errors.Is(err, blob.ErrNotFound) {
		return task, fmt.Errorf("open result of task %s: %w", task.ID, err)
	}
	e.logger.Warn("result file missing; exporting the task again from its stored rows", "task_id", task.ID, "key", task.ResultKey)
	if _, err := pipeline.Reexport(ctx, e.Data.Store, e.Exporter, task, time.Now()); err != nil {
		return task, err
	}
	task, err = e.Data.Store.GetTask(ctx, task.ID)
	if err != nil {
		return task, fmt.Errorf("read task %s: %w", task.ID, err)
	}
	return task, nil
}

// CopyResult writes task's exported result to path atomically.
func (e *Engine) CopyResult(ctx context.Context, task store.Task, path string) error {
	if task.ResultKey == "" {
		return fmt.Errorf("task %s is %s and has no result file", task.ID, task.State)
	}
	src, err := e.Data.Blobs.Open(ctx, task.ResultKey)
	if err != nil {
		return fmt.Errorf("open result of task %s: %w", task.ID, err)
	}
	defer src.Close()
	if err := WriteFileAtomic(path, src); err != nil {
		return fmt.Errorf("write result %s: %w; the task is intact: fix the problem and run the same command again", path, UnwrapPathError(err))
	}
	return nil
}

// Finish writes the result of a task whose run has ended to path: the
// partial result of a cancelled task nobody exported yet, a result lost
// from the data directory rebuilt from the stored rows, then the copy. It
// returns the task as it is afterwards.
func (e *Engine) Finish(ctx context.Context, taskID, path string) (store.Task, error) {
	task, err := e.Data.Store.GetTask(ctx, taskID)
	if err != nil {
		return task, fmt.Errorf("read task %s: %w", taskID, err)
	}
	if task.NeedsExport() {
		// Cancelled: its partial result is this run's to write.
		if task, err = e.Exporter.Export(ctx, task.ID); err != nil {
			return task, fmt.Errorf("export the partial result: %w", err)
		}
	}
	if task, err = e.RebuildLostResult(ctx, task); err != nil {
		return task, err
	}
	return task, e.CopyResult(ctx, task, path)
}
