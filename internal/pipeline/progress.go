package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

// BatchLister lists a task's batches; store.Store is one.
type BatchLister interface {
	ListBatches(ctx context.Context, p store.ListBatchesParams) ([]store.Batch, error)
}

// LiveCounts returns t with its row counters as saved so far: the one
// source of the rows done that status, the event stream, the page and the
// CLI show. A task's own counters move a batch at a time (FinishBatch adds
// a whole batch), so while its batches are generated they lag by up to a
// batch per worker: a 400-row job would show 0% until its first batch
// finished. Each batch counts its rows as their groups are saved
// (store.Batch.Saved, kept in the same write as the rows), so the sum
// over the batches moves with every group. It is read only while the task
// generates and has unfinished batches (one batch listing: a query of the
// task's batch items on DynamoDB, no row read); a task that is exporting
// or finished has every batch in its counters already. Each count is at
// least the task's own (batches stored before they kept counts count
// nothing), and since a batch's counts only grow until a retry reopens it,
// a later reading never shows fewer rows done than an earlier one.
func LiveCounts(ctx context.Context, st BatchLister, t store.Task) (store.Task, error) {
	if !t.State.Sampling() || t.BatchesDone >= t.BatchesTotal {
		return t, nil
	}
	batches, err := st.ListBatches(ctx, store.ListBatchesParams{TaskID: t.ID})
	if err != nil {
		return t, fmt.Errorf("task %s: read progress: %w", t.ID, err)
	}
	var sum store.RowCounts
	for _, b := range batches {
		sum = sum.Add(b.Saved)
	}
	t.RowsSucceeded = max(t.RowsSucceeded, sum.Succeeded)
	t.RowsFailed = max(t.RowsFailed, sum.Failed)
	t.RowsSkipped = max(t.RowsSkipped, sum.Skipped)
	return t, nil
}

// Progress is how far a task has come and how fast it goes, as the status
// API reports it.
type Progress struct {
	// Done counts rows with a result (succeeded, failed or skipped).
	Done int
	// Total is the task's row count.
	Total int
	// RowsPerSecond is Done over the time since the task was created (until
	// it finished); 0 before the first row is done.
	RowsPerSecond float64
	// ETA is the time left at RowsPerSecond; zero when unknown (nothing
	// done yet) or when the task is final.
	ETA time.Duration
}

// TaskProgress computes t's progress at now, from its counters.
func TaskProgress(t store.Task, now time.Time) Progress {
	p := Progress{Done: t.RowsSucceeded + t.RowsFailed + t.RowsSkipped, Total: t.RowsTotal}
	if t.CreatedAt.IsZero() || t.State == store.TaskHeld {
		return p // a held task waits for its owner, not for its rows
	}
	p.RowsPerSecond, p.ETA = averagePace(t, p.Done, p.Total-p.Done, now)
	return p
}

// elapsed is the time from t's creation to its end, or to now while it
// runs.
func elapsed(t store.Task, now time.Time) time.Duration {
	end := now
	if t.State.Final() && !t.FinishedAt.IsZero() {
		end = t.FinishedAt
	}
	return max(end.Sub(t.CreatedAt), 0)
}

// averagePace is the average rate of task t since it began, done rows
// having a result, and the time the left rows take at it while it runs
// (zero when finished or unknown): the one average of TaskProgress and
// Status.
func averagePace(t store.Task, done, left int, now time.Time) (float64, time.Duration) {
	secs := elapsed(t, now).Seconds()
	if done <= 0 || secs <= 0 {
		return 0, 0
	}
	rate := float64(done) / secs
	if t.State.Final() || left <= 0 {
		return rate, 0
	}
	return rate, time.Duration(float64(left) / rate * float64(time.Second))
}

// RateMeter measures rows done per second over a recent window, and the
// time the rest takes at that rate: the one rate and ETA of the live
// displays (the CLI's progress line, the event stream the page reads),
// where TaskProgress is the average since a task began. It has no clock of
// its own: callers pass the time, so tests drive it with a fake one. It is
// not safe for concurrent use.
type RateMeter struct {
	// Window is how far back the rate looks: long enough to smooth a
	// batch's burst, short enough that a 429 pause shows within seconds.
	Window time.Duration
	// Quota, when positive, is the most rows a second the quota allows:
	// the ETA is never faster than it, and with no recent progress (a
	// pause) it is the ETA's pace.
	Quota   float64
	samples []rateSample
}

type rateSample struct {
	at   time.Time
	done int
}

// Add records that done rows had a result at at. Samples older than the
// window are dropped, keeping one at or before its start as the baseline;
// fewer rows done than before (rows reopened by a retry) starts over.
func (m *RateMeter) Add(at time.Time, done int) {
	if n := len(m.samples); n > 0 && done < m.samples[n-1].done {
		m.samples = m.samples[:0]
	}
	m.samples = append(m.samples, rateSample{at: at, done: done})
	cut := 0
	for cut < len(m.samples)-1 && at.Sub(m.samples[cut+1].at) >= m.Window {
		cut++
	}
	m.samples = m.samples[cut:]
}

// Done is the rows done at the last sample; 0 before any.
func (m *RateMeter) Done() int {
	if len(m.samples) == 0 {
		return 0
	}
	return m.samples[len(m.samples)-1].done
}

// Rate is rows done per second over the window (over all the samples
// until one window has passed); 0 while nothing was done in it.
func (m *RateMeter) Rate() float64 {
	if len(m.samples) < 2 {
		return 0
	}
	first, last := m.samples[0], m.samples[len(m.samples)-1]
	span := last.at.Sub(first.at).Seconds()
	if span <= 0 || last.done <= first.done {
		return 0
	}
	return float64(last.done-first.done) / span
}

// ETA is the time the rest of total rows takes at Rate, never faster than
// the quota, or at the quota's pace while nothing is done. ok is false when
// neither says anything.
func (m *RateMeter) ETA(total int) (eta time.Duration, ok bool) {
	left := total - m.Done()
	if left <= 0 {
		return 0, true
	}
	rate := m.Rate()
	if m.Quota > 0 && (rate <= 0 || rate > m.Quota) {
		rate = m.Quota
	}
	if rate <= 0 {
		return 0, false
	}
	return time.Duration(float64(left) / rate * float64(time.Second)), true
}
