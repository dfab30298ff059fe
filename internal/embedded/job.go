package embedded

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/providers"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/store"
)

// Job is one command's work on the embedded runtime (run, quote, retry,
// serve): its checked settings, its data directory, and the engine over
// it with the providers and the counts of their calls.
type Job struct {
	Settings Settings
	Checked
	Logger *slog.Logger
	// Metrics receives the engine's metrics (serve's /metrics); nil
	// records nothing.
	Metrics metrics.Recorder
	Started time.Time

	// Data is the data directory, once OpenData opened it.
	Data *DataDir
	// Engine, Set and Stats are the engine, its providers and the counts
	// of their calls, once OpenEngine built them.
	Engine *Engine
	Set    *providers.Set
	Stats  *Stats
}

// NewJob checks s (Settings.Check) and returns its Job, logging as text
// to stderr.
func NewJob(s Settings, stderr io.Writer) (*Job, error) {
	c, err := s.Check()
	if err != nil {
		return nil, err
	}
	return &Job{Settings: s, Checked: c, Logger: c.Logger(stderr), Started: time.Now()}, nil
}

// OpenData opens the data directory dir, or the .batchgen folder beside
// input when dir is empty (Open).
func (j *Job) OpenData(dir, input string) error {
	d, err := Open(dir, input, j.CacheTTL)
	if err != nil {
		return err
	}
	j.Data = d
	return nil
}

// OpenEngine builds the engine cfg asks for over the opened data
// directory, with the job's providers and generator settings.
func (j *Job) OpenEngine(cfg EngineConfig) error {
	s := j.Settings
	j.Stats = NewStats()
	set, err := Providers(context.Background(), j.Providers, j.Stats, j.Logger, j.Metrics)
	if err != nil {
		return &report.ExitError{Code: report.Rejected, Err: err}
	}
	j.Set = set
	cfg.Logger, cfg.Metrics = j.Logger, j.Metrics
	cfg.Generator = pipeline.GeneratorConfig{
		Observer: j.Stats.Observe,
		// Rows in flight: every provider's slots can be busy at once.
		Concurrency: j.Providers.Concurrency(), Lease: s.Retry.Lease, CallTimeout: set.Router.MaxTimeout(),
		CallsPerRound: s.Retry.CallsPerRound, Rounds: s.Retry.Rounds, RetryDelays: j.RetryDelays,
		PackTokens: j.Providers.PackTokens(), CacheScope: cmp.Or(s.CacheScope, pipeline.CacheShared),
		Prices:  j.Prices,
		Economy: pipeline.EconomyConfig{Poll: s.BatchPoll, OnlineRate: j.Providers.OnlineRate()},
	}
	if mode := pipeline.CacheMode(s.CacheMode); !s.NoCache && mode != pipeline.CacheOff {
		cfg.Generator.Cache, cfg.Generator.CacheMode = j.Data.Store, mode
	}
	j.Engine, err = NewEngine(j.Data, set.Router, cfg)
	return err
}

// Close releases the data directory.
func (j *Job) Close() {
	if j.Data != nil {
		j.Data.Close()
	}
}

// ApplyTerms gives task the cap, mode and deadline the settings ask for,
// if they ask for others than the task's (a task keeps its terms from run
// to run).
func (j *Job) ApplyTerms(ctx context.Context, task store.Task) (store.Task, error) {
	terms := j.Settings.Terms(task.Terms)
	if terms == task.Terms {
		return task, nil
	}
	t, err := j.Data.Store.SetTerms(ctx, task.ID, terms)
	if err != nil {
		return task, fmt.Errorf("set the terms of task %s: %w", task.ID, err)
	}
	return t, nil
}

// Finish writes the result of a task whose rows are done to out (a
// cancelled task's partial one too) and returns the run's summary and the
// task's failed rows.
func (j *Job) Finish(ctx context.Context, taskID, out string) (store.Task, report.Summary, int, error) {
	task, err := j.Engine.Finish(ctx, taskID, out)
	if err != nil {
		return task, report.Summary{}, 0, err
	}
	summary, failed, err := Summarize(ctx, j.Data.Store, task, j.Stats, time.Since(j.Started), out)
	if err != nil {
		return task, summary, failed, err
	}
	summary.Prices = j.Prices
	if s, ok := j.Engine.Generator.EconomyStatus(task.ID); ok {
		if summary.Counted != nil {
			summary.Counted.BatchLines, summary.Counted.ProviderBatches = s.Lines, s.Sent
		}
		if s.Online {
			summary.Notes = append(summary.Notes, "auto: the rest went online at "+s.Why)
		}
	}
	for _, name := range j.Set.JSONMode() {
		summary.Notes = append(summary.Notes, fmt.Sprintf("provider %s refused structured outputs: the columns were asked for in JSON mode, every answer checked", name))
	}
	return task, summary, failed, nil
}
