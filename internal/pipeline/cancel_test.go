package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// TestCancelAndRetryByState: Cancel and Retry decide by the task's state,
// in one place for every entry point: what each does to a pending, running,
// finished, cancelled or failed task, and to an unknown id.
func TestCancelAndRetryByState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ok := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		return llm.Response{Text: "ok"}, nil
	})
	type want struct {
		cancelErr   string // "" for success, "not_found", "state", "export"
		cancelState store.TaskState
		retryErr    string // "" for success, "not_found", "state", "mismatch"
		resumed     bool
	}
	tests := []struct {
		name  string
		setup func(e *env) string
		want  want
	}{
		{"pending (split, never run)", func(e *env) string { return e.splitProducts("p", "{{id}}", 6, 3).TaskID },
			want{cancelState: store.TaskCancelled, resumed: true}},
		{"finished", func(e *env) string {
			id := e.splitProducts("f", "{{id}}", 6, 3).TaskID
			e.runToCompletion(ctx, id)
			return id
		}, want{cancelErr: "state", cancelState: store.TaskSucceeded}},
		{"failed (rejected input)", func(e *env) string {
			now := time.Now()
			if err := e.store.CreateTask(ctx, store.Task{ID: "0123456789abcdef0123", State: store.TaskFailed, Source: "bad.xlsx", Error: "no data rows",
				Spec: store.TaskSpec{Provider: "sim"}, CreatedAt: now, UpdatedAt: now, FinishedAt: now}); err != nil {
				t.Fatal(err)
			}
			return "0123456789abcdef0123"
		}, want{cancelErr: "state", cancelState: store.TaskFailed, retryErr: "state"}},
		{"unknown", func(e *env) string { return "ffffffffffffffffffff" }, want{cancelErr: "not_found", retryErr: "not_found"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Cancel, with the export run in-process.
			e := newEnv(t, ok, pipeline.GeneratorConfig{Concurrency: 2})
			id := tt.setup(e)
			task, err := pipeline.Cancel(ctx, e.store, pipeline.CancelParams{TaskID: id, Reason: "test", Now: time.Now(), Exports: e.exporter})
			if got := errKind(err); got != tt.want.cancelErr {
				t.Fatalf("cancel: error %v (%s), want %q", err, got, tt.want.cancelErr)
			}
			if diff := cmp.Diff(tt.want.cancelState, task.State); diff != "" {
				t.Errorf("cancel: state (-want +got):\n%s", diff)
			}
			if err == nil {
				if got, _ := e.store.GetTask(ctx, id); got.ResultKey == "" {
					t.Errorf("cancelled task has no partial result")
				}
			}

			// Retry, on a fresh copy of the state.
			e = newEnv(t, ok, pipeline.GeneratorConfig{Concurrency: 2})
			id = tt.setup(e)
			if tt.want.resumed {
				// Without Resume (a deployed stack, whose workers may hold
				// the task) an unfinished task is refused, not resumed.
				if _, err := (pipeline.Retrier{Store: e.store, Queue: e.queue}).Retry(ctx, pipeline.RetryParams{TaskID: id, Now: time.Now()}); errKind(err) != "state" {
					t.Errorf("retry of an unfinished task without Resume: %v, want a StateError", err)
				}
			}
			out, err := pipeline.Retrier{Store: e.store, Queue: e.queue, OwnsWorkers: true}.Retry(ctx, pipeline.RetryParams{TaskID: id, Provider: "sim", Now: time.Now()})
			if got := errKind(err); got != tt.want.retryErr {
				t.Fatalf("retry: error %v (%s), want %q", err, got, tt.want.retryErr)
			}
			if out.Resumed != tt.want.resumed {
				t.Errorf("retry: resumed %v, want %v", out.Resumed, tt.want.resumed)
			}
			if err == nil {
				done := out.Task
				if out.Batches > 0 {
					done = e.runToCompletion(ctx, id)
				}
				if done.State != store.TaskSucceeded {
					t.Errorf("after retry the task is %s, want SUCCEEDED", done.State)
				}
			}
			if tt.want.retryErr == "" && id != "ffffffffffffffffffff" {
				if _, err := (pipeline.Retrier{Store: e.store, Queue: e.queue, OwnsWorkers: true}).Retry(ctx, pipeline.RetryParams{TaskID: id, Provider: "openai", Model: "gpt-4o-mini", Now: time.Now()}); errKind(err) != "mismatch" {
					t.Errorf("retry with another model: %v, want a MismatchError", err)
				}
			}
		})
	}
}

func errKind(err error) string {
	var state *pipeline.StateError
	var export *pipeline.ExportNotStartedError
	var mismatch *pipeline.MismatchError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, store.ErrNotFound):
		return "not_found"
	case errors.As(err, &state):
		if !errors.Is(err, store.ErrConflict) {
			return "state error that is not ErrConflict"
		}
		return "state"
	case errors.As(err, &export):
		return "export"
	case errors.As(err, &mismatch):
		return "mismatch"
	}
	return "other: " + err.Error()
}
