package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// genStarter records every export start with its generation.
type genStarter struct{ starts []string }

func (g *genStarter) StartExport(_ context.Context, id string, gen int) error {
	g.starts = append(g.starts, fmt.Sprintf("%s#%d", id, gen))
	return nil
}

// TestOneExportStartPerExport: every batch message is delivered twice (the
// second copy after the batch finished), and sweeps run after: the export is
// started exactly once. Reopening the task for a retry starts the next
// generation's export exactly once too.
func TestOneExportStartPerExport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	starter := &genStarter{}
	e.gen = pipeline.NewGenerator(e.store, e.provider, starter, e.cfg)
	id := e.splitProducts("once", "{{id}}", 12, 3).TaskID
	deliverAll := func() {
		t.Helper()
		for no := 1; no <= 4; no++ {
			for range 2 {
				out := e.gen.Process(ctx, pipeline.Delivery{Body: pipeline.EncodeBatchMessage(id, no), ReceiveCount: 1})
				if out.Err != nil {
					t.Fatalf("batch %d: %v", no, out.Err)
				}
			}
		}
	}
	deliverAll()
	// Sweeps while the export runs, and after it finished.
	clk := clock.NewFake(time.Now().Add(time.Minute))
	sw := pipeline.NewSweeper(e.store, e.queue, starter, pipeline.SweeperConfig{Clock: clk})
	sweep := func() {
		t.Helper()
		if _, err := sw.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sweep()
	task, err := e.exporter.Export(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if task.State != store.TaskSucceeded {
		t.Fatalf("exported task is %s", task.State)
	}
	clk.Advance(time.Hour)
	sweep()
	if diff := cmp.Diff([]string{id + "#0"}, starter.starts); diff != "" {
		t.Fatalf("export starts (-want +got):\n%s", diff)
	}

	// A row fails after the fact (as a retry would find it); reopen reruns it
	// under the next export generation.
	if _, err := e.store.DB().ExecContext(ctx, `UPDATE rows SET state = 'FAILED', error_class = 'server_error' WHERE task_id = ? AND no = 5`, id); err != nil {
		t.Fatal(err)
	}
	reopened, n, err := pipeline.Reopen(ctx, e.store, e.queue, id, "", clk.Now(), false)
	if err != nil || n != 1 || reopened.ExportGen != 1 {
		t.Fatalf("reopen = gen %d, %d batches, %v; want generation 1 and one batch", reopened.ExportGen, n, err)
	}
	starter.starts = nil
	deliverAll()
	if diff := cmp.Diff([]string{id + "#1"}, starter.starts); diff != "" {
		t.Errorf("export starts after the retry (-want +got):\n%s", diff)
	}
}
