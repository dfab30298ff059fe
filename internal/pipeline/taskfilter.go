package pipeline

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
)

// TaskFilter selects the tasks an operator's listing shows (batchgen
// tasks --state --since --limit).
type TaskFilter struct {
	// States keeps tasks in these states; empty: any.
	States []store.TaskState
	// Since keeps tasks created at or after it; zero: any.
	Since time.Time
	// Limit caps the tasks kept; 0: all.
	Limit int
}

// ParseTaskFilter reads a comma-separated list of states (any case) and a
// since (a duration back from now, or a date) as of now. Its errors start
// with the name of the part they blame (state, since).
func ParseTaskFilter(states, since string, now time.Time) (TaskFilter, error) {
	var f TaskFilter
	for _, s := range strings.Split(states, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		st := store.TaskState(strings.ToUpper(s))
		if !slices.Contains(store.TaskStates, st) {
			return f, fmt.Errorf("state %q: not a task state; use pending, running, exporting, succeeded, partial, failed or cancelled", s)
		}
		f.States = append(f.States, st)
	}
	since = strings.TrimSpace(since)
	if since == "" {
		return f, nil
	}
	if d, err := time.ParseDuration(since); err == nil && d >= 0 {
		f.Since = now.Add(-d)
		return f, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, since, time.Local); err == nil {
			f.Since = t
			return f, nil
		}
	}
	return f, fmt.Errorf("since %q: give a duration back from now (24h, 90m) or a date (2026-01-31, 2026-01-31 08:00, RFC 3339)", since)
}

// Fetch is how many tasks to read before filtering: all of them when a
// filter may drop some, so that Limit counts the tasks shown.
func (f TaskFilter) Fetch() int {
	if len(f.States) > 0 || !f.Since.IsZero() {
		return 0
	}
	return f.Limit
}

// Apply keeps the tasks f selects, in the order listed, at most Limit.
func (f TaskFilter) Apply(tasks []store.Task) []store.Task {
	out := tasks[:0:0]
	for _, t := range tasks {
		if len(f.States) > 0 && !slices.Contains(f.States, t.State) {
			continue
		}
		if !f.Since.IsZero() && t.CreatedAt.Before(f.Since) {
			continue
		}
		out = append(out, t)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out
}

// String describes the filter for a "no tasks" line ("" for none).
func (f TaskFilter) String() string {
	var parts []string
	if len(f.States) > 0 {
		names := make([]string, len(f.States))
		for i, s := range f.States {
			names[i] = string(s)
		}
		parts = append(parts, "in state "+strings.Join(names, " or "))
	}
	if !f.Since.IsZero() {
		parts = append(parts, "created since "+f.Since.Local().Format("2006-01-02 15:04"))
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, ", ")
}

// TaskOverview is one task of an operator's listing: its rows done as
// saved so far and its dead-lettered batch messages.
type TaskOverview struct {
	// Task has its row counters as saved so far (LiveCounts).
	Task store.Task
	// Dead counts the task's dead-lettered batch messages.
	Dead int
}

// DeadLetter is a dead-lettered message with the task and batch its body
// names (TaskID "" and BatchNo 0 when it is no batch message).
type DeadLetter struct {
	queue.Delivery
	TaskID  string
	BatchNo int
}

// ListDeadLetters lists up to max dead-lettered messages of dead, each with
// the task and batch it names.
func ListDeadLetters(ctx context.Context, dead queue.DeadLetters, max int) ([]DeadLetter, error) {
	ds, err := dead.ListDead(ctx, max)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out := make([]DeadLetter, len(ds))
	for i, d := range ds {
		out[i].Delivery = d
		if m, err := DecodeBatchMessage(d.Body); err == nil {
			out[i].TaskID, out[i].BatchNo = m.TaskID, m.BatchNo
		}
	}
	return out, nil
}

// maxDeadListed is how many dead letters a listing of tasks reads to count
// each task's.
const maxDeadListed = 1000

// ListTaskOverviews lists the tasks of st that f selects, newest first,
// with the rows each has saved (LiveCounts: a listing of its batches, as
// the API shows them) and, when dead is non-nil, its dead-lettered
// messages. Both runtimes' `batchgen tasks` are this.
func ListTaskOverviews(ctx context.Context, st store.Store, dead queue.DeadLetters, f TaskFilter) ([]TaskOverview, error) {
	tasks, err := st.ListTasks(ctx, f.Fetch())
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	tasks = f.Apply(tasks)
	perTask := map[string]int{}
	if dead != nil && len(tasks) > 0 {
		ds, err := ListDeadLetters(ctx, dead, maxDeadListed)
		if err != nil {
			return nil, err
		}
		for _, d := range ds {
			perTask[d.TaskID]++
		}
	}
	out := make([]TaskOverview, 0, len(tasks))
	for _, t := range tasks {
		live, err := LiveCounts(ctx, st, t)
		if err != nil {
			return nil, err
		}
		out = append(out, TaskOverview{Task: live, Dead: perTask[t.ID]})
	}
	return out, nil
}
