package pipeline_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// billingProvider answers every call after a short while, billing its
// prompt as estimated and 500 output tokens, as a model would.
type billingProvider struct{}

func (billingProvider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	select {
	case <-ctx.Done():
		return llm.Response{}, ctx.Err()
	case <-time.After(2 * time.Millisecond):
	}
	return llm.Response{Text: "copy: " + req.Prompt, Usage: llm.Usage{InputTokens: llm.EstimateInputTokens(req), OutputTokens: 500}}, nil
}

// answeredCounter counts, per prompt, the calls its provider answered: what
// was billed. A call cut off before its answer (the test stopping its
// workers the moment the stopped task's export is signalled, where a run
// would let it finish) billed nothing.
type answeredCounter struct {
	llm.Provider
	mu   sync.Mutex
	paid map[string]int
}

func (c *answeredCounter) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	resp, err := c.Provider.Generate(ctx, req)
	if err == nil {
		c.mu.Lock()
		c.paid[req.Prompt]++
		c.mu.Unlock()
	}
	return resp, err
}

// TestMaxCostStopsTheTask: a task capped at $10, whose calls cost about
// $0.51 each (and are held at $1.01, their worst case), stops before its
// calls pass the cap: cancelled, saying why, with the rows it did not
// start left for later; a retry with a higher cap runs just those, and no
// row is paid twice.
func TestMaxCostStopsTheTask(t *testing.T) {
	t.Parallel()
	price := pricing.Price{InputPerMTok: 1000, OutputPerMTok: 1000}
	prices := pricing.Default().With(map[string]pricing.Price{"sim": price})
	provider := &answeredCounter{Provider: billingProvider{}, paid: map[string]int{}}
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 4, Prices: prices})
	spec := store.TaskSpec{Prompt: "{{id}} {{name}}", Provider: "sim", BatchSize: 10, MaxTokens: 1000}
	p := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID("capped", spec), Source: "in.csv", Spec: spec,
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(60))}
	ctx := context.Background()
	if _, err := e.splitter.Split(ctx, p); err != nil {
		t.Fatal(err)
	}
	const capUSD = 10.0
	if _, err := e.store.SetTerms(ctx, p.TaskID, store.Terms{MaxCost: capUSD}); err != nil {
		t.Fatal(err)
	}
	spent := func() (float64, int) {
		rows, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: p.TaskID})
		if err != nil {
			t.Fatal(err)
		}
		cost, done := 0.0, 0
		for _, r := range rows {
			cost += price.Cost(r.Usage)
			if r.State == store.RowSucceeded {
				done++
			}
		}
		return cost, done
	}

	stopped := e.runToCompletion(ctx, p.TaskID)
	cost, done := spent()
	t.Logf("stopped at $%.4f with %d rows answered", cost, done)
	if stopped.State != store.TaskCancelled || !strings.Contains(stopped.Error, "max cost $10.0000 reached") {
		t.Fatalf("task %s (%q), want CANCELLED at its max cost", stopped.State, stopped.Error)
	}
	if cost > capUSD {
		t.Errorf("calls cost $%.4f, past the cap of $%.2f", cost, capUSD)
	}
	// The stopped task's own counts and sums come from its rows, though
	// their batches never finished: its status shows what it did and spent.
	if est := prices.Task(stopped); !est.Known || est.Cost < cost-1e-9 || est.Cost > cost+1e-9 {
		t.Errorf("the stopped task is priced at %s, want its rows' $%.4f", est, cost)
	}
	if stopped.RowsSucceeded != done {
		t.Errorf("the stopped task counts %d rows succeeded, want the %d its rows say", stopped.RowsSucceeded, done)
	}
	// Calls are held at their worst case ($1.01) while up to 4 run: the
	// task stops within 4 of them of the cap, not far below it.
	if done == 0 || cost < capUSD-4*1.02 {
		t.Errorf("%d rows answered for $%.4f: the cap stopped the task too early", done, cost)
	}
	cells := e.resultCells(stopped)
	notStarted := 0
	for _, row := range cells[1:] {
		if strings.Contains(strings.Join(row, "|"), "not_started") {
			notStarted++
		}
	}
	if notStarted != 60-done {
		t.Errorf("%d rows marked not_started in the result, want the %d not answered", notStarted, 60-done)
	}

	// A higher cap: the retry runs the rest, and only the rest.
	if _, err := e.store.SetTerms(ctx, p.TaskID, store.Terms{MaxCost: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := (pipeline.Retrier{Store: e.store, Queue: e.queue, OwnsWorkers: true}).Retry(ctx, pipeline.RetryParams{TaskID: p.TaskID, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	finished := e.runToCompletion(ctx, p.TaskID)
	if finished.State != store.TaskSucceeded {
		t.Fatalf("after the retry: %s (%q), want SUCCEEDED", finished.State, finished.Error)
	}
	provider.mu.Lock()
	defer provider.mu.Unlock()
	for prompt, n := range provider.paid {
		if n != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n)
		}
	}
	if _, done := spent(); done != 60 {
		t.Errorf("%d rows answered after the retry, want 60", done)
	}
}

// TestMaxCostWithoutPrices: a generator that cannot price calls stops a
// capped task at once rather than spend without bound.
func TestMaxCostWithoutPrices(t *testing.T) {
	t.Parallel()
	provider := newCounting(billingProvider{})
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 2})
	p := e.splitProducts("unpriced", "{{id}} {{name}}", 20, 10)
	ctx := context.Background()
	if _, err := e.store.SetTerms(ctx, p.TaskID, store.Terms{MaxCost: 5}); err != nil {
		t.Fatal(err)
	}
	stopped := e.runToCompletion(ctx, p.TaskID)
	if stopped.State != store.TaskCancelled || !strings.Contains(stopped.Error, "cannot hold a task to a cap") {
		t.Errorf("task %s (%q), want CANCELLED, saying it cannot be held to its cap", stopped.State, stopped.Error)
	}
	if n := len(provider.snapshot()); n != 0 {
		t.Errorf("%d prompts called, want none", n)
	}
}

