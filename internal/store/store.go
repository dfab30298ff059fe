// Package store is the task store port: tasks, their batches and their rows.
//
// The pipeline is written against Store; adapters live in sub-packages
// (sqlitestore for the embedded runtime, dynamostore for AWS) and all pass the
// conformance suite in storetest. Every state change that two workers could
// race on is a single conditional write in the adapter, never read-then-write
// in the caller.
package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/schema"
)

// ErrNotFound is returned when the task, batch or row does not exist.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when a conditional write did not apply: the task
// already exists, the batch is owned by someone else, or the caller's attempt
// was fenced out by a newer one.
var ErrConflict = errors.New("conflict")

// BatchState is the lifecycle state of a batch.
type BatchState string

// Batch states.
const (
	BatchPending BatchState = "PENDING"
	BatchRunning BatchState = "RUNNING"
	BatchDone    BatchState = "DONE"
)

// RowState is the state of one row's result.
type RowState string

// Row states. SKIPPED marks a blank input row that is kept in place in the
// result but never sent to the model.
const (
	RowPending   RowState = "PENDING"
	RowSucceeded RowState = "SUCCEEDED"
	RowFailed    RowState = "FAILED"
	RowSkipped   RowState = "SKIPPED"
)

// Final reports whether a row in state s has its result.
func (s RowState) Final() bool { return s == RowSucceeded || s == RowFailed || s == RowSkipped }

// TaskSpec is what a task runs: the prompt and the model settings. It is part
// of the task id, so changing any of it starts a new task.
type TaskSpec struct {
	// Prompt is the row template with {{column}} placeholders.
	Prompt string `json:"prompt"`
	// System is the system prompt; empty for none.
	System string `json:"system,omitempty"`
	// Provider names the model provider ("sim", "openai").
	Provider string `json:"provider"`
	// Model is the provider's model name.
	Model string `json:"model,omitempty"`
	// Temperature, when non-nil, is sent to the model.
	Temperature *float64 `json:"temperature,omitempty"`
	// TopP, when non-nil, is sent to the model.
	TopP *float64 `json:"top_p,omitempty"`
	// MaxTokens caps the completion length; 0 means the provider's default.
	MaxTokens int `json:"max_tokens,omitempty"`
	// BatchSize is the number of rows per batch.
	BatchSize int `json:"batch_size"`
	// ResultFormat is the file the result is written as: a workbook (the
	// default) or a CSV file.
	ResultFormat ResultFormat `json:"result_format,omitempty"`
	// Columns are the task's declared output columns: each answer is a
	// JSON object of their shape, checked before its row succeeds, and
	// the result gets a typed column for each, in order, instead of the
	// one text output column. Empty for a free-text task. Part of the
	// task's id: the same sheet asked for other columns is another task.
	Columns schema.Columns `json:"columns,omitempty"`
	// RowsPerCall packs up to that many rows into one model call (one
	// answer per row id); 0 or 1 calls once per row. Part of the task's id
	// and of its cache keys.
	RowsPerCall int `json:"rows_per_call,omitempty"`
}

// Terms are how a task may be run, apart from what it asks (its spec):
// what it may spend, whether its rows go to the provider's batch API, and
// by when it must be done. They change without changing the task.
type Terms struct {
	// MaxCost caps what the task may spend on model calls, in the price
	// table's currency (USD); 0 for no cap.
	MaxCost float64 `json:"max_cost,omitempty"`
	// Mode says how the rows are called: online (the default), economy
	// (the provider's batch API, at about half price, within hours) or
	// auto (economy until the Deadline needs the rest online).
	Mode Mode `json:"mode,omitempty"`
	// Deadline is when an auto task must be done; zero for none.
	Deadline time.Time `json:"deadline,omitzero"`
	// Sample, when positive, asks for a quote before the task runs: the
	// split holds it (HELD) and answers that many of its rows first, and
	// its owner starts it (EventStart) after reading the quote. The task
	// keeps the sample's answers. 0 starts the task at once.
	Sample int `json:"sample,omitempty"`
}

// Mode is how a task's rows are called (Terms.Mode).
type Mode string

// Modes.
const (
	// ModeOnline calls the model row by row under the quota: the default.
	ModeOnline Mode = ""
	// ModeEconomy sends the rows to the provider's batch API: about half
	// the price, answers within the provider's window (up to 24 hours).
	// Retryable failures go into the next batch.
	ModeEconomy Mode = "economy"
	// ModeAuto is economy until the deadline leaves just the time the
	// unanswered rows need online; then the provider's batches are
	// cancelled, every answer they returned is kept, and the rest is
	// called online.
	ModeAuto Mode = "auto"
)

