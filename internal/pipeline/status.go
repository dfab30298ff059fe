package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

// LastFailuresShown is how many failed rows TaskStatus keeps as examples.
const LastFailuresShown = 5

// TaskStatus is what an operator asks about one task: how far it is, how
// fast, what failed and why, who answered. Status builds it the same way
// for every store. What the task used is on the task (Task.Usage, split by
// provider in Task.UsageByProvider), priced by pricing.Table.Task.
type TaskStatus struct {
	Task store.Task
	// Rows counts the task's rows by state, read from the rows themselves
	// (so rows of batches still running count too).
	Rows StatusRows
	// FailedByClass counts failed rows by error class.
	FailedByClass map[string]int
	// LastFailures are the last LastFailuresShown failed rows, in row order.
	LastFailures []FailedRow
	// Providers counts answered rows by the provider (and model) that
	// answered them; rows from the cache count under their provider.
	Providers map[string]int
	// Elapsed is from the task's creation to its end, or to now while it
	// runs.
	Elapsed time.Duration
	// Rate is rows finished per second over Elapsed.
	Rate float64
	// ETA is the time left at Rate for a running task; zero when finished
	// or unknown (ETAKnown false).
	ETA      time.Duration
	ETAKnown bool
	// WaitingOn names the provider batches an economy or auto task waits
	// on, as its journal tells (JournalWaitingOn); "" for none.
	WaitingOn string
}

// StatusRows counts a task's rows.
type StatusRows struct {
	Total, Succeeded, Failed, Skipped, Pending, Cached int
}

// FailedRow is one failed row, for showing what went wrong.
type FailedRow struct {
	No, SheetRow int
	Class, Error string
}

// statusPage is how many rows Status reads at a time.
const statusPage = 2000

// Status reads task id's status at now. It returns store.ErrNotFound
// (wrapped) for an unknown task.
func Status(ctx context.Context, st store.Store, id string, now time.Time) (TaskStatus, error) {
	t, err := st.GetTask(ctx, id)
	if err != nil {
		return TaskStatus{}, fmt.Errorf("status of task %s: %w", id, err)
	}
	s := TaskStatus{Task: t, FailedByClass: map[string]int{}, Providers: map[string]int{}}
	for next := 1; ; {
		rows, err := st.ListRows(ctx, store.ListRowsParams{TaskID: id, FromNo: next, Limit: statusPage})
		if err != nil {
			return TaskStatus{}, fmt.Errorf("status of task %s: rows from %d: %w", id, next, err)
		}
		for _, r := range rows {
			s.add(r)
			next = r.No + 1
		}
		if len(rows) < statusPage {
			break
		}
	}
	s.Elapsed = elapsed(t, now)
	var eta time.Duration
	s.Rate, eta = averagePace(t, s.Rows.Succeeded+s.Rows.Failed+s.Rows.Skipped, s.Rows.Pending, now)
	if !t.State.Final() && s.Rate > 0 {
		s.ETA, s.ETAKnown = eta.Round(time.Second), true
	}
	if j, ok := st.(store.ProviderBatches); ok && t.Mode.Batched() && !t.State.Final() {
		s.WaitingOn = journalWaitingOn(ctx, j, id)
	}
	return s, nil
}

func (s *TaskStatus) add(r store.Row) {
	s.Rows.Total++
	switch r.State {
	case store.RowSucceeded:
		s.Rows.Succeeded++
		if r.Cached {
			s.Rows.Cached++
		}
		if r.Provider != "" {
			s.Providers[r.Provider]++
		} else {
			s.Providers[ProviderLabel(s.Task.Spec)]++
		}
	case store.RowFailed:
		s.Rows.Failed++
		s.FailedByClass[r.ErrorClass]++
		s.LastFailures = append(s.LastFailures, FailedRow{No: r.No, SheetRow: r.SheetRow, Class: r.ErrorClass, Error: r.Error})
		if len(s.LastFailures) > LastFailuresShown {
			s.LastFailures = s.LastFailures[1:]
		}
	case store.RowSkipped:
		s.Rows.Skipped++
	default:
		s.Rows.Pending++
	}
}