// TestMaxCostAcrossAFleet: four generators (as four Lambda instances)
// work one capped task at once, sharing its ledger in the store
// (GeneratorConfig.Allowances): together they stop before the cap, not
// each at it, and the stop says the fleet spent it.
func TestMaxCostAcrossAFleet(t *testing.T) {
	t.Parallel()
	price := pricing.Price{InputPerMTok: 1000, OutputPerMTok: 1000}
	prices := pricing.Default().With(map[string]pricing.Price{"sim": price})
	provider := &answeredCounter{Provider: billingProvider{}, paid: map[string]int{}}
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 2, Prices: prices})
	spec := store.TaskSpec{Prompt: "{{id}} {{name}}", Provider: "sim", BatchSize: 5, MaxTokens: 1000}
	const rows, capUSD, fleet = 200, 40.0, 4
	p := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID("fleet-capped", spec), Source: "in.csv", Spec: spec, Terms: store.Terms{MaxCost: capUSD},
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(rows))}
	ctx := context.Background()
	if _, err := e.splitter.Split(ctx, p); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithTimeout(ctx, 60*time.Second)
	defer stop()
	var wg sync.WaitGroup
	for i := range fleet {
		g := pipeline.NewGenerator(e.store, provider, e.signal, pipeline.GeneratorConfig{
			Concurrency: 2, Prices: prices, Allowances: e.store, Cache: e.store, Owner: "instance-" + string(rune('a'+i)), ErrorDelay: 20 * time.Millisecond,
		})
		w := pipeline.NewLocalWorkers(e.queue, g, pipeline.LocalWorkersConfig{Workers: 2, PollInterval: 5 * time.Millisecond})
		wg.Go(func() { _ = w.Run(wctx) })
	}
	select {
	case <-e.signal.C():
	case <-wctx.Done():
		t.Fatal("the capped task did not stop within 60 s")
	}
	// Calls in flight finish (a run would let them); then the workers stop.
	time.Sleep(200 * time.Millisecond)
	stop()
	wg.Wait()
	stopped, err := e.exporter.Export(ctx, p.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	all, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: p.TaskID})
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
	t.Logf("the fleet stopped at $%.4f with %d rows answered: %s", cost, done, stopped.Error)
	if stopped.State != store.TaskCancelled || !strings.Contains(stopped.Error, "max cost $40.0000 reached") || !strings.Contains(stopped.Error, "every generator") {
		t.Fatalf("task %s (%q), want CANCELLED at the fleet's max cost", stopped.State, stopped.Error)
	}
	if cost > capUSD {
		t.Errorf("the fleet's calls cost $%.4f, past the cap of $%.2f", cost, capUSD)
	}
	// Each instance sets aside at most a few calls' worst case ($1.01) at
	// a time beyond its calls in flight: the fleet stops within that of the
	// cap, not far below it.
	if slack := float64(fleet) * 7 * 1.02; cost < capUSD-slack {
		t.Errorf("%d rows answered for $%.4f: the fleet stopped more than $%.2f short of its cap", done, cost, slack)
	}
	provider.mu.Lock()
	defer provider.mu.Unlock()
	for prompt, n := range provider.paid {
		if n != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n)
		}
	}
}

// TestFleetLedgerGetsAllowancesBack: once a capped task's batches end,
// the fleet's ledger holds the cap less what the calls cost: every
// allowance a generator took and did not spend was given back.
func TestFleetLedgerGetsAllowancesBack(t *testing.T) {
	t.Parallel()
	price := pricing.Price{InputPerMTok: 1000, OutputPerMTok: 1000}
	prices := pricing.Default().With(map[string]pricing.Price{"sim": price})
	e := newEnv(t, billingProvider{}, pipeline.GeneratorConfig{Concurrency: 3, Prices: prices})
	e.cfg.Allowances = e.store
	e.useStore(e.store)
	spec := store.TaskSpec{Prompt: "{{id}} {{name}}", Provider: "sim", BatchSize: 5, MaxTokens: 1000}
	const capUSD = 1000.0
	p := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID("ledger-back", spec), Source: "in.csv", Spec: spec, Terms: store.Terms{MaxCost: capUSD},
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(40))}
	ctx := context.Background()
	if _, err := e.splitter.Split(ctx, p); err != nil {
		t.Fatal(err)
	}
	done := e.runToCompletion(ctx, p.TaskID)
	if done.State != store.TaskSucceeded {
		t.Fatalf("task %s (%q), want SUCCEEDED well under its cap", done.State, done.Error)
	}
	cost := prices.Task(done).Cost
	_, left, err := e.store.TakeAllowance(ctx, p.TaskID, capUSD, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := left - (capUSD - cost); diff > 1e-6 || diff < -1e-6 {
		t.Errorf("the ledger holds $%.6f after the task cost $%.6f of $%.0f: $%.6f not given back", left, cost, capUSD, capUSD-cost-left)
	}
}