// ParseMode reads a mode as people and requests name it: online (or ""),
// economy or auto, in any letter case.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "online":
		return ModeOnline, nil
	case "economy":
		return ModeEconomy, nil
	case "auto":
		return ModeAuto, nil
	}
	return "", fmt.Errorf("mode %q: use online, economy or auto", s)
}

// String is the mode as people name it.
func (m Mode) String() string {
	if m == ModeOnline {
		return "online"
	}
	return string(m)
}

// Batched reports whether the mode sends rows to the provider's batch API
// (at first, for auto).
func (m Mode) Batched() bool { return m == ModeEconomy || m == ModeAuto }

// UpdateTerms changes some of a task's terms and keeps the rest: it reads
// the task, applies change to its terms and writes them back (SetTerms)
// when they changed. It returns the task as it is afterwards.
func UpdateTerms(ctx context.Context, s Store, taskID string, change func(*Terms)) (Task, error) {
	t, err := s.GetTask(ctx, taskID)
	if err != nil {
		return t, err
	}
	terms := t.Terms
	change(&terms)
	if terms.MaxCost == t.MaxCost && terms.Mode == t.Mode && terms.Deadline.Equal(t.Deadline) {
		return t, nil
	}
	return s.SetTerms(ctx, taskID, terms)
}

// ResultFormat is the kind of file a task's result is.
type ResultFormat string

const (
	// ResultWorkbook, the default, is an xlsx workbook: the user's own for
	// a workbook input, a new one for a CSV input.
	ResultWorkbook ResultFormat = ""
	// ResultCSV is a CSV file: the input's fields, then the result
	// columns, in UTF-8 with a byte-order mark (so Excel reads it as
	// UTF-8) and the input's delimiter.
	ResultCSV ResultFormat = "csv"
)

// ParseResultFormat reads a result format as people and requests name it:
// "xlsx" (or "") for a workbook, "csv" for a CSV file, in any letter case.
func ParseResultFormat(s string) (ResultFormat, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "xlsx":
		return ResultWorkbook, nil
	case "csv":
		return ResultCSV, nil
	}
	return "", fmt.Errorf("result format %q: use xlsx or csv", s)
}

// Ext is the file name extension of a result in format f.
func (f ResultFormat) Ext() string {
	if f == ResultCSV {
		return ".csv"
	}
	return ".xlsx"
}

// ContentType is the media type of a result in format f.
func (f ResultFormat) ContentType() string {
	if f == ResultCSV {
		return "text/csv; charset=utf-8"
	}
	return "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
}

// RerunCounts says what became of the rows of a result sent back in (a result batchgen wrote, edited and sent
// again): the task made of it records them, and the API and `batchgen status` show them.
type RerunCounts struct {
	// Kept rows answered before, with the same input and template, keep their answer: no model call.
	Kept int `json:"kept"`
	// Changed rows had their input or the template changed; New rows were added by the user (no key).
	Changed int `json:"changed"`
	New     int `json:"new"`
	// Cleared rows had their answer deleted by the user, Flagged ones something in the rerun column: both get a
	// new answer, never the cached one.
	Cleared int `json:"cleared"`
	Flagged int `json:"flagged"`
	// Failed rows had not succeeded (failed, not_started).
	Failed int `json:"failed"`
	// Blank rows have no input; they stay skipped.
	Blank int `json:"blank"`
	// From is the task whose result this is: the one its first row key names (a result's hidden keys name the
	// task that wrote them). Empty when no key names one (a result written before keys did).
	From string `json:"from,omitempty"`
}

// ToRun is the number of rows that go to the model.
func (c RerunCounts) ToRun() int { return c.Changed + c.New + c.Cleared + c.Flagged + c.Failed }

// String is the summary line people read.
func (c RerunCounts) String() string {
	s := fmt.Sprintf("%d rows to run: %d kept, %d changed, %d cleared, %d flagged, %d failed", c.ToRun(), c.Kept, c.Changed, c.Cleared, c.Flagged, c.Failed)
	if c.From != "" {
		s = "continues task " + c.From + ": " + s
	}
	if c.New > 0 {
		s += fmt.Sprintf(", %d new", c.New)
	}
	return s
}

