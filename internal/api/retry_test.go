package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store"
)

// finishedTask stores a PARTIAL task of two batches of two rows whose rows 3
// and 4 failed with classes server_error and content_filter.
func finishedTask(t *testing.T, st store.Store, id string) {
	t.Helper()
	ctx := context.Background()
	if err := st.CreateTask(ctx, store.Task{
		ID: id, Owner: "alice", State: store.TaskRunning, Source: "incoming/x/a.xlsx", Header: []string{"a"}, RowsTotal: 4, BatchesTotal: 2,
		Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 2}, CreatedAt: now, UpdatedAt: now,
	}); err != nil {
		t.Fatal(err)
	}
	var rows []store.Row
	for no := 1; no <= 4; no++ {
		rows = append(rows, store.Row{TaskID: id, No: no, SheetRow: no + 1, Values: []string{"x"}})
	}
	if err := st.PutRows(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := st.PutBatches(ctx, []store.Batch{{TaskID: id, No: 1, FirstRow: 1, RowCount: 2, CreatedAt: now}, {TaskID: id, No: 2, FirstRow: 3, RowCount: 2, CreatedAt: now}}); err != nil {
		t.Fatal(err)
	}
	classes := map[int]string{3: "server_error", 4: "content_filter"}
	for no := 1; no <= 2; no++ {
		b, err := st.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: no, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		var ok, bad int
		for row := b.FirstRow; row < b.FirstRow+b.RowCount; row++ {
			res := store.RowResult{State: store.RowSucceeded, Output: "y", Attempts: 1}
			if c, f := classes[row]; f {
				res, bad = store.RowResult{State: store.RowFailed, Error: "boom", ErrorClass: c, Attempts: 3}, bad+1
			} else {
				ok++
			}
			if _, err := st.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: id, BatchNo: no, Attempt: b.Attempt, Rows: []store.RowResultWrite{{RowNo: row, Result: res}}, Now: now}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.FinishBatch(ctx, store.FinishBatchParams{TaskID: id, BatchNo: no, Attempt: b.Attempt, Succeeded: ok, Failed: bad, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range [][2]store.TaskState{{store.TaskRunning, store.TaskExporting}, {store.TaskExporting, store.TaskPartial}} {
		if _, err := st.TransitionTask(ctx, store.TransitionTaskParams{ID: id, From: []store.TaskState{step[0]}, To: step[1], ResultKey: "results/" + id + ".xlsx", Now: now}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRetryTask(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q, err := sqlitequeue.New(f.store.DB(), sqlitequeue.Config{Name: "batches", Visibility: time.Minute, MaxReceive: 10})
	if err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef"
	finishedTask(t, f.store, id)
	if err := f.store.CreateTask(context.Background(), store.Task{ID: "fedcba9876543210fedcba9876543210", Owner: "alice", State: store.TaskRunning, Spec: store.TaskSpec{Provider: "sim", BatchSize: 1}, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if r := do(t, api.New(f.config), "POST", "/api/tasks/"+id+"/retry", ""); r.status != http.StatusNotImplemented {
		t.Errorf("retry without a Retrier: %d %v, want 501", r.status, r.body)
	}
	f.config.Retrier = pipeline.Retrier{Store: f.store, Queue: q}
	h := api.New(f.config)
	tests := []struct {
		name, method, target, body string
		status                     int
		code                       string
	}{
		{"unknown task", "POST", "/api/tasks/ffffffffffffffffffffffffffffffff/retry", "", http.StatusNotFound, "not_found"},
		{"running task", "POST", "/api/tasks/fedcba9876543210fedcba9876543210/retry", "", http.StatusConflict, "conflict"},
		{"class no row has", "POST", "/api/tasks/" + id + "/retry", `{"error_class":"rate_limited"}`, http.StatusConflict, "nothing_to_retry"},
		{"bad class", "POST", "/api/tasks/" + id + "/retry", `{"error_class":"Bad Class"}`, http.StatusBadRequest, "invalid_request"},
		{"unknown field", "POST", "/api/tasks/" + id + "/retry", `{"class":"x"}`, http.StatusBadRequest, "invalid_json"},
		{"one class", "POST", "/api/tasks/" + id + "/retry", `{"error_class":"server_error"}`, http.StatusAccepted, ""},
		{"again while it runs", "POST", "/api/tasks/" + id + "/retry", "", http.StatusConflict, "conflict"},
		{"wrong method", "GET", "/api/tasks/" + id + "/retry", "", http.StatusMethodNotAllowed, "method_not_allowed"},
	}
	for _, tc := range tests { // in order: later cases depend on earlier ones
		r := do(t, h, tc.method, tc.target, tc.body)
		if r.status != tc.status || errorCode(r) != tc.code {
			t.Errorf("%s: %d %q, want %d %q (%v)", tc.name, r.status, errorCode(r), tc.status, tc.code, r.body)
		}
		if tc.status == http.StatusAccepted && r.body["status"] != "RUNNING" {
			t.Errorf("%s: status %v, want RUNNING", tc.name, r.body["status"])
		}
	}
	task, err := f.store.GetTask(context.Background(), id)
	if err != nil || task.State != store.TaskRunning || task.ExportGen != 1 || task.RowsFailed != 0 || task.BatchesDone != 1 {
		t.Errorf("stored task %+v (%v), want RUNNING, export generation 1, batch 2 reopened", task, err)
	}
	rows, err := f.store.ListRows(context.Background(), store.ListRowsParams{TaskID: id, FromNo: 3})
	if err != nil || len(rows) != 2 || rows[0].State != store.RowPending || rows[1].State != store.RowFailed {
		t.Errorf("rows 3-4 = %+v (%v), want row 3 PENDING and row 4 still FAILED (content_filter)", rows, err)
	}
	ds, err := q.Receive(context.Background(), 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("queue holds %d messages (%v), want batch 2 once", len(ds), err)
	}
	// In the task owner's group, so the queue serves its principal in turn.
	if m, err := pipeline.DecodeBatchMessage(ds[0].Body); err != nil || m.TaskID != id || m.BatchNo != 2 || m.Owner != task.Owner || ds[0].Group != task.Owner {
		t.Errorf("queued %s in group %q, want batch 2 of %s in its owner %q's group", ds[0].Body, ds[0].Group, id, task.Owner)
	}
}
