//go:build emulator

package lambdafn_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awsops"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// TestQuoteOnTheStack: a task created through the api function with a
// sample is split and held; the generators answer its sample (and nothing
// else) from the queue; the api function quotes the rest and starts it;
// the rest runs to the end and no row is called twice. Every function did
// only what its role grants.
func TestQuoteOnTheStack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var ops awsops.Set
	const rows, sample = 30, 4
	e := newE2E(t, e2eOptions{ops: &ops, rows: rows, batchSize: 5})
	call := e.apiCaller(&ops, "alice")
	id := e.createThroughAPI(call, "quoted.xlsx", fmt.Sprintf(`"sample":%d`, sample))
	if task, err := e.stack.Store.GetTask(ctx, id); err != nil || task.State != store.TaskHeld {
		t.Fatalf("task after the split: %+v %v, want HELD", task, err)
	}

	quote := func() api.QuoteView {
		t.Helper()
		var q api.QuoteView
		if err := json.Unmarshal(call("GET", "/api/tasks/"+id+"/quote?deadline=3h", "", http.StatusOK), &q); err != nil {
			t.Fatal(err)
		}
		return q
	}
	sampled := func(ctx context.Context) bool {
		task, err := e.stack.Store.GetTask(ctx, id)
		if err != nil {
			return false
		}
		q, err := pipeline.QuoteTask(ctx, e.stack.Store, task, pipeline.QuoteParams{RowsToCall: -1})
		return err == nil && !q.Sampling
	}
	e.pumpUntilQuiet(id, 60*time.Second, sampled)
	// The queue holds nothing more for a held task: pumping on answers
	// nothing else.
	idle, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	_ = e.stack.Pump(idle, func(context.Context) bool { return false }, nil)
	q := quote()
	if q.Status != "HELD" || q.Sampling || q.Measured != sample || q.Tried != sample || q.Left != rows-sample || len(q.Plans) != 3 {
		t.Fatalf("quote = %+v, want HELD with %d rows measured and three plans", q, sample)
	}
	if q.Plans[1].Mode != "economy" || !q.Plans[1].Offered || q.Plans[2].Mode != "auto" || !q.Plans[2].Offered {
		t.Errorf("plans %+v: the stack runs economy and auto", q.Plans)
	}
	if n := e.mock.Stats().Requests; n != sample {
		t.Fatalf("the model was called %d times for a sample of %d", n, sample)
	}

	call("POST", "/api/tasks/"+id+"/start", `{"mode": "online"}`, http.StatusAccepted)
	call("POST", "/api/tasks/"+id+"/start", "", http.StatusConflict)
	task := e.pump(id, 90*time.Second)
	if task.State != store.TaskSucceeded || task.RowsSucceeded != rows {
		t.Fatalf("task %s with %d of %d rows succeeded after its start", task.State, task.RowsSucceeded, rows)
	}
	if n := e.mock.Stats().Requests; n != rows {
		t.Errorf("the model was called %d times for %d rows: the sample was paid twice", n, rows)
	}
	checkObservedGranted(t, &ops, "api", "splitter", "generator")
}