// Task is one spreadsheet job.
type Task struct {
	ID    string
	State TaskState
	Spec  TaskSpec
	// Owner is the principal the task belongs to: an API caller's name, the
	// drop folder's configured principal, or "local" for the CLI. Only its
	// owner sees a task through the API (see pipeline.OwnedTask). Empty on
	// tasks stored before owners were recorded, which no principal owns.
	Owner string
	// Source names the input for people: a file name or an object key.
	Source string
	// Sheet is the name of the input sheet the rows came from.
	Sheet string
	// Encoding is the text encoding a CSV input was read with ("utf-8", "windows-1252", "gb18030", ...), detected
	// or as asked for; "" for xlsx input.
	Encoding string
	// Delimiter is the field separator a CSV input was read with (",",
	// ";", "\t", ...), which a CSV result keeps; "" for xlsx input.
	Delimiter string
	// Header holds the input column names in input order.
	Header []string
	// Rerun, for a task made of a result sent back in, says what became of its rows; nil for any other.
	Rerun *RerunCounts

	RowsTotal     int
	BatchesTotal  int
	BatchesDone   int
	RowsSucceeded int
	RowsFailed    int
	RowsSkipped   int

	// Usage sums the tokens of the rows of the task's finished batches
	// (added by FinishBatch, recounted by a reopen), for the estimated cost.
	Usage Usage
	// UsageByProvider splits Usage by the provider label the rows record
	// ("openai/gpt-4o-mini", a providers-file entry's name; "" for rows
	// without one), maintained by the same writes as Usage, so a task
	// routed over providers of different prices is priced exactly without
	// reading its rows. Only labels with tokens appear; nil for a task
	// without any, and for tokens counted before the store kept the split
	// (then its sum falls short of Usage: see UsageUnattributed).
	UsageByProvider map[string]Usage

	// Terms are how the task may be run: its spending cap, its mode and
	// its deadline. They are not part of the spec (nor of the task's id):
	// a task stopped at its cap, or run online after waiting in economy,
	// is the same task with new terms (SetTerms).
	Terms

	// ResultKey is the blob key of the exported result, once exported.
	ResultKey string
	// ExportGen counts the times the task was reopened (retried) after an
	// export. Each export round is started once under a name that includes
	// it (Step Functions keeps an execution name for 90 days), so a retried
	// task can be exported again.
	ExportGen int
	// Error says why the task FAILED, or the first export error.
	Error string

	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
}

// TaskCursor is a task's place in an owner's listing, which is ordered by
// creation time, then id, both descending.
type TaskCursor struct {
	CreatedAt time.Time
	ID        string
}

// Cursor returns t's place in its owner's listing, to resume a listing
// after it.
func (t Task) Cursor() TaskCursor { return TaskCursor{CreatedAt: t.CreatedAt, ID: t.ID} }

// ListTasksByOwnerParams selects one owner's tasks, newest first.
type ListTasksByOwnerParams struct {
	// Owner is the principal whose tasks are listed; required.
	Owner string
	// After, when its ID is set, resumes the listing after that task: the
	// page starts with the next older task.
	After TaskCursor
	// Limit caps the result; 0 means no limit.
	Limit int
}

// Batch is a contiguous range of rows claimed and processed as one unit.
type Batch struct {
	TaskID string
	No     int
	// FirstRow is the No of the batch's first row; rows FirstRow..FirstRow+RowCount-1 belong to it.
	FirstRow int
	RowCount int
	State    BatchState
	// Attempt counts claims; it is the fencing token for writes by the claim's owner.
	Attempt int
	// LeaseUntil is when a RUNNING batch's claim expires and another worker may take it.
	LeaseUntil time.Time
	// Owner identifies the worker holding the claim, for operators.
	Owner string
	// LastError is the last retryable error that made the batch be released.
	LastError string
	// Saved counts the batch's rows that hold a final result: those final
	// when it was put (skipped, or kept from a result sent back in), plus
	// each row SaveRowResults writes final; FinishBatch sets it to the
	// batch's counts and ReopenTask recounts it. Progress reads it (the
	// sum over a task's batches moves with every group saved, where the
	// task's counters move a batch at a time) without reading rows.
	Saved     RowCounts
	CreatedAt time.Time
	UpdatedAt time.Time
}

// RowCounts counts rows by final state.
type RowCounts struct {
	Succeeded int
	Failed    int
	Skipped   int
}

// Done is the number of rows counted: those with a final result.
func (c RowCounts) Done() int { return c.Succeeded + c.Failed + c.Skipped }

// Add returns c and o added.
func (c RowCounts) Add(o RowCounts) RowCounts {
	return RowCounts{Succeeded: c.Succeeded + o.Succeeded, Failed: c.Failed + o.Failed, Skipped: c.Skipped + o.Skipped}
}

// Count returns c with one more row in state s; a state that is not final
// is not counted.
func (c RowCounts) Count(s RowState) RowCounts {
	switch s {
	case RowSucceeded:
		c.Succeeded++
	case RowFailed:
		c.Failed++
	case RowSkipped:
		c.Skipped++
	}
	return c
}

// Saved counts the rows p writes with a final result: what p adds to its
// batch's Saved.
func (p SaveRowResultsParams) Saved() RowCounts {
	var c RowCounts
	for _, w := range p.Rows {
		c = c.Count(w.Result.State)
	}
	return c
}

// Counts returns the task's row counters as RowCounts.
func (t Task) Counts() RowCounts {
	return RowCounts{Succeeded: t.RowsSucceeded, Failed: t.RowsFailed, Skipped: t.RowsSkipped}
}

