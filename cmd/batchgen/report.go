package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

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
	callErrors  atomic.Int64
	rowsDone    atomic.Int64
	rowsFailed  atomic.Int64

	mu      sync.Mutex
	classes map[string]int
}

func newRunStats() *runStats { return &runStats{classes: map[string]int{}} }

func (s *runStats) countCall(err error) {
	s.calls.Add(1)
	if err == nil {
		return
	}
	s.callErrors.Add(1)
	if llm.Classify(err).Class == llm.ClassRateLimited {
		s.rateLimited.Add(1)
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
// starts where the last one stopped.
func countDone(ctx context.Context, st store.Store, task store.Task) (int, error) {
	c, err := countRows(ctx, st, task.ID)
	return c.succeeded + c.failed + c.skipped, err
}

type rowCounts struct{ total, succeeded, failed, skipped, cached, pending int }

func countRows(ctx context.Context, st store.Store, taskID string) (rowCounts, error) {
	var c rowCounts
	next := 1
	for {
		rows, err := st.ListRows(ctx, store.ListRowsParams{TaskID: taskID, FromNo: next, Limit: 2000})
		if err != nil {
			return c, fmt.Errorf("count rows of task %s: %w", taskID, err)
		}
		for _, r := range rows {
			c.total++
			switch r.State {
			case store.RowSucceeded:
				c.succeeded++
				if r.Cached {
					c.cached++
				}
			case store.RowFailed:
				c.failed++
			case store.RowSkipped:
				c.skipped++
			default:
				c.pending++
			}
			next = r.No + 1
		}
		if len(rows) < 2000 {
			return c, nil
		}
	}
}

// progress shows rows done on stderr: a bar on a terminal, plain lines
// every interval otherwise, nothing with --quiet.
type progress struct {
	w        io.Writer
	total    int
	base     int
	stats    *runStats
	bar      *progressbar.ProgressBar
	interval time.Duration
	start    time.Time
	last     time.Time
	quiet    bool
	finished bool
}

func newProgress(w io.Writer, total, done int, stats *runStats, quiet bool, interval time.Duration) *progress {
	p := &progress{w: w, total: total, base: done, stats: stats, interval: interval, start: time.Now(), last: time.Now(), quiet: quiet}
	if quiet {
		return p
	}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("rows"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("rows"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionSetWidth(30),
		)
		_ = p.bar.Set(done)
	}
	return p
}

func (p *progress) update() {
	if p.quiet || p.finished {
		return
	}
	done := p.base + int(p.stats.rowsDone.Load())
	failed := p.stats.rowsFailed.Load()
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("rows (%d failed)", failed))
		_ = p.bar.Set(min(done, p.total))
		return
	}
	if time.Since(p.last) < p.interval {
		return
	}
	p.last = time.Now()
	fmt.Fprintln(p.w, p.line(done, failed))
}

func (p *progress) line(done int, failed int64) string {
	elapsed := time.Since(p.start)
	rate := float64(done-p.base) / elapsed.Seconds()
	eta := "?"
	if rate > 0 {
		eta = (time.Duration(float64(p.total-done)/rate) * time.Second).Round(time.Second).String()
	}
	pct := 100 * float64(done) / float64(max(p.total, 1))
	return fmt.Sprintf("batchgen: %d/%d rows (%.0f%%), %d failed, %.1f rows/s, ETA %s", done, p.total, pct, failed, rate, eta)
}

func (p *progress) finish() {
	if p.quiet || p.finished {
		return
	}
	p.finished = true
	if p.bar != nil {
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}

// summarize is what `batchgen run` prints at the end, with the number of
// rows left without a result (failed, or never run in a cancelled task).
func summarize(ctx context.Context, st store.Store, task store.Task, stats *runStats, elapsed time.Duration, out string) (report.Summary, int, error) {
	c, err := countRows(ctx, st, task.ID)
	if err != nil {
		return report.Summary{}, 0, err
	}
	stats.mu.Lock()
	classes := maps.Clone(stats.classes)
	stats.mu.Unlock()
	return report.Summary{
		Task: task,
		Rows: report.Rows{Total: c.total, Succeeded: c.succeeded, Failed: c.failed, Skipped: c.skipped},
		Counted: &report.Counted{
			Cached: c.cached, Calls: stats.calls.Load(), RateLimited: stats.rateLimited.Load(), Errors: stats.callErrors.Load(),
			Classes: classes,
		},
		Elapsed: elapsed,
		Result:  out,
	}, c.failed + c.pending, nil
}
