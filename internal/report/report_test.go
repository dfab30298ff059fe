package report_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/store"
)

// TestForTask: the exit code of every final task, as batchgen run and
// batchgen-localaws --once both give it.
func TestForTask(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		task   store.Task
		failed int
		want   int
	}{
		{"succeeded", store.Task{State: store.TaskSucceeded, BatchesTotal: 2}, 0, report.OK},
		{"succeeded but rows left without a result", store.Task{State: store.TaskSucceeded, BatchesTotal: 2}, 1, report.RowsFailed},
		{"partial", store.Task{State: store.TaskPartial, BatchesTotal: 2, RowsFailed: 1}, 1, report.RowsFailed},
		{"cancelled", store.Task{State: store.TaskCancelled, BatchesTotal: 2}, 0, report.RowsFailed},
		{"rejected input", store.Task{State: store.TaskFailed, Error: "no rows"}, 0, report.Rejected},
		{"export failed", store.Task{State: store.TaskFailed, BatchesTotal: 2, Error: "disk full"}, 0, report.Failure},
		{"not final", store.Task{State: store.TaskRunning, BatchesTotal: 2}, 0, report.Failure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, _ := report.Exit(report.ForTask(tt.task, tt.failed))
			if diff := cmp.Diff(tt.want, code); diff != "" {
				t.Errorf("exit code (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		err      error
		wantCode int
		wantMsg  string
	}{
		{"nil", nil, report.OK, ""},
		{"plain error", errors.New("disk full"), report.Failure, "disk full"},
		{"rejected", report.Rejectf("bad %s", "input"), report.Rejected, "bad input"},
		{"code only", &report.ExitError{Code: report.RowsFailed}, report.RowsFailed, ""},
	}
	for _, tt := range tests {
		code, msg := report.Exit(tt.err)
		if diff := cmp.Diff([]any{tt.wantCode, tt.wantMsg}, []any{code, msg}); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestSummary(t *testing.T) {
	t.Parallel()
	task := store.Task{ID: "aaaa7c31365370257f36", State: store.TaskSucceeded, Source: "skus.csv", Encoding: "windows-1252"}
	got := report.Summary{
		Task: task, Rows: report.Rows{Total: 200, Succeeded: 200},
		Counted: &report.Counted{Calls: 200, Classes: map[string]int{}},
		Elapsed: 2 * time.Second, Result: "skus.result.xlsx",
	}.String()
	want := `task      aaaa7c31365370257f36  SUCCEEDED
input     skus.csv  (windows-1252)
rows      200  (succeeded 200, failed 0, skipped 0, cached 0)
requests  200 this run  (rate limited 0, errors 0)
time      2s  (6000 requests/min)
result    skus.result.xlsx
`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
	priced := store.Task{ID: "c", State: store.TaskSucceeded, Spec: store.TaskSpec{Provider: "openai", Model: "gpt-4o-mini"},
		Usage: store.Usage{InputTokens: 2_000_000, CachedInputTokens: 1_000_000, OutputTokens: 500_000}}
	got = report.Summary{Task: priced, Rows: report.Rows{Total: 3, Succeeded: 3}, Elapsed: time.Second}.String()
	want = `task      c  SUCCEEDED
rows      3  (succeeded 3, failed 0, skipped 0)
time      1s
tokens    2000000 in (1000000 cached), 500000 out  (estimated cost $0.5250)
result    (none)
`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("summary with tokens (-want +got):\n%s", diff)
	}
	failed := store.Task{ID: "b", State: store.TaskFailed, Error: "export: disk full"}
	got = report.Summary{Task: failed, Rows: report.Rows{Total: 3, Succeeded: 3}, Elapsed: time.Second}.String()
	want = `task      b  FAILED
rows      3  (succeeded 3, failed 0, skipped 0)
time      1s
result    (none)
error     export: disk full
`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("summary without counts (-want +got):\n%s", diff)
	}
}