// Row is one input row and, once known, its result.
type Row struct {
	TaskID string
	// No numbers data rows from 1 in input order.
	No int
	// SheetRow is the 1-based row number in the input sheet, for messages.
	SheetRow int
	// Values are the input cells, one per header column.
	Values []string
	// Fresh asks for a new answer: the result cache is not read for the
	// row (a row the user flagged or cleared in a result sent back in).
	Fresh bool
	RowResult
}

// RowResult is what generating one row produced.
type RowResult struct {
	State  RowState
	Output string
	// Error is a human-readable reason for a FAILED row.
	Error string
	// ErrorClass is the machine-readable failure class (see package llm).
	ErrorClass string
	// Attempts counts model calls made for the row.
	Attempts int
	// LatencyMS is the latency of the call that produced the result.
	LatencyMS int64
	// Cached is true when the output came from the result cache.
	Cached bool
	// Provider names the provider (and model, or route) that answered; ""
	// for a row that no provider answered (cached, failed before a call).
	Provider string
	// Usage is the tokens the call that produced the result was billed
	// for; zero for a cached row or when the provider reported none.
	Usage
}

// Usage counts tokens. It mirrors llm.Usage; the store does not import the
// provider port.
type Usage struct {
	// InputTokens counts prompt tokens, CachedInputTokens included.
	InputTokens int64
	// OutputTokens counts completion tokens.
	OutputTokens int64
	// CachedInputTokens is the part of InputTokens the provider served from
	// its prompt cache (billed at the cached-input price where it has one).
	CachedInputTokens int64
}

// Add returns the sum of u and v.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		InputTokens:       u.InputTokens + v.InputTokens,
		OutputTokens:      u.OutputTokens + v.OutputTokens,
		CachedInputTokens: u.CachedInputTokens + v.CachedInputTokens,
	}
}

// Sub returns u minus v.
func (u Usage) Sub(v Usage) Usage {
	return Usage{
		InputTokens:       u.InputTokens - v.InputTokens,
		OutputTokens:      u.OutputTokens - v.OutputTokens,
		CachedInputTokens: u.CachedInputTokens - v.CachedInputTokens,
	}
}

// negative reports whether any count of u is below zero.
func (u Usage) negative() bool {
	return u.InputTokens < 0 || u.OutputTokens < 0 || u.CachedInputTokens < 0
}

// SumUsage adds up per-provider token sums.
func SumUsage(byProvider map[string]Usage) Usage {
	var sum Usage
	for _, u := range byProvider {
		sum = sum.Add(u)
	}
	return sum
}

// UsageUnattributed is the part of t's Usage that UsageByProvider does not
// split: tokens of batches finished before the store kept the split. It is
// zero for every task counted since.
func (t Task) UsageUnattributed() Usage {
	rest := t.Usage.Sub(SumUsage(t.UsageByProvider))
	return Usage{
		InputTokens:       max(rest.InputTokens, 0),
		OutputTokens:      max(rest.OutputTokens, 0),
		CachedInputTokens: max(rest.CachedInputTokens, 0),
	}
}

// TransitionTaskParams moves a task between states.
type TransitionTaskParams struct {
	ID string
	// From lists the states the task may be in; otherwise ErrConflict.
	From []TaskState
	To   TaskState
	// Error, when non-empty, is recorded on the task.
	Error string
	// ResultKey, when non-empty, is recorded on the task.
	ResultKey string
	// NextExportGen bumps the task's ExportGen by one, for a transition
	// that starts another export of the same task (a re-export).
	NextExportGen bool
	// Recount, when non-nil, replaces the task's row counts and token sums:
	// a cancelled task's partial export counts them from its rows, whose
	// batches never finished to count them.
	Recount *TaskRecount
	Now     time.Time
}

// String names the transition, for the errors a store returns from it.
func (p TransitionTaskParams) String() string {
	return fmt.Sprintf("transition task %s to %s", p.ID, p.To)
}

// Check returns what is wrong with p before a store touches the task: no
// target state. An empty From is allowed (nothing may change, and the
// store still tells a missing task from a present one).
func (p TransitionTaskParams) Check() error {
	if p.To == "" {
		return fmt.Errorf("%s: empty target state", p)
	}
	return nil
}

// TaskRecount is what a task's rows add up to: the rows per final state,
// and the tokens, in all and per provider label.
type TaskRecount struct {
	Rows       RowCounts
	Total      Usage
	ByProvider map[string]Usage
}

// ListRowsParams selects rows of a task in row order.
type ListRowsParams struct {
	TaskID string
	// FromNo is the first row number, inclusive.
	FromNo int
	// ToNo is the last row number, inclusive; 0 means no upper bound.
	ToNo int
	// Limit caps the number of rows returned; 0 means no limit.
	Limit int
}

