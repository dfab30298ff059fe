package pricing

import (
	"math"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/store"
)

func TestCost(t *testing.T) {
	t.Parallel()
	p := Price{InputPerMTok: 0.15, OutputPerMTok: 0.60, CachedInputPerMTok: 0.075}
	tests := []struct {
		name  string
		price Price
		usage store.Usage
		want  float64
	}{
		{"nothing", p, store.Usage{}, 0},
		{"a million in, a million out", p, store.Usage{InputTokens: 1e6, OutputTokens: 1e6}, 0.75},
		{"cached input at its own price", p, store.Usage{InputTokens: 1e6, CachedInputTokens: 4e5}, 0.6*0.15 + 0.4*0.075},
		{"no cached price: input price", Price{InputPerMTok: 1}, store.Usage{InputTokens: 1e6, CachedInputTokens: 1e6}, 1},
		{"cached more than input is capped", p, store.Usage{InputTokens: 10, CachedInputTokens: 20}, 10 * 0.075 / 1e6},
		{"5,000 rows of 200 in, 80 out", p, store.Usage{InputTokens: 5000 * 200, OutputTokens: 5000 * 80}, 0.15 + 0.4*0.60},
	}
	for _, tt := range tests {
		if got := tt.price.Cost(tt.usage); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("%s: Cost = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()
	table := Default().With(map[string]Price{"local-llama": {InputPerMTok: 0.01, OutputPerMTok: 0.02}})
	gpt4oMini := Price{InputPerMTok: 0.15, OutputPerMTok: 0.60, CachedInputPerMTok: 0.075}
	nova := Price{InputPerMTok: 0.06, OutputPerMTok: 0.24, CachedInputPerMTok: 0.015}
	tests := []struct {
		name   string
		keys   []string
		want   Price
		wantOK bool
	}{
		{"exact model", []string{"gpt-4o-mini"}, gpt4oMini, true},
		{"dated model: longest prefix", []string{"gpt-4o-mini-2024-07-18"}, gpt4oMini, true},
		{"bigger sibling keeps its price", []string{"gpt-4o-2024-08-06"}, Price{InputPerMTok: 2.5, OutputPerMTok: 10, CachedInputPerMTok: 1.25}, true},
		{"bedrock model id", []string{"amazon.nova-lite-v1:0"}, nova, true},
		{"bedrock inference profile", []string{"us.amazon.nova-lite-v1:0"}, nova, true},
		{"provider name first", []string{"local-llama", "gpt-4o-mini"}, Price{InputPerMTok: 0.01, OutputPerMTok: 0.02}, true},
		{"falls back to the model", []string{"openai", "gpt-4o-mini"}, gpt4oMini, true},
		{"simulator is free", []string{"sim", "sim-1"}, Price{}, true},
		{"unknown", []string{"openai", "my-finetune"}, Price{}, false},
		{"nothing", nil, Price{}, false},
	}
	for _, tt := range tests {
		got, ok := table.Lookup(tt.keys...)
		if ok != tt.wantOK {
			t.Errorf("%s: found %v, want %v", tt.name, ok, tt.wantOK)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: price (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestTaskEstimate(t *testing.T) {
	t.Parallel()
	task := store.Task{
		Spec:  store.TaskSpec{Provider: "openai", Model: "gpt-4o-mini"},
		Usage: store.Usage{InputTokens: 2e6, OutputTokens: 1e6},
	}
	got := Default().Task(task)
	if !got.Known || math.Abs(got.Cost-0.9) > 1e-12 || got.String() != "$0.9000" {
		t.Errorf("estimate = %+v (%s), want $0.9000", got, got)
	}
	task.Usage = store.Usage{InputTokens: 100, OutputTokens: 10}
	if got := Default().Task(task).String(); got != "$0.000021" {
		t.Errorf("small cost = %s, want $0.000021 (six decimals below a cent)", got)
	}
	task.Spec.Model = "unpriced"
	if got := Default().Task(task); got.Known || got.String() != "unknown" {
		t.Errorf("unpriced model: estimate = %+v (%s), want unknown", got, got)
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, yaml, want string }{
		{"empty", "", "prices.yaml: EOF"},
		{"no models", "models: {}\n", "no prices"},
		{"unknown key", "models:\n  m: {input_per_mtok: 1, outptu_per_mtok: 2}\n", "field outptu_per_mtok not found"},
		{"negative", "models:\n  m: {input_per_mtok: -1}\n", "model m: price -1: must be a finite number >= 0"},
		{"not a number", "models:\n  m: {input_per_mtok: cheap}\n", "cannot unmarshal"},
	}
	for _, tt := range tests {
		_, err := Parse("prices.yaml", []byte(tt.yaml))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error = %v, want it to contain %q", tt.name, err, tt.want)
		}
	}
}

func TestDefaultTableParses(t *testing.T) {
	t.Parallel()
	if _, err := Parse("prices.yaml", builtin); err != nil {
		t.Fatal(err)
	}
}

func TestOverrides(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := dir + "/prices.yaml"
	if err := os.WriteFile(path, []byte("models:\n  gpt-4o-mini: {input_per_mtok: 1, output_per_mtok: 2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	table, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := table.Lookup("gpt-4o-mini"); got != (Price{InputPerMTok: 1, OutputPerMTok: 2}) {
		t.Errorf("overridden gpt-4o-mini = %+v", got)
	}
	if _, ok := table.Lookup("amazon.nova-lite-v1:0"); !ok {
		t.Error("a prices file dropped the built-in entries it does not name")
	}
	if _, err := Load(dir + "/missing.yaml"); err == nil {
		t.Error("Load of a missing file: no error")
	}

	f, err := providerfile.Parse("providers.yaml", []byte(`providers:
  - name: primary
    kind: openai
    model: gpt-4o-mini
    price: {input_per_mtok: 0.5, output_per_mtok: 1.5, cached_input_per_mtok: 0.25}
  - name: local
    kind: mock
    base_url: http://127.0.0.1:8089/v1
`))
	if err != nil {
		t.Fatal(err)
	}
	table = Default().FromProviders(f)
	want := Price{InputPerMTok: 0.5, OutputPerMTok: 1.5, CachedInputPerMTok: 0.25}
	for _, key := range []string{"primary", "gpt-4o-mini"} {
		if got, _ := table.Lookup(key); got != want {
			t.Errorf("Lookup(%s) = %+v, want the providers file's %+v", key, got, want)
		}
	}
	if got, ok := table.Lookup("local", "mock-1"); !ok || got != (Price{}) {
		t.Errorf("an entry without a price keeps the table's for its model: %+v, %v", got, ok)
	}
}

// A task routed over providers of different prices costs the sum of each
// provider's tokens at its own price; tokens the task holds no split for
// (an old task's) cost the task's own provider's price.
func TestTaskByProvider(t *testing.T) {
	f, err := providerfile.Parse("providers.yaml", []byte(`providers:
  - name: cheap
    kind: sim
    price: {input_per_mtok: 1, output_per_mtok: 2}
  - name: dear
    kind: sim
    price: {input_per_mtok: 10, output_per_mtok: 20, cached_input_per_mtok: 5}
  - name: mini
    kind: openai
    model: gpt-4o-mini
  - name: unpriced
    kind: openai
    model: a-model-without-a-price
`))
	if err != nil {
		t.Fatal(err)
	}
	table := Default().FromProviders(f)
	spec := store.TaskSpec{Provider: "openai", Model: "gpt-4o"}
	mtok := func(in, out, cached int64) store.Usage {
		return store.Usage{InputTokens: in * 1e6, OutputTokens: out * 1e6, CachedInputTokens: cached * 1e6}
	}
	for _, tc := range []struct {
		name  string
		usage map[string]store.Usage
		// extra are tokens in the task's Usage beyond the split's sum.
		extra store.Usage
		want  Estimate
	}{
		{"two providers, two prices", map[string]store.Usage{"cheap": mtok(1, 1, 0), "dear": mtok(1, 1, 0)}, store.Usage{},
			Estimate{Cost: 1 + 2 + 10 + 20, Known: true}},
		{"cached input at the provider's own cached price", map[string]store.Usage{"cheap": mtok(2, 0, 1), "dear": mtok(2, 0, 1)}, store.Usage{},
			Estimate{Cost: 2*1 + 10 + 5, Known: true}},
		{"an entry without a price is priced by its model", map[string]store.Usage{"mini": mtok(1, 1, 0), "cheap": mtok(0, 1, 0)}, store.Usage{},
			Estimate{Cost: 0.15 + 0.60 + 2, Known: true}},
		{"the one-provider label and unlabelled rows take the task's price", map[string]store.Usage{"openai/gpt-4o": mtok(1, 0, 0), "": mtok(0, 1, 0)}, store.Usage{},
			Estimate{Cost: 2.50 + 10, Known: true}},
		{"a provider without any price makes the estimate unknown", map[string]store.Usage{"cheap": mtok(1, 1, 0), "unpriced": mtok(1, 0, 0)}, store.Usage{},
			Estimate{}},
		{"a provider with no tokens does not need a price", map[string]store.Usage{"cheap": mtok(1, 0, 0), "unpriced": {}}, store.Usage{},
			Estimate{Cost: 1, Known: true}},
		{"an old task without a split: its sums at the task's provider's price", nil, mtok(1, 1, 0),
			Estimate{Cost: 2.50 + 10, Known: true}},
		{"tokens beyond the split at the task's provider's price", map[string]store.Usage{"dear": mtok(1, 0, 0)}, mtok(0, 1, 0),
			Estimate{Cost: 10 + 10, Known: true}},
		{"no tokens", nil, store.Usage{}, Estimate{Known: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := store.Task{Spec: spec, Usage: store.SumUsage(tc.usage).Add(tc.extra), UsageByProvider: tc.usage}
			got := table.Task(task)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("Task (-want +got):\n%s", diff)
			}
		})
	}
	// Tokens beyond the split need the task's provider's price: unknown
	// without one, rather than left out.
	unpriced := store.Task{Spec: store.TaskSpec{Provider: "nobody", Model: "nothing"},
		Usage: mtok(2, 0, 0), UsageByProvider: map[string]store.Usage{"cheap": mtok(1, 0, 0)}}
	if got := table.Task(unpriced); got.Known {
		t.Errorf("Task with unpriced tokens beyond the split = %+v, want unknown", got)
	}
	unpriced.Usage = mtok(1, 0, 0)
	if got := table.Task(unpriced); !got.Known || math.Abs(got.Cost-1) > 1e-9 {
		t.Errorf("Task with its whole split priced = %+v, want $1 whatever the task's provider", got)
	}
}

// TestBatchPrice: tokens answered through a batch API cost the table's
// batch prices, or half the online ones; a task's estimate prices its
// batch-labelled tokens so and shows what they saved against online.
func TestBatchPrice(t *testing.T) {
	t.Parallel()
	u := store.Usage{InputTokens: 1_000_000, OutputTokens: 2_000_000, CachedInputTokens: 400_000}
	tests := []struct {
		name  string
		price Price
		want  float64
	}{
		{"half by default", Price{InputPerMTok: 2, OutputPerMTok: 8, CachedInputPerMTok: 1}, (0.6*1 + 0.4*0.5 + 2*4)},
		{"the table's batch prices", Price{InputPerMTok: 2, OutputPerMTok: 8, CachedInputPerMTok: 1, BatchInputPerMTok: 1.5, BatchOutputPerMTok: 5}, (0.6*1.5 + 0.4*0.5 + 2*5)},
		{"a batch input price without a cached one", Price{InputPerMTok: 2, OutputPerMTok: 8, BatchInputPerMTok: 1.5}, (1*1.5 + 2*4)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.price.Batch().Cost(u); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("batch cost %v, want %v", got, tc.want)
			}
		})
	}
	table := Default().With(map[string]Price{"gpt-x": {InputPerMTok: 2, OutputPerMTok: 8}})
	task := store.Task{Spec: store.TaskSpec{Provider: "openai", Model: "gpt-x"}, UsageByProvider: map[string]store.Usage{
		"openai/gpt-x":             {InputTokens: 1_000_000, OutputTokens: 1_000_000},
		BatchLabel("openai/gpt-x"): {InputTokens: 2_000_000, OutputTokens: 1_000_000},
	}}
	e := table.Task(task)
	if want := (2.0 + 8) + (2*1.0 + 4); !e.Known || math.Abs(e.Cost-want) > 1e-9 {
		t.Errorf("estimate %+v, want cost %v", e, want)
	}
	if want := 2*1.0 + 4; math.Abs(e.Saved-want) > 1e-9 {
		t.Errorf("saved %v, want %v", e.Saved, want)
	}
	if got, want := e.String(), "$16.0000, $6.0000 less than online through the batch API"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if _, err := Parse("t", []byte("models:\n  m: {input_per_mtok: 1, output_per_mtok: 1, batch_output_per_mtok: -1}\n")); err == nil {
		t.Error("a negative batch price was taken")
	}
}
