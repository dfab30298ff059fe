//go:build emulator

package lambdafn_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/awsops"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// TestMaxCostOnTheStack: a task created through the api function with a
// spending cap runs on two generator instances at once, which share its
// ledger in the table: together they stop before the cap (the task
// cancelled, saying so), and a retry with a higher cap runs the rest, no
// row paid twice. Every function did only what its role grants.
func TestMaxCostOnTheStack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var ops awsops.Set
	const rows, capUSD = 60, 0.5
	price := pricing.Price{InputPerMTok: 1000, OutputPerMTok: 1000}
	e := newE2E(t, e2eOptions{ops: &ops, rows: rows, batchSize: 5, providers: func(url string) string {
		return fmt.Sprintf("providers:\n  - {name: main, kind: mock, base_url: %q, model: mock-1, rpm: 60000, concurrency: 4, price: {input_per_mtok: 1000, output_per_mtok: 1000}}\n", url)
	}})
	call := e.apiCaller(&ops, "alice")
	id := e.createThroughAPI(call, "capped.xlsx", fmt.Sprintf(`"max_cost_usd":%v,"max_tokens":40`, capUSD))
	spent := func() (float64, int) {
		t.Helper()
		all, err := e.stack.Store.ListRows(ctx, store.ListRowsParams{TaskID: id})
		if err != nil {
			t.Fatal(err)
		}
		cost, done := 0.0, 0
		for _, r := range all {
			cost += price.Cost(r.Usage)
			if r.State == store.RowSucceeded {
				done++
			}
		}
		return cost, done
	}
	e.pumpUntilQuiet(id, 90*time.Second, func(ctx context.Context) bool { return e.stack.TaskFinal(ctx, id) })
	stopped, err := e.stack.Store.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	cost, done := spent()
	t.Logf("stopped at $%.4f with %d rows answered: %s", cost, done, stopped.Error)
	if stopped.State != store.TaskCancelled || !strings.Contains(stopped.Error, "every generator") {
		t.Fatalf("task %s (%q), want CANCELLED at the fleet's cap", stopped.State, stopped.Error)
	}
	if cost > capUSD || done == 0 || done == rows {
		t.Errorf("%d rows answered for $%.4f under a cap of $%.2f", done, cost, capUSD)
	}

	call("POST", "/api/tasks/"+id+"/retry", `{"max_cost_usd": 100}`, http.StatusAccepted)
	finished := e.pump(id, 90*time.Second)
	if _, done := spent(); finished.State != store.TaskSucceeded || done != rows {
		t.Fatalf("after a retry with a higher cap: %s with %d of %d rows (%q)", finished.State, done, rows, finished.Error)
	}
	if n := e.mock.Stats().Requests; n != rows {
		t.Errorf("the model was called %d times for %d rows: a row was paid twice", n, rows)
	}
	checkObservedGranted(t, &ops, "api", "splitter", "generator")
}