// ClaimBatchParams claims a batch for a worker.
type ClaimBatchParams struct {
	TaskID  string
	BatchNo int
	Owner   string
	Now     time.Time
	// LeaseUntil is when the claim expires unless renewed.
	LeaseUntil time.Time
}

// RenewLeaseParams extends the lease of a claimed batch.
type RenewLeaseParams struct {
	TaskID     string
	BatchNo    int
	Attempt    int
	LeaseUntil time.Time
	Now        time.Time
}

// ReleaseBatchParams hands a claimed batch back for a later attempt.
type ReleaseBatchParams struct {
	TaskID    string
	BatchNo   int
	Attempt   int
	LastError string
	Now       time.Time
}

// MaxSaveRows is the most row results one SaveRowResults call may carry
// (and, with them, as many cache entries): DynamoDB writes a group in one
// transaction of at most 100 items.
const MaxSaveRows = 40

// RowResultWrite is one row's result in a SaveRowResults group.
type RowResultWrite struct {
	RowNo  int
	Result RowResult
}

// MaxSaveBytes bounds what one SaveRowResults call carries, as
// SaveRowResultsParams.Size estimates it: DynamoDB writes a group in one
// transaction of at most 4 MB in all, and this leaves room for what the
// estimate leaves out. Callers split larger groups (a single row over it
// still goes alone; the store refuses what it cannot hold).
const MaxSaveBytes = 3 << 20

// saveItemOverhead is Size's allowance per item for its keys and the
// attributes whose size does not vary (states, counts, times).
const saveItemOverhead = 512

// SaveSize is what w adds to a group's Size.
func (w RowResultWrite) SaveSize() int {
	r := w.Result
	return saveItemOverhead + len(r.Output) + len(r.Error) + len(r.ErrorClass) + len(r.Provider)
}

// SaveSize is what c adds to a group's Size.
func (c CacheEntry) SaveSize() int { return saveItemOverhead + len(c.Key) + len(c.Output) }

// CacheEntry is one model output to remember under its cache key (see
// Cache).
type CacheEntry struct {
	Key    string
	Output string
}

// SaveRowResultsParams records a group of row results under a claim.
type SaveRowResultsParams struct {
	TaskID  string
	BatchNo int
	// Attempt is the claim's attempt; the write is fenced on it.
	Attempt int
	// Rows are the results, at most MaxSaveRows, each row at most once.
	Rows []RowResultWrite
	// Cache entries, at most MaxSaveRows, are put into the store's result
	// cache in the same write, put-if-absent (an existing entry is kept).
	// An entry too large for the backend is left out: the cache only saves
	// calls, it never decides a result.
	Cache []CacheEntry
	Now   time.Time
}

// Size estimates the bytes p writes, to hold against MaxSaveBytes.
func (p SaveRowResultsParams) Size() int {
	n := saveItemOverhead // the batch's fence
	for _, w := range p.Rows {
		n += w.SaveSize()
	}
	for _, c := range p.Cache {
		n += c.SaveSize()
	}
	return n
}

// SaveRowResultsResult is what the store learnt while saving a group.
type SaveRowResultsResult struct {
	// TaskCancelled reports that the batch's task was cancelled: the
	// results were saved, and the caller should start no new row. It is
	// how cancellation reaches a running batch without polling the task.
	TaskCancelled bool
}

// TouchBatchParams records that the sweeper acted on a PENDING batch.
type TouchBatchParams struct {
	TaskID  string
	BatchNo int
	// Attempt is the attempt the sweeper saw; the touch is fenced on it.
	Attempt int
	Now     time.Time
}

// FinishBatchParams completes a claimed batch and counts it into its task.
type FinishBatchParams struct {
	TaskID    string
	BatchNo   int
	Attempt   int
	Succeeded int
	Failed    int
	Skipped   int
	// Usage is the sum of the tokens of the batch's rows, added to the
	// task's Usage.
	Usage Usage
	// UsageByProvider splits Usage by the rows' provider labels, added to
	// the task's UsageByProvider; its sum must be Usage (Check). Labels
	// without tokens may be left out.
	UsageByProvider map[string]Usage
	Now             time.Time
}

// Check rejects counts a store must not add to a task: negative ones, and a
// per-provider split that does not add up to Usage (the task's two sums
// would disagree for good). Every adapter's FinishBatch calls it.
func (p FinishBatchParams) Check() error {
	if p.Succeeded < 0 || p.Failed < 0 || p.Skipped < 0 {
		return errors.New("negative row count")
	}
	if p.Usage.negative() {
		return errors.New("negative token count")
	}
	for label, u := range p.UsageByProvider {
		if u.negative() {
			return fmt.Errorf("negative token count for provider %q", label)
		}
	}
	if len(p.UsageByProvider) > 0 || p.Usage != (Usage{}) {
		if sum := SumUsage(p.UsageByProvider); sum != p.Usage {
			return fmt.Errorf("tokens per provider add up to %+v, not the batch's %+v", sum, p.Usage)
		}
	}
	return nil
}

