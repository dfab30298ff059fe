package main

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/store"
)

// runStats counts what this process did, for the progress display and the
// summary. Row totals in the summary come from the store, which also knows
// rows finished by earlier, interrupted runs.
type runStats struct {
	calls       atomic.Int64
	rateLimited atomic.Int64
	// callErrors are failed calls other than 429s: a rate limit is the
	// provider pacing us, not a failure.
	callErrors atomic.Int64
	rowsDone   atomic.Int64
	rowsFailed atomic.Int64
	// last429 and lastQuotaWait are when (Unix nanoseconds) a call was
	// last answered 429, and when a wait for the quota limiter last took
	// long enough to slow the job: what the progress line names as the
	// reason the job is being held back.
	last429       atomic.Int64
	lastQuotaWait atomic.Int64

	mu      sync.Mutex
	classes map[string]int
}

func newRunStats() *runStats { return &runStats{classes: map[string]int{}} }

func (s *runStats) countCall(err error) {
	s.calls.Add(1)
	switch {
	case err == nil:
	case llm.Classify(err).Class == llm.ClassRateLimited:
		s.rateLimited.Add(1)
		s.last429.Store(time.Now().UnixNano())
	default:
		s.callErrors.Add(1)
	}
}

// quotaWaitWorthShowing is how long a wait for the quota limiter must take
// to count as the quota holding the job back.
const quotaWaitWorthShowing = 50 * time.Millisecond

// quotaWaited records a call's wait for its provider's quota
// (pipeline.RouterConfig.OnQuotaWait): a long one is what the progress line
// names as holding the job back.
func (s *runStats) quotaWaited(_ string, waited time.Duration) {
	if waited >= quotaWaitWorthShowing {
		s.lastQuotaWait.Store(time.Now().UnixNano())
	}
}

func (s *runStats) observe(e pipeline.Event) {
	if !e.State.Final() {
		return
	}
	s.rowsDone.Add(1)
	if e.State == store.RowFailed {
		s.rowsFailed.Add(1)
		s.mu.Lock()
		s.classes[e.ErrorClass]++
		s.mu.Unlock()
	}
}

// countDone counts rows already finished, so a continued run's progress
// starts where the last one stopped: the task's counts as saved so far
// (pipeline.LiveCounts: a listing of its batches, not of its rows).
func countDone(ctx context.Context, st store.Store, task store.Task) (int, error) {
	t, err := pipeline.LiveCounts(ctx, st, task)
	return t.Counts().Done(), err
}

// summarize is what `batchgen run` prints at the end, with the number of
// rows left without a result (failed, or never run in a cancelled task).
func summarize(ctx context.Context, st store.Store, task store.Task, stats *runStats, elapsed time.Duration, out string) (report.Summary, int, error) {
	// The core's one reading of the rows (pipeline.Status), so the run
	// summary and status agree; the cached rows are only known there.
	s, err := pipeline.Status(ctx, st, task.ID, time.Now())
	if err != nil {
		return report.Summary{}, 0, fmt.Errorf("count rows of task %s: %w", task.ID, err)
	}
	c := s.Rows
	stats.mu.Lock()
	classes := maps.Clone(stats.classes)
	stats.mu.Unlock()
	return report.Summary{
		Task: task,
		Rows: report.Rows{Total: c.Total, Succeeded: c.Succeeded, Failed: c.Failed, Skipped: c.Skipped},
		Counted: &report.Counted{
			Cached: c.Cached, Calls: stats.calls.Load(), RateLimited: stats.rateLimited.Load(), Errors: stats.callErrors.Load(),
			Classes: classes,
		},
		Elapsed: elapsed,
		Result:  out,
	}, c.Failed + c.Pending, nil
}
