package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// TestResultSentBackIn: a result edited by the user and sent back in continues as a task. Rows whose input and
// template are unchanged keep their answers with no model call; the changed, cleared, flagged, failed and inserted
// rows are sent, and the flagged and cleared ones bypass the cache (a new answer, not the stored one). Rows are
// recognised by their key, so a deleted row and an inserted one shift nothing.
func TestResultSentBackIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	provider := sim.New(sim.Config{})
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 4})
	path := e.writeWorkbook("商品.xlsx", 12) // rows 2-13
	spec := store.TaskSpec{Provider: "sim", Model: "sim-1", BatchSize: 5}
	first := e.runWorkbook(ctx, path, "first", spec)
	if provider.Calls() != 12 {
		t.Fatalf("first run: %d calls, want 12", provider.Calls())
	}

	// The user's edits, in Excel: a changed input, a cleared answer, a flag, a row marked failed, a deleted
	// row and an inserted one.
	f, err := excelize.OpenReader(bytes.NewReader(resultBytes(t, e, first)))
	if err != nil {
		t.Fatal(err)
	}
	col := func(name string) string {
		header, _ := f.GetRows("商品")
		return excelizeColumn(slices.Index(header[0], name) + 1)
	}
	set := func(ref, v string) {
		if err := f.SetCellStr("商品", ref, v); err != nil {
			t.Fatal(err)
		}
	}
	set("A3", "积木3改")          // changed input
	set(col("output")+"4", "") // cleared answer
	set(col("rerun")+"5", "x") // flagged
	set(col("status")+"6", "failed")
	if err := f.RemoveRow("商品", 8); err != nil { // deleted: rows 9-13 move up
		t.Fatal(err)
	}
	if err := f.InsertRows("商品", 10, 1); err != nil { // a new row without a key
		t.Fatal(err)
	}
	set("A10", "新积木")
	edited := filepath.Join(e.dir, "商品.result.xlsx")
	if err := f.SaveAs(edited); err != nil {
		t.Fatal(err)
	}
	f.Close()

	v, err := pipeline.Validate(pipeline.SplitParams{TaskID: "x", Path: edited, Source: "商品.result.xlsx", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	want := pipeline.RerunCounts{Kept: 7, Changed: 1, New: 1, Cleared: 1, Flagged: 1, Failed: 1, From: first.ID}
	if v.Rerun == nil || *v.Rerun != want {
		t.Fatalf("rerun counts = %+v, want %+v", v.Rerun, want)
	}
	before := provider.Calls()
	second := e.runWorkbook(ctx, edited, "second", spec)
	// The row marked failed by hand had been answered, so the cache answers it; the cleared and flagged rows
	// bypass the cache.
	if calls := provider.Calls() - before; calls != int64(want.ToRun()-1) {
		t.Errorf("sent back in: %d model calls, want %d (changed, new, cleared, flagged)", calls, want.ToRun()-1)
	}
	if second.State != store.TaskSucceeded || second.RowsTotal != 12 {
		t.Errorf("task = %s with %d rows", second.State, second.RowsTotal)
	}

	// The result is the edited workbook with its own result columns rewritten, not a second set of them.
	g, err := excelize.OpenReader(bytes.NewReader(resultBytes(t, e, second)))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	rows, err := g.GetRows("商品")
	if err != nil {
		t.Fatal(err)
	}
	header := rows[0]
	if n := len(header); n != 4+len(pipeline.ResultColumns) || header[4] != "output" || header[n-1] != "batchgen_key" {
		t.Fatalf("header = %q", header)
	}
	out, status, rerun, cached := slices.Index(header, "output"), slices.Index(header, "status"), slices.Index(header, "rerun"), slices.Index(header, "cached")
	for i, r := range rows[1:] {
		for len(r) < len(header) {
			r = append(r, "")
		}
		if r[status] != "succeeded" || !strings.Contains(r[out], r[0]) || r[rerun] != "" {
			t.Errorf("row %d: %q status %q output %q rerun %q", i+2, r[0], r[status], r[out], r[rerun])
		}
		kept := r[cached] == "TRUE" // kept, or answered from the cache: no call
		wantKept := !slices.Contains([]string{"积木3改", "积木4", "积木5", "新积木"}, r[0])
		if kept != wantKept {
			t.Errorf("row %d (%s): kept = %v, want %v", i+2, r[0], kept, wantKept)
		}
	}
	if hidden, _ := g.GetColVisible("商品", col("batchgen_key")); hidden {
		t.Errorf("the key column is visible")
	}
}

// runWorkbook splits the workbook at path as a task labelled label and runs it to the end.
func (e *env) runWorkbook(ctx context.Context, path, label string, spec store.TaskSpec) store.Task {
	e.t.Helper()
	id := pipeline.DeriveTaskID(label, spec)
	if _, err := e.splitter.Split(ctx, pipeline.SplitParams{TaskID: id, Path: path, Source: filepath.Base(path), Spec: spec}); err != nil {
		e.t.Fatal(err)
	}
	done := e.runToCompletion(ctx, id)
	if _, err := os.Stat(path); err != nil {
		e.t.Fatal(err)
	}
	return done
}

func excelizeColumn(n int) string {
	name, err := excelize.ColumnNumberToName(n)
	if err != nil {
		panic(fmt.Sprint(n, err))
	}
	return name
}

// TestResultSentBackInFinishesKeptBatchesAtSplit: the batches of a result
// sent back in whose rows are all kept are finished by the splitter itself,
// never sent to a generator (on AWS a message, a Lambda invocation and a
// claim each, only to count the rows); only the batch with an edit goes to
// the model.
func TestResultSentBackInFinishesKeptBatchesAtSplit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	provider := sim.New(sim.Config{})
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 4})
	path := e.writeWorkbook("商品.xlsx", 30)
	spec := store.TaskSpec{Provider: "sim", Model: "sim-1", BatchSize: 10}
	first := e.runWorkbook(ctx, path, "first", spec)

	f, err := excelize.OpenReader(bytes.NewReader(resultBytes(t, e, first)))
	if err != nil {
		t.Fatal(err)
	}
	header, _ := f.GetRows("商品")
	if err := f.SetCellStr("商品", excelizeColumn(slices.Index(header[0], "rerun")+1)+"15", "again"); err != nil { // data row 14: batch 2
		t.Fatal(err)
	}
	edited := filepath.Join(e.dir, "edited.xlsx")
	if err := f.SaveAs(edited); err != nil {
		t.Fatal(err)
	}
	f.Close()

	id := pipeline.DeriveTaskID("second", spec)
	split, err := e.splitter.Split(ctx, pipeline.SplitParams{TaskID: id, Path: edited, Source: "edited.xlsx", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if split.BatchesDone != 2 || split.RowsSucceeded != 20 || split.Rerun == nil || split.Rerun.Flagged != 1 || split.Rerun.From != first.ID {
		t.Fatalf("after the split: %d of %d batches done, %d rows succeeded, rerun %+v; want batches 1 and 3 done by the splitter",
			split.BatchesDone, split.BatchesTotal, split.RowsSucceeded, split.Rerun)
	}
	batches, err := e.store.ListBatches(ctx, store.ListBatchesParams{TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		if wantDone := b.No != 2; (b.State == store.BatchDone) != wantDone {
			t.Errorf("batch %d is %s after the split", b.No, b.State)
		}
	}
	before := provider.Calls()
	done := e.runToCompletion(ctx, id)
	if calls := provider.Calls() - before; calls != 1 || done.State != store.TaskSucceeded || done.RowsSucceeded != 30 {
		t.Errorf("%d calls, task %s with %d rows succeeded; want 1 call and all 30", calls, done.State, done.RowsSucceeded)
	}

	// Sent back untouched, every batch is finished at the split, which
	// starts the export itself: nothing else would.
	unchanged := filepath.Join(e.dir, "unchanged.xlsx")
	if err := os.WriteFile(unchanged, resultBytes(t, e, done), 0o600); err != nil {
		t.Fatal(err)
	}
	before = provider.Calls()
	again := e.runWorkbook(ctx, unchanged, "third", spec)
	if calls := provider.Calls() - before; calls != 0 || again.State != store.TaskSucceeded || again.RowsSucceeded != 30 || again.Rerun.Kept != 30 {
		t.Errorf("unchanged: %d calls, task %s with %d rows succeeded, rerun %+v", calls, again.State, again.RowsSucceeded, again.Rerun)
	}
}