// ListBatchesParams selects batches of a task.
type ListBatchesParams struct {
	TaskID string
	// States, when non-empty, keeps only batches in these states.
	States []BatchState
}

// ListOpenBatchesParams selects unfinished batches across all tasks.
type ListOpenBatchesParams struct {
	// UpdatedBefore keeps batches last changed (created, claimed, renewed or
	// released) before this time.
	UpdatedBefore time.Time
	// After, when its TaskID is set, resumes a listing after that place in
	// the index: the next page starts with the batch that follows it, so a
	// caller pages through every open batch however many there are.
	After OpenCursor
	// Limit caps the result; 0 means no limit.
	Limit int
}

// OpenCursor is a batch's place in the open-batches index, which is ordered
// by last change, then task, then batch number.
type OpenCursor struct {
	UpdatedAt time.Time
	TaskID    string
	No        int
}

// Cursor returns b's place in the open-batches index, to resume a listing
// after it.
func (b Batch) Cursor() OpenCursor {
	return OpenCursor{UpdatedAt: b.UpdatedAt, TaskID: b.TaskID, No: b.No}
}

// ParkBatchParams takes an open batch out of the open-batches index.
type ParkBatchParams struct {
	TaskID  string
	BatchNo int
	// UpdatedAt is the batch's last change as the caller saw it; the park
	// is fenced on it, so a batch changed meanwhile (claimed, reopened)
	// stays in the index.
	UpdatedAt time.Time
}

