// Package report is what a batchgen command tells the people and scripts
// that call it: the exit code (a contract with the scripts), the mapping
// of a final task to that code, the summary lines when a job ends, the
// progress line while it runs, and the layouts of a task's status, its
// quote, the task list and the dead letters. The commands only wire; the
// words live here, so batchgen and batchgen-localaws answer alike.
package report

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// Exit codes.
const (
	// OK: every row succeeded (blank rows are skipped, not failed).
	OK = 0
	// Failure: anything else (I/O, database, AWS); the task state is intact.
	Failure = 1
	// Rejected: the input or the command line was refused; nothing was
	// written but the error.
	Rejected = 2
	// RowsFailed: the job finished with some rows failed or not run (a
	// cancelled task); the result marks them.
	RowsFailed = 3
	// Interrupted: stopped by a signal; running the same command again
	// continues.
	Interrupted = 130
)

// ExitError carries an exit code with the message printed for it; a nil
// Err prints nothing.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// Rejectf is an ExitError with code Rejected.
func Rejectf(format string, a ...any) *ExitError {
	return &ExitError{Code: Rejected, Err: fmt.Errorf(format, a...)}
}

// Exit returns the exit code of a command's error and the message to print
// for it ("" for none): an *ExitError's own code, Failure for any other
// error, OK for nil.
func Exit(err error) (int, string) {
	if err == nil {
		return OK, ""
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err == nil {
			return ee.Code, ""
		}
		return ee.Code, ee.Err.Error()
	}
	return Failure, err.Error()
}

// ForTask maps a final task to the error (and so the exit code) a job that
// ended with it returns. failedRows counts the rows without a result (failed
// or never run); a task can know more of them than its counters.
func ForTask(t store.Task, failedRows int) error {
	switch {
	case t.State == store.TaskFailed && t.BatchesTotal == 0:
		// Refused before any batch was written: the input.
		return &ExitError{Code: Rejected, Err: fmt.Errorf("input rejected: %s", t.Error)}
	case t.State == store.TaskFailed:
		return &ExitError{Code: Failure, Err: fmt.Errorf("task %s failed: %s", t.ID, t.Error)}
	case t.State == store.TaskCancelled:
		why := ""
		if t.Error != "" {
			why = " (" + t.Error + ")" // an operator, or the task's spending cap
		}
		return &ExitError{Code: RowsFailed, Err: fmt.Errorf("task %s was cancelled%s; rows that did not run are marked not_started (batchgen retry %s runs them)", t.ID, why, t.ID)}
	case t.State == store.TaskPartial || failedRows > 0 || t.RowsFailed > 0:
		return &ExitError{Code: RowsFailed}
	case t.State == store.TaskSucceeded:
		return nil
	}
	return &ExitError{Code: Failure, Err: fmt.Errorf("task %s is %s, not finished", t.ID, t.State)}
}

// Rows are a task's row counts.
type Rows struct {
	Total, Succeeded, Failed, Skipped int
}

// Counted is what the reporting process itself counted while it ran.
type Counted struct {
	// Cached rows were answered from the cache.
	Cached int
	// Calls, RateLimited and Errors count this run's model calls; Errors
	// are failed calls other than the rate limits (429s), which are the
	// provider pacing the job, not failures.
	Calls, RateLimited, Errors int64
	// Classes counts this run's failed rows by error class.
	Classes map[string]int
	// BatchLines and ProviderBatches count the lines this run sent in
	// provider batches (economy and auto) and those batches; Calls counts
	// the online calls only.
	BatchLines, ProviderBatches int
}

// Summary is what a job prints on stdout when it ends.
type Summary struct {
	Task store.Task
	Rows Rows
	// Counted is nil when the command did not run the model calls itself
	// (the AWS stack's handlers did).
	Counted *Counted
	Elapsed time.Duration
	// Result is where the result workbook was written; empty for none.
	Result string
	// Prices estimate the task's cost from its tokens. Defaults to the
	// built-in table.
	Prices *pricing.Table
	// Notes are things the run learned that the user should know, one
	// line each.
	Notes []string
}

// String lays the summary out, one aligned line per fact.
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "task      %s  %s\n", s.Task.ID, s.Task.State)
	if s.Task.Encoding != "" {
		// The encoding a CSV was read with: a wrong guess garbles every row.
		fmt.Fprintf(&b, "input     %s  (%s)\n", s.Task.Source, s.Task.Encoding)
	}
	r := s.Rows
	if c := s.Counted; c != nil {
		fmt.Fprintf(&b, "rows      %d  (succeeded %d, failed %d, skipped %d, cached %d)\n", r.Total, r.Succeeded, r.Failed, r.Skipped, c.Cached)
		fmt.Fprintf(&b, "requests  %d this run  (rate limited %d, errors %d)\n", c.Calls, c.RateLimited, c.Errors)
		if c.ProviderBatches > 0 {
			batches := "provider batch"
			if c.ProviderBatches > 1 {
				batches += "es"
			}
			fmt.Fprintf(&b, "batches   %d lines in %d %s this run  (at the batch price; a failed line is sent again)\n", c.BatchLines, c.ProviderBatches, batches)
		}
		rate := 0.0
		if s.Elapsed > 0 {
			rate = float64(c.Calls) / s.Elapsed.Minutes()
		}
		fmt.Fprintf(&b, "time      %s  (%.0f requests/min)\n", s.Elapsed.Round(10*time.Millisecond), rate)
	} else {
		fmt.Fprintf(&b, "rows      %d  (succeeded %d, failed %d, skipped %d)\n", r.Total, r.Succeeded, r.Failed, r.Skipped)
		fmt.Fprintf(&b, "time      %s\n", s.Elapsed.Round(10*time.Millisecond))
	}
	if u := s.Task.Usage; u != (store.Usage{}) {
		prices := s.Prices
		if prices == nil {
			prices = pricing.Default()
		}
		// Each provider's tokens at its own price (see pricing.Table.Task).
		fmt.Fprintf(&b, "tokens    %d in (%d cached), %d out  (estimated cost %s)\n",
			u.InputTokens, u.CachedInputTokens, u.OutputTokens, prices.Task(s.Task))
	}
	result := s.Result
	if result == "" {
		result = "(none)"
	}
	fmt.Fprintf(&b, "result    %s\n", result)
	if c := s.Counted; c != nil && len(c.Classes) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(c.Classes)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, c.Classes[k]))
		}
		fmt.Fprintf(&b, "failures  %s (this run; see the status and error columns)\n", strings.Join(parts, ", "))
	}
	if s.Task.Error != "" && s.Task.State == store.TaskFailed {
		fmt.Fprintf(&b, "error     %s\n", s.Task.Error)
	}
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "note      %s\n", n)
	}
	return b.String()
}
