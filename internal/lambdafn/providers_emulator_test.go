//go:build emulator

package lambdafn_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
	"github.com/batchgen/batchgen/internal/lambdafn/eventsfn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/store"
)

// TestEndToEndProvidersFile: the generator Lambda, given a providers file
// (the ProvidersFile parameter), routes the rows over two mock endpoints,
// each paced by its own shared DynamoDB limiter; every row is answered
// once, both endpoints answer some, and the result's provider column names
// the entry that answered each row. The splitter and the api record the
// routed providers in the specs they build, and the api prices the task's
// tokens per provider at the file's prices.
func TestEndToEndProvidersFile(t *testing.T) {
	t.Parallel()
	west := mockserver.New(mockserver.Config{Seed: 8, Latency: 20 * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- west.Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("west mock server: %v", err)
		}
	})
	const rows = 60
	e := newE2E(t, e2eOptions{rows: rows, batchSize: 20, latency: 20 * time.Millisecond, providers: func(eastURL string) string {
		return fmt.Sprintf(`routing: weighted
providers:
  - {name: east, kind: mock, base_url: %q, rpm: 6000, concurrency: 2, price: {input_per_mtok: 1000, output_per_mtok: 3000}}
  - {name: west, kind: mock, base_url: "http://%s/v1", rpm: 6000, concurrency: 2, price: {input_per_mtok: 10, output_per_mtok: 20}}
`, eastURL, ln.Addr())
	}})
	ev := e.upload("routed.xlsx", nil)
	taskID := e.taskID(ev)
	if err := e.stack.Splitter.Handle(t.Context(), ev); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	// The splitter records the routed providers in the task's spec (and
	// so its id), as batchgen run --providers does for the same file.
	split, err := e.stack.Store.GetTask(t.Context(), taskID)
	if err != nil {
		t.Fatal(err)
	}
	if split.Spec.Provider != "routed:east,west" || split.Spec.Model != "mock-1" {
		t.Errorf("split task's spec names provider %q model %q, want routed:east,west and mock-1 (the first entry's)", split.Spec.Provider, split.Spec.Model)
	}
	// So does a task created through the api function.
	cfg, err := samstack.Config(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	h, err := apifn.New(awswire.NewDeps(e.stack.Env, cfg, "api"))
	if err != nil {
		t.Fatal(err)
	}
	resp, body := lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: "alice", Method: "POST", Target: "/api/tasks", ContentType: "application/json", Body: `{"filename":"routed.xlsx","size":100}`})
	var created api.CreateTaskResponse
	if err := json.Unmarshal(body, &created); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /api/tasks = %d %s (%v)", resp.StatusCode, body, err)
	}
	if created.Provider != "routed:east,west" || created.Model != "mock-1" {
		t.Errorf("api task names provider %q model %q, want routed:east,west and mock-1", created.Provider, created.Model)
	}
	task := e.pump(taskID, 90*time.Second)
	if task.State != store.TaskSucceeded || task.RowsSucceeded != rows {
		t.Fatalf("task = %s, %d succeeded; want SUCCEEDED with %d", task.State, task.RowsSucceeded, rows)
	}
	result := e.resultRows("results/routed.result.xlsx")
	col := slices.Index(result[0], "provider")
	if col < 0 {
		t.Fatalf("result header %v has no provider column", result[0])
	}
	answered := map[string]int{}
	for _, r := range result[1:] {
		if col < len(r) {
			answered[r[col]]++
		} else {
			answered[""]++
		}
	}
	east := e.mock.Stats()
	westStats := west.Stats()
	want := map[string]int{"east": int(east.Succeeded), "west": int(westStats.Succeeded)}
	if diff := gocmp.Diff(want, answered); diff != "" {
		t.Errorf("rows per provider column value (-endpoints' answers +result column):\n%s", diff)
	}
	if east.Succeeded == 0 || westStats.Succeeded == 0 || east.Succeeded+westStats.Succeeded != rows {
		t.Errorf("east answered %d, west %d; want both some and %d in all, each row once", east.Succeeded, westStats.Succeeded, rows)
	}

	// The task's cost: each row's tokens at the price of the entry that
	// answered it.
	in, out := slices.Index(result[0], "input_tokens"), slices.Index(result[0], "output_tokens")
	if in < 0 || out < 0 {
		t.Fatalf("result header %v has no token columns", result[0])
	}
	perMTok := map[string][2]float64{"east": {1000, 3000}, "west": {10, 20}}
	var wantCost float64
	for i, r := range result[1:] {
		tin, err1 := strconv.ParseInt(r[in], 10, 64)
		tout, err2 := strconv.ParseInt(r[out], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("row %d tokens %q/%q: want counts", i+1, r[in], r[out])
		}
		p := perMTok[r[col]]
		wantCost += (float64(tin)*p[0] + float64(tout)*p[1]) / 1e6
	}
	owner := cmp.Or(e.stack.Env.DropOwner, pipeline.LocalOwner)
	resp, body = lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: owner, Method: "GET", Target: "/api/tasks/" + taskID})
	var view api.TaskView
	if err := json.Unmarshal(body, &view); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/tasks/%s as %s = %d %s (%v)", taskID, owner, resp.StatusCode, body, err)
	}
	if view.EstimatedCost == nil || math.Abs(*view.EstimatedCost-wantCost) > 1e-9 {
		t.Errorf("estimated_cost %v, want %v: each provider's tokens at its entry's price", view.EstimatedCost, wantCost)
	}
	// The events function's stream shows the same cost: one done event for
	// a finished task.
	stream, err := eventsfn.New(t.Context(), awswire.NewDeps(e.stack.Env, cfg, "events"), api.Fixed(owner))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	stream.Handler.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", "/api/tasks/"+taskID+"/events", nil))
	var done api.TaskEvent
	for line := range strings.SplitSeq(rec.Body.String(), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			if err := json.Unmarshal([]byte(data), &done); err != nil {
				t.Fatalf("event data %q: %v", data, err)
			}
		}
	}
	if done.EstimatedCost == nil || math.Abs(*done.EstimatedCost-wantCost) > 1e-9 {
		t.Errorf("streamed estimated_cost %v, want %v (status %d, body %q)", done.EstimatedCost, wantCost, rec.Code, rec.Body.String())
	}
}
