package pipeline_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// TestRepeatedQuestionsArePaidOnce: 60 rows asking 3 questions, in batches
// of 10 run 4 at a time: each question is called once, and every row gets
// its question's answer (the others as cached, at no cost). Before rows
// shared an answer in flight, each row of a batch that started before its
// question was cached was called and paid for.
func TestRepeatedQuestionsArePaidOnce(t *testing.T) {
	t.Parallel()
	provider := newCounting(billingProvider{})
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 8})
	rows := make([][]string, 60)
	for i := range rows {
		rows[i] = []string{fmt.Sprintf("SKU-%d", i), fmt.Sprintf("model %d", i%3)}
	}
	spec := store.TaskSpec{Prompt: "Copy for {{name}}", Provider: "sim", BatchSize: 10}
	p := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID("repeated", spec), Source: "in.csv", Spec: spec,
		Path: e.writeCSV("in.csv", []string{"id", "name"}, rows)}
	ctx := context.Background()
	if _, err := e.splitter.Split(ctx, p); err != nil {
		t.Fatal(err)
	}
	done := e.runToCompletion(ctx, p.TaskID)
	if done.State != store.TaskSucceeded {
		t.Fatalf("task %s", done.State)
	}
	calls := provider.snapshot()
	if len(calls) != 3 {
		t.Errorf("%d questions called, want 3", len(calls))
	}
	for q, n := range calls {
		if n != 1 {
			t.Errorf("%q called %d times, want once", q, n)
		}
	}
	got, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: p.TaskID})
	if err != nil {
		t.Fatal(err)
	}
	paid := 0
	for _, r := range got {
		if want := fmt.Sprintf("copy: Copy for model %d", (r.No-1)%3); r.Output != want {
			t.Errorf("row %d: %q, want %q", r.No, r.Output, want)
		}
		if !r.Cached {
			paid++
		}
	}
	if paid != 3 {
		t.Errorf("%d rows billed, want 3", paid)
	}
}
