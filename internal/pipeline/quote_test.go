package pipeline_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// TestSampleThenRun: a quote's sample answers rows spread over the task
// (the first ones of batches spread over it), the quote is measured on
// them, and the run that follows answers the rest, paying for no row
// twice.
func TestSampleThenRun(t *testing.T) {
	t.Parallel()
	provider := newCounting(billingProvider{})
	prices := pricing.Default().With(map[string]pricing.Price{"sim": {InputPerMTok: 1, OutputPerMTok: 2}})
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 4, Prices: prices})
	p := e.splitProducts("sampled", "{{id}} {{name}}", 50, 10)
	ctx := context.Background()
	started, err := e.gen.Sample(ctx, p.TaskID, 7)
	if err != nil || started != 7 {
		t.Fatalf("sample: %d rows started, %v; want 7", started, err)
	}
	rows, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: p.TaskID})
	if err != nil {
		t.Fatal(err)
	}
	var answered []int
	for _, r := range rows {
		if r.State == store.RowSucceeded {
			answered = append(answered, r.No)
		}
	}
	// Five batches of ten: two rows from the first two, one from each of
	// the others.
	if want := []int{1, 2, 11, 12, 21, 31, 41}; fmt.Sprint(answered) != fmt.Sprint(want) {
		t.Errorf("rows answered by the sample %v, want %v", answered, want)
	}
	task, err := e.store.GetTask(ctx, p.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pipeline.QuoteTask(ctx, e.store, task, pipeline.QuoteParams{Prices: prices, RequestsPerSecond: 10, Concurrency: 4, RowsToCall: -1})
	if err != nil {
		t.Fatal(err)
	}
	// Every row is billed 500 output tokens: no spread there; 43 rows
	// left at 10 a second.
	if q.Measured != 7 || q.Left != 43 || q.OutputTokens != (pipeline.Spread{Low: 500, Mid: 500, High: 500}) || q.Duration[1] != 4300*time.Millisecond {
		t.Errorf("quote %+v: want 7 measured, 43 left, 500 output tokens a row, 4.3s", q)
	}
	wantCost := 43 * (q.InputTokens.Mid*1 + 500*2) / 1e6
	if !q.CostKnown || math.Abs(q.Cost.Mid-wantCost) > 1e-12 || q.Cost.Low > q.Cost.Mid || q.Cost.High < q.Cost.Mid {
		t.Errorf("cost %+v, want %.6f in the middle of its interval", q.Cost, wantCost)
	}
	done := e.runToCompletion(ctx, p.TaskID)
	if done.State != store.TaskSucceeded {
		t.Fatalf("after the sample: %s", done.State)
	}
	for prompt, n := range provider.snapshot() {
		if n != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n)
		}
	}
}

// TestRowsToCall: rows left whose question the cache answers already are
// not to be called; the others are, once a question.
func TestRowsToCall(t *testing.T) {
	t.Parallel()
	provider := newCounting(billingProvider{})
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 1})
	rows := make([][]string, 30)
	for i := range rows {
		name := "lamp"
		if i >= 10 {
			name = fmt.Sprintf("chair %d", i) // a question of its own
		}
		rows[i] = []string{fmt.Sprintf("SKU-%d", i), name}
	}
	spec := store.TaskSpec{Prompt: "Copy for {{name}}", Provider: "sim", BatchSize: 10}
	p := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID("dups", spec), Source: "in.csv", Spec: spec,
		Path: e.writeCSV("in.csv", []string{"id", "name"}, rows)}
	ctx := context.Background()
	if _, err := e.splitter.Split(ctx, p); err != nil {
		t.Fatal(err)
	}
	// The sample answers one row of batch 1: a lamp, now in the cache.
	if _, err := e.gen.Sample(ctx, p.TaskID, 1); err != nil {
		t.Fatal(err)
	}
	task, err := e.store.GetTask(ctx, p.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.gen.RowsToCall(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	// 29 rows left: the 9 other lamps ask what the cache holds, the 20
	// chairs are 20 questions.
	if n != 20 {
		t.Errorf("%d rows to call, want the 20 chairs", n)
	}
}

// TestQuoteOfAFastModel: a model that answers within a millisecond (its
// rows' latency stored as 0 ms) still gives the quote a time, as 1 ms a
// call: a quote of such a sample said "time unknown" and offered no auto.
func TestQuoteOfAFastModel(t *testing.T) {
	t.Parallel()
	answer := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		return llm.Response{Text: "ok", Usage: llm.Usage{InputTokens: 10, OutputTokens: 10}}, nil
	})
	e := newEnv(t, answer, pipeline.GeneratorConfig{Concurrency: 4})
	p := e.splitProducts("fast", "{{id}}", 40, 10)
	ctx := context.Background()
	if _, err := e.gen.Sample(ctx, p.TaskID, 8); err != nil {
		t.Fatal(err)
	}
	task, err := e.store.GetTask(ctx, p.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pipeline.QuoteTask(ctx, e.store, task, pipeline.QuoteParams{Concurrency: 4, RowsToCall: -1})
	if err != nil {
		t.Fatal(err)
	}
	if q.Duration[1] <= 0 || q.Duration[1] > time.Second {
		t.Errorf("quote of a sub-millisecond model: %v for %d rows, want a short time, not unknown", q.Duration, q.Left)
	}
	if plans := q.Plans(true, time.Hour); !plans[2].Offered {
		t.Errorf("auto not offered: %s", plans[2].Why)
	}
}