// Store persists tasks, batches and rows.
//
// All methods are safe for concurrent use. Conditional methods return
// ErrConflict when their condition does not hold and change nothing then.
type Store interface {
	// CreateTask inserts a new task. It returns ErrConflict if another task
	// with the same ID exists (the caller then continues that task); a task
	// that is just what t would store (SameCreate: a create repeated because
	// its first answer was lost) is no conflict.
	CreateTask(ctx context.Context, t Task) error
	// GetTask returns a task or ErrNotFound.
	GetTask(ctx context.Context, id string) (Task, error)
	// ListTasks returns tasks, newest first, at most limit (0: all).
	ListTasks(ctx context.Context, limit int) ([]Task, error)
	// ListTasksByOwner returns the tasks of p.Owner, newest first (ties by
	// id, descending), starting after p.After. Adapters answer it from an
	// index by owner and creation time, never by scanning other owners'
	// tasks. It may lag a just-created task where the backend's index is
	// eventually consistent (DynamoDB).
	ListTasksByOwner(ctx context.Context, p ListTasksByOwnerParams) ([]Task, error)
	// TransitionTask changes a task's state if it is in one of p.From, and
	// returns the updated task. Idempotent callers treat ErrConflict by
	// re-reading the task. The same transition sent again after its answer
	// was lost (an SDK retry) is that transition, applied once, and not a
	// conflict: a caller marking a task EXPORTING would otherwise take it
	// for someone else's export and start none.
	TransitionTask(ctx context.Context, p TransitionTaskParams) (Task, error)
	// SetTerms replaces a task's terms (its cap, mode and deadline; zero
	// values remove them), whatever its state, and returns the updated
	// task; ErrNotFound for an unknown task.
	SetTerms(ctx context.Context, taskID string, terms Terms) (Task, error)

	// PutRows stores input rows. Rows that already exist are left unchanged,
	// so a resumed split never overwrites a result. A row whose State is
	// empty is stored as PENDING.
	PutRows(ctx context.Context, rows []Row) error
	// ListRows returns rows of a task in row order.
	ListRows(ctx context.Context, p ListRowsParams) ([]Row, error)

	// PutBatches stores batches in state PENDING, with the Saved counts
	// given (the rows final at the split). Batches that already exist are
	// left unchanged (idempotent for a resumed split).
	PutBatches(ctx context.Context, batches []Batch) error
	// GetBatch returns a batch or ErrNotFound.
	GetBatch(ctx context.Context, taskID string, no int) (Batch, error)
	// ListBatches returns batches of a task in batch order.
	ListBatches(ctx context.Context, p ListBatchesParams) ([]Batch, error)
	// ListOpenBatches returns batches of any task that are not DONE, not
	// parked, and were last changed before p.UpdatedBefore, oldest change
	// first (ties by task, then number), starting after p.After. Adapters
	// answer it from an index that holds only open batches (a sparse index),
	// never by scanning finished work; it is the sweeper's query.
	ListOpenBatches(ctx context.Context, p ListOpenBatchesParams) ([]Batch, error)
	// ParkBatch takes a batch that is not DONE and unchanged since
	// p.UpdatedAt out of the open-batches index, leaving its state as it is;
	// otherwise ErrConflict (ErrNotFound for no such batch). The sweeper
	// parks the leftover batches of finished and cancelled tasks, so that
	// they do not crowd live work out of its listing. The next write that
	// leaves the batch open (claim, renew, release, touch, reopen) puts it
	// back in the index.
	ParkBatch(ctx context.Context, p ParkBatchParams) error
	// ClaimBatch moves a batch that is PENDING, or RUNNING with a lease that
	// expired before p.Now, to RUNNING with a new lease, an incremented
	// Attempt and p.Owner, in one conditional write. It returns the claimed
	// batch, ErrConflict when the batch is DONE or leased by someone else, or
	// ErrNotFound.
	ClaimBatch(ctx context.Context, p ClaimBatchParams) (Batch, error)
	// RenewLease extends the lease of a RUNNING batch whose Attempt is still
	// p.Attempt; otherwise ErrConflict (the caller lost the batch).
	RenewLease(ctx context.Context, p RenewLeaseParams) error
	// ReleaseBatch moves a RUNNING batch whose Attempt is p.Attempt back to
	// PENDING so a later delivery can claim it; otherwise ErrConflict.
	ReleaseBatch(ctx context.Context, p ReleaseBatchParams) error
	// TouchBatch sets UpdatedAt of a batch that is still PENDING at
	// p.Attempt to p.Now, so a sweeper that re-enqueued it does not do so
	// again on its next pass; otherwise ErrConflict.
	TouchBatch(ctx context.Context, p TouchBatchParams) error
	// SaveRowResults records a group of row results, and the cache entries
	// that came with them, in one all-or-nothing write: if the batch is
	// RUNNING with Attempt p.Attempt and holds every row, and every row is
	// still PENDING, all are written and the batch's Saved grows by
	// p.Saved(); otherwise nothing is and the error is ErrConflict
	// (ErrNotFound for a missing batch or row). A late write from a
	// fenced-out worker therefore never overwrites a newer owner's result,
	// and a row becomes final once, so Saved counts it once. The very
	// save sent again (same rows, results and Now: a retry of one whose
	// answer was lost) finds its rows holding it and is that save, with
	// nothing written or counted again. The result
	// says whether the task has been cancelled (see SaveRowResultsResult).
	// An empty group writes nothing and checks nothing.
	SaveRowResults(ctx context.Context, p SaveRowResultsParams) (SaveRowResultsResult, error)
	// FinishBatch atomically marks a RUNNING batch with Attempt p.Attempt
	// DONE with Saved set to its row counts, and adds it and those counts
	// to the task's counters, returning the updated task. ErrConflict if the batch is not so (already done or
	// fenced): its counts were, or will be, added by someone else. The very
	// finish sent again (same attempt, counts and Now: a retry of one whose
	// answer was lost) is that finish: it returns the task and adds nothing.
	FinishBatch(ctx context.Context, p FinishBatchParams) (Task, error)
}

// SameCreate reports whether stored is what creating t stored: the same
// task in every field, times to the millisecond (what every adapter keeps).
// A create whose answer was lost and that is sent again (an SDK retry, a
// retried request) finds its own task, which is no conflict.
func SameCreate(stored, t Task) bool {
	norm := func(x Task) Task {
		if x.State == "" {
			x.State = TaskPending
		}
		x.CreatedAt, x.UpdatedAt, x.FinishedAt = toMillis(x.CreatedAt), toMillis(x.UpdatedAt), toMillis(x.FinishedAt)
		x.Deadline = toMillis(x.Deadline)
		if len(x.Header) == 0 {
			x.Header = nil
		}
		if len(x.UsageByProvider) == 0 {
			x.UsageByProvider = nil
		}
		return x
	}
	return reflect.DeepEqual(norm(stored), norm(t))
}

func toMillis(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.UnixMilli(t.UnixMilli()).UTC()
}

// DefaultCacheTTL is how long a cached model output is reused unless a
// store is told otherwise.
const DefaultCacheTTL = 30 * 24 * time.Hour

// Cache maps a hash of everything that determines a model's output to that
// output, so identical prompts are not billed twice. Entries live for the
// store's cache TTL (DefaultCacheTTL unless configured): an expired entry is
// never returned, and is replaced or removed by the backend in time. Outputs are written to
// the cache together with their rows, by Store.SaveRowResults; PutCached is
// for callers outside a batch.
type Cache interface {
	// GetCached returns the cached outputs of those keys that have one, in
	// as few reads as the backend allows (one per 100 keys on DynamoDB).
	// Keys may repeat; a missing key is simply absent from the map.
	GetCached(ctx context.Context, keys []string) (map[string]string, error)
	// PutCached stores output under key; an existing entry is kept.
	PutCached(ctx context.Context, key, output string) error
}

