package pipeline

import (
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

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

// TaskProgress computes t's progress at now.
func TaskProgress(t store.Task, now time.Time) Progress {
	p := Progress{Done: t.RowsSucceeded + t.RowsFailed + t.RowsSkipped, Total: t.RowsTotal}
	end := now
	if t.State.Final() && !t.FinishedAt.IsZero() {
		end = t.FinishedAt
	}
	elapsed := end.Sub(t.CreatedAt).Seconds()
	if p.Done == 0 || elapsed <= 0 || t.CreatedAt.IsZero() {
		return p
	}
	p.RowsPerSecond = float64(p.Done) / elapsed
	if !t.State.Final() && p.Total > p.Done {
		p.ETA = time.Duration(float64(p.Total-p.Done) / p.RowsPerSecond * float64(time.Second))
	}
	return p
}
