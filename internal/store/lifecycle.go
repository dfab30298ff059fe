package store

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The task lifecycle: its states, the events that move a task between them,
// and the rules derived from them. It is the one place that says which
// state a move may start from; every caller builds its TransitionTaskParams
// with TaskEvent.Params, and the adapters' ReopenTask ask EventReopen. A new
// path through the lifecycle (a provider batch job, a rerun of an edited
// workbook) adds an event here, not a From list at its call site.
//
//	PENDING ──split──▶ RUNNING ──export──▶ EXPORTING ──exported──▶ SUCCEEDED
//	   │  ╲                ▲  │                ╲──exported partial──▶ PARTIAL
//	   │   ╲──hold──▶ HELD ┘  │   (start; a quote's sample is answered while held)
//	   │   ╲──export──────────┼──▶ EXPORTING  (a fast worker can finish every
//	   │                      │                batch before the split's move)
//	   ├──reject──▶ FAILED    │
//	   └──cancel──▶ CANCELLED ◀──cancel──┘ (from HELD too)
//	CANCELLED ──exported cancelled──▶ CANCELLED (+ result)
//	SUCCEEDED, PARTIAL ──re-export──▶ EXPORTING (next export generation)
//	SUCCEEDED, PARTIAL, CANCELLED ──reopen──▶ RUNNING (next export generation)

// TaskState is the lifecycle state of a task.
type TaskState string

// Task states. PENDING while splitting, RUNNING while batches are generated,
// EXPORTING while the result file is written, then one of the final states.
// HELD is a task split but not started: it waits for its owner to read a
// quote (a sample of its rows is answered meanwhile) and start it.
const (
	TaskPending   TaskState = "PENDING"
	TaskHeld      TaskState = "HELD"
	TaskRunning   TaskState = "RUNNING"
	TaskExporting TaskState = "EXPORTING"
	TaskSucceeded TaskState = "SUCCEEDED"
	TaskPartial   TaskState = "PARTIAL"
	TaskFailed    TaskState = "FAILED"
	TaskCancelled TaskState = "CANCELLED"
)

// TaskStates are all task states, in lifecycle order.
var TaskStates = []TaskState{TaskPending, TaskHeld, TaskRunning, TaskExporting, TaskSucceeded, TaskPartial, TaskFailed, TaskCancelled}

// Final reports whether no further work will happen on a task in state s.
func (s TaskState) Final() bool {
	switch s {
	case TaskSucceeded, TaskPartial, TaskFailed, TaskCancelled:
		return true
	}
	return false
}

// Generating reports whether rows of a task in state s may still be
// generated: a worker that finds its task in another state (held,
// exporting, finished, cancelled) starts no row, but for a held task's
// sample (Sampling). They are the states a cancel applies to, but HELD.
func (s TaskState) Generating() bool { return s != TaskHeld && EventCancel.Allows(s) }

// Sampling reports whether a quote's sample of rows may be answered for a
// task in state s: a held task's, or a task already running (the sample
// then runs beside its batches).
func (s TaskState) Sampling() bool { return s == TaskHeld || s.Generating() }

// Held reports whether t waits for its owner's start after a quote: held,
// or split to be held and not yet recorded so. The split sends a sample's
// messages before it records the hold (a hold recorded first and a send
// that then failed would leave the task held with no sample coming), so a
// worker or the sweeper may meet a PENDING task with a sample: its batches
// are a held task's, answered for the sample only, never run whole.
func (t Task) Held() bool {
	return t.State == TaskHeld || t.State == TaskPending && t.Sample > 0
}

// TaskEvent names a move of the task lifecycle.
type TaskEvent string

// Task events; lifecycle holds each one's source states and target.
const (
	// EventSplit: the splitter wrote every row, batch and message.
	EventSplit TaskEvent = "split"
	// EventHold: the splitter wrote every row and batch of a task that asks
	// for a quote first (Terms.Sample): it sent only the sample's messages.
	EventHold TaskEvent = "hold"
	// EventStart: a held task's owner started it; its batches are sent.
	EventStart TaskEvent = "start"
	// EventReject: the input was refused (a split that died before the input
	// changed under it).
	EventReject TaskEvent = "reject"
	// EventExport: every batch is done; the export starts. PENDING is a
	// source because batches are enqueued before the split's own move.
	EventExport TaskEvent = "export"
	// EventExported: the result is written and every row succeeded or was
	// skipped.
	EventExported TaskEvent = "exported"
	// EventExportedPartial: the result is written with failed rows in it.
	EventExportedPartial TaskEvent = "exported partial"
	// EventExportedCancelled: the partial result of a cancelled task is
	// written; it stays CANCELLED with its result key.
	EventExportedCancelled TaskEvent = "exported cancelled"
	// EventCancel: an operator stopped the task (or decided, from its quote,
	// not to run a held one).
	EventCancel TaskEvent = "cancel"
	// EventReexport: a finished task's result is written again from its
	// stored rows (its file was deleted or expired), under the next export
	// generation.
	EventReexport TaskEvent = "re-export"
	// EventReopen: a finished or cancelled task's failed rows are put back to
	// work (retry), under the next export generation. The adapters'
	// ReopenTask make this move in their own write (it recounts the task).
	EventReopen TaskEvent = "reopen"
)

