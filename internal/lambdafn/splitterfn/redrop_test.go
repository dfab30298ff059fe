package splitterfn_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
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
		pipeline.NewSplitter(e.Store, e.Queue, pipeline.SplitterConfig{Clock: e.Clock, Logger: e.Log}),
		e.Blobs, starts,
		pipeline.IntakeConfig{
			DefaultSpec: defaultSpec, Limits: sheet.Limits{}, Uploads: pipeline.BlobUploads{Blobs: e.Blobs},
			TempDir: t.TempDir(), Clock: e.Clock, Logger: e.Log,
		}), Logger: e.Log}
	key := "incoming/items.csv"
	e.Put(key, lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(3)))
	ev := s3Event(t, key, "etag-1")
	if err := h.Handle(ctx, ev); err != nil {
		t.Fatal(err)
	}
	tasks := e.Tasks()
	if len(tasks) != 1 {
		t.Fatalf("%d tasks after the first drop", len(tasks))
	}
	id := tasks[0].ID
	// The generators answer every row, the exporter writes the result.
	now := e.Clock.Now()
	batches, err := e.Store.ListBatches(ctx, store.ListBatchesParams{TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		c, err := e.Store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: b.No, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		var writes []store.RowResultWrite
		for no := b.FirstRow; no < b.FirstRow+b.RowCount; no++ {
			writes = append(writes, store.RowResultWrite{RowNo: no, Result: store.RowResult{State: store.RowSucceeded, Output: fmt.Sprintf("copy %d", no), Attempts: 1}})
		}
		if _, err := e.Store.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: id, BatchNo: b.No, Attempt: c.Attempt, Rows: writes, Now: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Store.FinishBatch(ctx, store.FinishBatchParams{TaskID: id, BatchNo: b.No, Attempt: c.Attempt, Succeeded: b.RowCount, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	exporter := pipeline.NewExporter(e.Store, e.Blobs, pipeline.ExporterConfig{Clock: e.Clock})
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
	if err := e.Blobs.Delete(ctx, task.ResultKey); err != nil {
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
	if got := e.Get(again.ResultKey); len(got) == 0 {
		t.Error("the re-export wrote no result")
	}
	if n := len(e.Drain()); n != len(batches) {
		t.Errorf("queue holds %d messages, want only the first drop's %d: a re-drop must not rerun rows", n, len(batches))
	}
}