// ProviderBatch is one entry of an economy task's journal of provider
// batches (pipeline's lanes keep it): a batch recorded before it is sent
// (Intent, under its Key), once the provider took it (Job), when the
// provider has none under its key (Gone), or once it ended (Ended).
type ProviderBatch struct {
	// Key is the lane's id of the batch, sent with it.
	Key string `json:"key,omitempty"`
	// Job is the provider's id of the batch, once it took it.
	Job string `json:"job,omitempty"`
	// Intent marks the record made before the batch was sent.
	Intent bool `json:"intent,omitempty"`
	// Gone marks an intent the provider has no batch for.
	Gone bool `json:"gone,omitempty"`
	// Ended marks a batch (Job) seen final: its answers are in, for the
	// rows to take.
	Ended bool `json:"ended,omitempty"`
	// Lines are the ids of its lines.
	Lines []string `json:"lines,omitempty"`
	// Submitted is when it was (first) sent.
	Submitted time.Time `json:"submitted"`
}

// Kind names what e records: "intent", "gone", "job" or "ended".
func (e ProviderBatch) Kind() string {
	switch {
	case e.Ended:
		return "ended"
	case e.Job != "":
		return "job"
	case e.Gone:
		return "gone"
	}
	return "intent"
}

// ProviderBatches keeps the journal of the provider batches each economy
// task sent. Writers may be many at once (a fleet of generators working
// one task): each entry is a record of its own, never a rewrite of the
// journal.
type ProviderBatches interface {
	// RecordProviderBatch adds e to task taskID's journal; recording the
	// same entry again changes nothing.
	RecordProviderBatch(ctx context.Context, taskID string, e ProviderBatch) error
	// ListProviderBatches returns task taskID's journal, oldest first (by
	// Submitted, then Key; an intent before its batch's other entries).
	ListProviderBatches(ctx context.Context, taskID string) ([]ProviderBatch, error)
}

// Allowances is the fleet's ledger of what each capped task
// (Task.MaxCost) may still spend, shared by every process that calls for
// it: a process takes an allowance before its calls and gives back what
// they did not spend, so that many processes together stay within the
// cap. The embedded runtime, whose one process runs every batch of its
// tasks, keeps its ledger in memory; dynamostore implements this for the
// AWS fleet (one item per task, conditional writes), sqlitestore for the
// conformance suite.
type Allowances interface {
	// TakeAllowance takes between need and want (need <= want) from what
	// task taskID may still spend under its cap limit, and returns what it
	// took and what is left after; taken is 0 when not even need is left.
	// ErrNotFound when the task's ledger is not open under limit (never
	// opened, or opened under another cap): the caller opens it.
	TakeAllowance(ctx context.Context, taskID string, limit, need, want float64) (taken, left float64, err error)
	// OpenAllowance opens task taskID's ledger under limit, spent being
	// what its rows cost so far; a ledger open under limit already
	// (another process opened it first) is left as it is, with what was
	// taken from it.
	OpenAllowance(ctx context.Context, taskID string, limit, spent float64) error
	// ReturnAllowance gives amount (taken and not spent) back to task
	// taskID's ledger while it is open under limit; a ledger opened again
	// under another cap counted what was spent from the rows.
	ReturnAllowance(ctx context.Context, taskID string, limit, amount float64) error
}

// Valid reports whether a row may be stored in state s.
func (s RowState) Valid() bool {
	switch s {
	case RowPending, RowSucceeded, RowFailed, RowSkipped:
		return true
	}
	return false
}

// Validate returns why SaveRowResults must refuse p, or nil: more than
// MaxSaveRows rows or cache entries, a row twice, a row number below 1, or
// a state that is not a row state (an empty state means PENDING).
func (p SaveRowResultsParams) Validate() error {
	if len(p.Rows) > MaxSaveRows || len(p.Cache) > MaxSaveRows {
		return fmt.Errorf("%d rows and %d cache entries in one group; at most %d of each", len(p.Rows), len(p.Cache), MaxSaveRows)
	}
	seen := make(map[int]bool, len(p.Rows))
	for _, w := range p.Rows {
		if w.RowNo < 1 {
			return fmt.Errorf("row %d: row numbers start at 1", w.RowNo)
		}
		if seen[w.RowNo] {
			return fmt.Errorf("row %d appears twice in one group", w.RowNo)
		}
		seen[w.RowNo] = true
		if w.Result.State != "" && !w.Result.State.Valid() {
			return fmt.Errorf("row %d: invalid state %q", w.RowNo, w.Result.State)
		}
	}
	return nil
}
