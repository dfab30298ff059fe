package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// TestReopenRetriesOnlyFailedRows: rows that failed (two classes) are rerun
// by class; succeeded rows are never billed again.
func TestReopenRetriesOnlyFailedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var healed atomic.Bool
	var mu sync.Mutex
	calls := map[string]int{}
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		mu.Lock()
		calls[req.Prompt]++
		mu.Unlock()
		if !healed.Load() {
			switch {
			case strings.Contains(req.Prompt, "SKU-0003"), strings.Contains(req.Prompt, "SKU-0017"):
				return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: 400, Message: "flagged"}
			case strings.Contains(req.Prompt, "SKU-0009"):
				return llm.Response{}, &llm.Error{Class: llm.ClassBadRequest, StatusCode: 400, Message: "bad"}
			}
		}
		return llm.Response{Text: "ok " + req.Prompt}, nil
	})
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2})
	id := e.splitProducts("retry", "{{id}}", 20, 5).TaskID
	if got := e.runToCompletion(ctx, id); got.State != store.TaskPartial || got.RowsFailed != 3 {
		t.Fatalf("first run: %s with %d failed, want PARTIAL with 3", got.State, got.RowsFailed)
	}
	healed.Store(true)

	task, n, err := pipeline.Reopen(ctx, e.store, e.queue, id, string(llm.ClassContentFilter), time.Now(), false)
	if err != nil {
		t.Fatal(err)
	}
	if task.State != store.TaskRunning || n != 2 || task.ResultKey != "" {
		t.Fatalf("reopened task %s with %d batches (result %q), want RUNNING with 2 batches and no result", task.State, n, task.ResultKey)
	}
	done := e.runToCompletion(ctx, id)
	if done.State != store.TaskPartial || done.RowsFailed != 1 || done.RowsSucceeded != 19 {
		t.Fatalf("after retrying content_filter: %s, %d ok, %d failed; want PARTIAL 19/1", done.State, done.RowsSucceeded, done.RowsFailed)
	}
	if _, n, err = pipeline.Reopen(ctx, e.store, e.queue, id, "", time.Now(), false); err != nil || n != 1 {
		t.Fatalf("reopen all: %d batches, %v; want 1", n, err)
	}
	done = e.runToCompletion(ctx, id)
	if done.State != store.TaskSucceeded || done.RowsSucceeded != 20 {
		t.Fatalf("after retrying all: %s with %d succeeded", done.State, done.RowsSucceeded)
	}
	mu.Lock()
	defer mu.Unlock()
	for prompt, n := range calls {
		want := 1
		if prompt == "SKU-0003" || prompt == "SKU-0017" || prompt == "SKU-0009" {
			want = 2
		}
		if n != want {
			t.Errorf("prompt %q called %d times, want %d", prompt, n, want)
		}
	}
	// Nothing failed any more: a further retry has nothing to do.
	if _, n, err := pipeline.Reopen(ctx, e.store, e.queue, id, "", time.Now(), false); err != nil || n != 0 {
		t.Errorf("reopen of a clean task: %d batches, %v; want 0", n, err)
	}
}

// TestCancelStopsNewRowsAndExportsPartial cancels a task mid-run: rows in
// flight finish, no new row starts, and the partial result marks the rest.
func TestCancelStopsNewRowsAndExportsPartial(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var started atomic.Int32
	gate := make(chan struct{})
	sixth := make(chan struct{}) // closed when the sixth call starts
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		n := started.Add(1)
		if n == 6 {
			close(sixth)
		}
		if n > 4 {
			<-gate
		}
		return llm.Response{Text: "ok"}, nil
	})
	// The cancel reaches the batch through its next result write; writing
	// every result at once makes that the write of the first row to finish
	// after the cancel.
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2, FlushRows: 1})
	id := e.splitProducts("cancel", "{{id}}", 40, 10).TaskID
	wctx, stop := context.WithCancel(ctx)
	drain := make(chan struct{})
	workers := pipeline.NewLocalWorkers(e.queue, e.gen, pipeline.LocalWorkersConfig{Workers: 1, PollInterval: 5 * time.Millisecond})
	finished := make(chan struct{})
	go func() { _ = workers.RunUntil(wctx, drain); close(finished) }()
	defer stop()
	select {
	case <-sixth: // two calls are in flight, held at the gate
	case <-time.After(30 * time.Second):
		t.Fatalf("only %d calls started", started.Load())
	}
	if _, err := e.store.TransitionTask(ctx, store.TransitionTaskParams{ID: id, From: []store.TaskState{store.TaskRunning}, To: store.TaskCancelled, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	close(gate) // the two calls in flight finish
	close(drain)
	<-finished
	calls := started.Load()
	task, err := e.exporter.Export(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if task.State != store.TaskCancelled || task.ResultKey == "" {
		t.Fatalf("task %s with result %q, want CANCELLED with a result", task.State, task.ResultKey)
	}
	statuses := map[string]int{}
	for _, r := range e.resultCells(task)[1:] {
		statuses[r[3]]++
	}
	if statuses["succeeded"] != int(calls) || statuses["not_started"] != 40-int(calls) {
		t.Errorf("statuses %v after %d calls: want every called row succeeded and the rest not_started", statuses, calls)
	}
	if calls > 8 {
		t.Errorf("%d rows started; cancel should stop new rows within a few", calls)
	}
}

// TestRetryOfKilledCancelledRunReclaimsAtOnce: a run killed mid-batch, then
// cancelled, then retried by the process that now holds the data directory
// (OwnsWorkers) gets the dead process's batch back at once; without owning
// the workers (the API of a deployed stack, whose workers may be alive) the
// lease is left to run out.
func TestRetryOfKilledCancelledRunReclaimsAtOnce(t *testing.T) {
	t.Parallel()
	for _, owns := range []bool{true, false} {
		ctx := context.Background()
		e := newEnv(t, nil, pipeline.GeneratorConfig{})
		id := e.splitProducts("killed", "{{id}}", 8, 4).TaskID
		now := time.Now()
		// The killed process held batch 1 with a 5-minute lease and had
		// answered one row.
		b, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: 1, Owner: "dead", Now: now, LeaseUntil: now.Add(5 * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: id, BatchNo: 1, Attempt: b.Attempt,
			Rows: []store.RowResultWrite{{RowNo: 1, Result: store.RowResult{State: store.RowSucceeded, Output: "kept", Attempts: 1}}}, Now: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := pipeline.Cancel(ctx, e.store, pipeline.CancelParams{TaskID: id, Reason: "cancelled by operator", Now: now}); err != nil {
			t.Fatal(err)
		}
		out, err := pipeline.Retrier{Store: e.store, Queue: e.queue, OwnsWorkers: owns}.Retry(ctx, pipeline.RetryParams{TaskID: id, Now: now.Add(time.Second)})
		if err != nil || out.Task.State != store.TaskRunning || out.Batches != 2 {
			t.Fatalf("owns workers %v: retry = %+v, %v; want the task running with both batches enqueued", owns, out, err)
		}
		_, err = e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: 1, Owner: "retry", Now: now.Add(2 * time.Second), LeaseUntil: now.Add(time.Hour)})
		switch {
		case owns && err != nil:
			t.Errorf("the retry's claim of the dead process's batch: %v; want it claimable at once", err)
		case !owns && !errors.Is(err, store.ErrConflict):
			t.Errorf("without owning the workers the live-looking lease was taken (%v); a worker may still hold it", err)
		}
	}
}
