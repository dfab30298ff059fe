//go:build emulator

package lambdafn_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/store"
)

// TestEndToEndProvidersFile: the generator Lambda, given a providers file
// (the ProvidersFile parameter), routes the rows over two mock endpoints,
// each paced by its own shared DynamoDB limiter; every row is answered
// once, both endpoints answer some, and the result's provider column names
// the entry that answered each row.
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
  - {name: east, kind: mock, base_url: %q, rpm: 6000, concurrency: 2}
  - {name: west, kind: mock, base_url: "http://%s/v1", rpm: 6000, concurrency: 2}
`, eastURL, ln.Addr())
	}})
	ev := e.upload("routed.xlsx", nil)
	taskID := e.taskID(ev)
	if err := e.stack.Splitter.Handle(t.Context(), ev); err != nil {
		t.Fatalf("splitter: %v", err)
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
}
