package lambdafn_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/lambdafn/splitterfn"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// genStarts records export starts with their generation.
type genStarts struct{ starts []string }

func (g *genStarts) StartExport(_ context.Context, id string, gen int) error {
	g.starts = append(g.starts, fmt.Sprintf("%s#%d", id, gen))
	return nil
}

// TestSplitterRedropAfterResultExpired: the identical file dropped again
// while its result exists is a duplicate; dropped again after the result
// expired, the task is exported again from its stored rows under the next
// export generation, with no model call.
func TestSplitterRedropAfterResultExpired(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t)
	starts := &genStarts{}
	h := &splitterfn.Handler{Intake: pipeline.NewIntake(
		pipeline.NewSplitter(e.store, e.queue, pipeline.SplitterConfig{Clock: e.clock, Logger: e.log}),
		e.blobs, starts,
		pipeline.IntakeConfig{
			DefaultSpec: defaultSpec, Limits: sheet.Limits{}, Uploads: pipeline.BlobUploads{Blobs: e.blobs},
			TempDir: t.TempDir(), Clock: e.clock, Logger: e.log,
		}), Logger: e.log}
	key := "incoming/items.csv"
	e.put(key, csvBytes(header, rows(3)))
	ev := s3Event(t, key, "etag-1")
	if err := h.Handle(ctx, ev); err != nil {
		t.Fatal(err)
	}
	tasks := e.tasks()
	if len(tasks) != 1 {
		t.Fatalf("%d tasks after the first drop", len(tasks))
	}
	id := tasks[0].ID
	// The generators answer every row, the exporter writes the result.
	now := e.clock.Now()
	batches, err := e.store.ListBatches(ctx, store.ListBatchesParams{TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		c, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: b.No, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		var writes []store.RowResultWrite
		for no := b.FirstRow; no < b.FirstRow+b.RowCount; no++ {
			writes = append(writes, store.RowResultWrite{RowNo: no, Result: store.RowResult{State: store.RowSucceeded, Output: fmt.Sprintf("copy %d", no), Attempts: 1}})
		}
		if _, err := e.store.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: id, BatchNo: b.No, Attempt: c.Attempt, Rows: writes, Now: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.FinishBatch(ctx, store.FinishBatchParams{TaskID: id, BatchNo: b.No, Attempt: c.Attempt, Succeeded: b.RowCount, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	exporter := pipeline.NewExporter(e.store, e.blobs, pipeline.ExporterConfig{Clock: e.clock})
	task, err := exporter.Export(ctx, id)
	if err != nil || task.State != store.TaskSucceeded {
		t.Fatalf("export: %s, %v", task.State, err)
	}

	// Dropped again while the result exists: a duplicate.
	if err := h.Handle(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if len(starts.starts) != 0 {
		t.Fatalf("a re-drop with the result in place started exports %v", starts.starts)
	}
	// The result expires; the same file is dropped again.
	if err := e.blobs.Delete(ctx, task.ResultKey); err != nil {
		t.Fatal(err)
	}
	if err := h.Handle(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{id + "#1"}, starts.starts); diff != "" {
		t.Fatalf("export starts after the re-drop (-want +got):\n%s", diff)
	}
	again, err := exporter.Export(ctx, id)
	if err != nil || again.State != store.TaskSucceeded || again.ExportGen != 1 {
		t.Fatalf("re-export: %s gen %d, %v", again.State, again.ExportGen, err)
	}
	if got := e.get(again.ResultKey); len(got) == 0 {
		t.Error("the re-export wrote no result")
	}
	if n := len(e.drain()); n != len(batches) {
		t.Errorf("queue holds %d messages, want only the first drop's %d: a re-drop must not rerun rows", n, len(batches))
	}
}