// move is one row of the transition table.
type move struct {
	from []TaskState
	to   TaskState
	// nextExportGen: the move starts another export of the same task, whose
	// export is started under a new name (Step Functions keeps a name for 90
	// days).
	nextExportGen bool
}

// lifecycle is the transition table.
var lifecycle = map[TaskEvent]move{
	EventSplit:             {from: []TaskState{TaskPending}, to: TaskRunning},
	EventHold:              {from: []TaskState{TaskPending}, to: TaskHeld},
	EventStart:             {from: []TaskState{TaskHeld}, to: TaskRunning},
	EventReject:            {from: []TaskState{TaskPending}, to: TaskFailed},
	EventExport:            {from: []TaskState{TaskPending, TaskRunning}, to: TaskExporting},
	EventExported:          {from: []TaskState{TaskExporting}, to: TaskSucceeded},
	EventExportedPartial:   {from: []TaskState{TaskExporting}, to: TaskPartial},
	EventExportedCancelled: {from: []TaskState{TaskCancelled}, to: TaskCancelled},
	EventCancel:            {from: []TaskState{TaskPending, TaskHeld, TaskRunning}, to: TaskCancelled},
	EventReexport:          {from: []TaskState{TaskSucceeded, TaskPartial}, to: TaskExporting, nextExportGen: true},
	EventReopen:            {from: []TaskState{TaskSucceeded, TaskPartial, TaskCancelled}, to: TaskRunning, nextExportGen: true},
}

// TaskEvents are all events, in the order of the table above.
var TaskEvents = []TaskEvent{EventSplit, EventHold, EventStart, EventReject, EventExport, EventExported, EventExportedPartial,
	EventExportedCancelled, EventCancel, EventReexport, EventReopen}

func (e TaskEvent) move() move {
	m, ok := lifecycle[e]
	if !ok {
		// Only a constant of this file names an event; another is a typo
		// in the code, found by the first test that takes the path.
		panic(fmt.Sprintf("store: unknown task event %q", e))
	}
	return m
}

// From returns the states e may start from.
func (e TaskEvent) From() []TaskState { return slices.Clone(e.move().from) }

// To returns the state e leads to.
func (e TaskEvent) To() TaskState { return e.move().to }

// Allows reports whether e may start from state s.
func (e TaskEvent) Allows(s TaskState) bool { return slices.Contains(e.move().from, s) }

// Params returns the conditional write that makes e happen to task id at
// now: its source states, its target, and whether it starts the next export
// generation. Callers add what the move records (Error, ResultKey).
func (e TaskEvent) Params(id string, now time.Time) TransitionTaskParams {
	m := e.move()
	return TransitionTaskParams{ID: id, From: slices.Clone(m.from), To: m.to, NextExportGen: m.nextExportGen, Now: now}
}

// JoinStates names states for people: "pending, running or exporting".
func JoinStates(states []TaskState) string {
	names := make([]string, len(states))
	for i, s := range states {
		names[i] = lower(s)
	}
	switch len(names) {
	case 0:
		return "?"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func lower(s TaskState) string { return strings.ToLower(string(s)) }

// ExportedEvent is the event that ends an export: a cancelled task keeps
// its state, a result with failed (or never started) rows is partial.
func ExportedEvent(cancelled bool, failedRows int) TaskEvent {
	switch {
	case cancelled:
		return EventExportedCancelled
	case failedRows > 0:
		return EventExportedPartial
	}
	return EventExported
}

// BatchesFinished reports whether every batch of t is done (a task is
// created with all its batches counted, so this never holds mid-split).
func (t Task) BatchesFinished() bool { return t.BatchesDone >= t.BatchesTotal }

// NeedsExport reports whether t's result is still to be written: every
// batch is done and the task is not finished (an export not yet started,
// or started and not done), or it was cancelled and its partial result was
// never written. It is the one rule the generator, the sweeper, retry, the
// exporter and the embedded runtime ask.
func (t Task) NeedsExport() bool {
	switch {
	case t.State == TaskCancelled:
		return t.ResultKey == ""
	case t.State.Final():
		return false
	}
	return t.BatchesFinished()
}

// Settled reports whether nothing more will happen to t on its own: it is
// final, and a cancelled task's partial result is written. A progress
// stream ends there.
func (t Task) Settled() bool { return t.State.Final() && !t.NeedsExport() }

// HasResult reports whether t's result workbook can be downloaded: a
// finished task with an exported workbook, a cancelled task's partial
// result included.
func (t Task) HasResult() bool { return t.State.Final() && t.ResultKey != "" }

// CanReexport reports whether t's result can be written again from its
// stored rows (EventReexport), when its file is gone.
func (t Task) CanReexport() bool { return EventReexport.Allows(t.State) && t.ResultKey != "" }
