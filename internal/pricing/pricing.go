// Package pricing turns token counts into an estimated cost: a price table
// per model (per million input, output and cached-input tokens), built in
// and overridden per provider by the providers file.
//
// A task's estimate (Table.Task) is each provider's token sums, as the task
// keeps them per provider label that answered, at that provider's price;
// tokens the task holds no split for (counted before stores kept one) are
// priced at the task's own provider's. It is an estimate: list prices, no
// discounts.
package pricing

import (
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/store"
)

// Price is what a million tokens cost, in the table's currency (USD for the
// built-in table).
type Price struct {
	InputPerMTok  float64 `yaml:"input_per_mtok"`
	OutputPerMTok float64 `yaml:"output_per_mtok"`
	// CachedInputPerMTok prices input tokens read from the provider's prompt
	// cache; 0 means the provider has no such price and InputPerMTok
	// applies.
	CachedInputPerMTok float64 `yaml:"cached_input_per_mtok"`
	// BatchInputPerMTok and BatchOutputPerMTok price tokens answered
	// through the provider's batch API; 0 means half the online price,
	// which is what OpenAI, Anthropic, Bedrock and Google all charge.
	BatchInputPerMTok  float64 `yaml:"batch_input_per_mtok"`
	BatchOutputPerMTok float64 `yaml:"batch_output_per_mtok"`
}

// BatchSuffix ends the provider label of a row answered through the
// provider's batch API ("openai/gpt-4o-mini (batch)"): the label the row's
// provider column shows and its tokens are summed under, priced at the
// batch price of the label before it.
const BatchSuffix = " (batch)"

// BatchLabel is the label of rows that label's provider answered through
// its batch API.
func BatchLabel(label string) string { return label + BatchSuffix }

// Batch is the price of tokens answered through the provider's batch API:
// the table's batch prices, or half the online ones.
func (p Price) Batch() Price {
	b := Price{InputPerMTok: p.InputPerMTok / 2, OutputPerMTok: p.OutputPerMTok / 2, CachedInputPerMTok: p.CachedInputPerMTok / 2}
	if p.BatchInputPerMTok > 0 {
		b.InputPerMTok = p.BatchInputPerMTok
		if p.CachedInputPerMTok == 0 {
			b.CachedInputPerMTok = 0
		}
	}
	if p.BatchOutputPerMTok > 0 {
		b.OutputPerMTok = p.BatchOutputPerMTok
	}
	return b
}

// Cost is what u costs at p.
func (p Price) Cost(u store.Usage) float64 {
	cached := min(max(u.CachedInputTokens, 0), max(u.InputTokens, 0))
	cachedPrice := p.InputPerMTok
	if p.CachedInputPerMTok > 0 {
		cachedPrice = p.CachedInputPerMTok
	}
	return (float64(u.InputTokens-cached)*p.InputPerMTok +
		float64(cached)*cachedPrice +
		float64(u.OutputTokens)*p.OutputPerMTok) / 1e6
}

func (p Price) validate() error {
	for _, v := range []float64{p.InputPerMTok, p.OutputPerMTok, p.CachedInputPerMTok, p.BatchInputPerMTok, p.BatchOutputPerMTok} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("price %v: must be a finite number >= 0", v)
		}
	}
	return nil
}

// Table maps model ids (and provider names) to prices.
type Table struct {
	prices map[string]Price
}

//go:embed prices.yaml
var builtin []byte

// Default returns the built-in table (prices.yaml).
func Default() *Table {
	t, err := Parse("built-in prices", builtin)
	if err != nil {
		panic("pricing: " + err.Error()) // the embedded file is tested
	}
	return t
}

// Parse reads a price table: a YAML mapping `models: {MODEL: {input_per_mtok,
// output_per_mtok, cached_input_per_mtok}}`; name is used in messages.
func Parse(name string, data []byte) (*Table, error) {
	var doc struct {
		Models map[string]Price `yaml:"models"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(doc.Models) == 0 {
		return nil, fmt.Errorf("%s: no prices: list them under `models:`", name)
	}
	t := &Table{prices: map[string]Price{}}
	var errs []error
	for model, p := range doc.Models {
		if err := p.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: model %s: %w", name, model, err))
		}
		t.prices[model] = p
	}
	return t, errors.Join(errs...)
}

// With returns a copy of t with prices set for the given keys (provider
// names or model ids), which win over t's own.
func (t *Table) With(prices map[string]Price) *Table {
	out := &Table{prices: make(map[string]Price, len(t.prices)+len(prices))}
	for k, p := range t.prices {
		out.prices[k] = p
	}
	for k, p := range prices {
		out.prices[k] = p
	}
	return out
}

// Lookup returns the price of the first key that has one, each key tried
// exactly, then without a Bedrock inference-profile prefix, then as the
// longest table entry it starts with.
func (t *Table) Lookup(keys ...string) (Price, bool) {
	for _, k := range keys {
		if k == "" {
			continue
		}
		if p, ok := t.prices[k]; ok {
			return p, true
		}
		// A cross-region inference profile is billed as its model.
		base, _ := providerfile.BedrockBaseModel(k)
		if p, ok := t.prices[base]; ok {
			return p, true
		}
		best := ""
		for name := range t.prices {
			if len(name) > len(best) && strings.HasPrefix(base, name) {
				best = name
			}
		}
		if best != "" {
			return t.prices[best], true
		}
	}
	return Price{}, false
}

// Estimate is a task's estimated cost.
type Estimate struct {
	// Cost is in the table's currency; meaningful only when Known.
	Cost float64
	// Known is false when no price matches the task's provider or model.
	Known bool
	// Saved is what the rows answered through the provider's batch API
	// would have cost more online.
	Saved float64
}

// String is the cost for people: "$0.0123", with six decimals below a
// cent so that a small job does not read as free ("$0.000040"), or
// "unknown" without a price; then what the batch API saved, if anything.
func (e Estimate) String() string {
	if !e.Known {
		return "unknown"
	}
	out := money(e.Cost)
	if e.Saved > 0 {
		out += ", " + money(e.Saved) + " less than online through the batch API"
	}
	return out
}

func money(v float64) string {
	if v < 0.01 {
		return fmt.Sprintf("$%.6f", v)
	}
	return fmt.Sprintf("$%.4f", v)
}

// Task estimates what task cost so far, the one way every reader prices a
// task (run summary, status, tasks, the API): each of its per-provider
// token sums (store.Task.UsageByProvider) at the price of that provider,
// looked up by the label (a providers-file entry's name, or a model), then
// by the part after "provider/" (the one-provider label
// "openai/gpt-4o-mini"), then, for rows without a label or with the task's
// own, as the task's provider or model; and the tokens without a split
// (store.Task.UsageUnattributed: a task counted before the split was kept)
// at the price of the task's provider or, failing that, its model. The
// estimate is unknown when any tokens have no price, rather than silently
// leaving their cost out.
func (t *Table) Task(task store.Task) Estimate {
	spec := task.Spec
	e := Estimate{Known: true}
	// Sorted, so the same task always sums to the same float.
	for _, label := range slices.Sorted(maps.Keys(task.UsageByProvider)) {
		u := task.UsageByProvider[label]
		if u == (store.Usage{}) {
			continue
		}
		base, batch := strings.CutSuffix(label, BatchSuffix)
		keys := []string{base}
		if _, model, ok := strings.Cut(base, "/"); ok {
			keys = append(keys, model)
		}
		if base == "" || base == spec.Provider || base == spec.Provider+"/"+spec.Model {
			keys = append(keys, spec.Provider, spec.Model) // the task's own provider
		}
		p, ok := t.Lookup(keys...)
		if !ok {
			return Estimate{}
		}
		if !batch {
			e.Cost += p.Cost(u)
			continue
		}
		online, cost := p.Cost(u), p.Batch().Cost(u)
		e.Cost += cost
		e.Saved += online - cost
	}
	// A task without a split needs its provider's price even at zero
	// tokens: an unpriced model shows unknown, not free.
	if rest := task.UsageUnattributed(); rest != (store.Usage{}) || len(task.UsageByProvider) == 0 {
		p, ok := t.Lookup(spec.Provider, spec.Model)
		if !ok {
			return Estimate{}
		}
		e.Cost += p.Cost(rest)
	}
	return e
}

// Merge returns a copy of t in which o's prices win.
func (t *Table) Merge(o *Table) *Table { return t.With(o.prices) }

// Load reads a price table file (the layout of the built-in prices.yaml)
// and returns the built-in table with its prices winning; an empty path
// gives the built-in table.
func Load(path string) (*Table, error) {
	if path == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("prices: %w", err)
	}
	t, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	return Default().Merge(t), nil
}

// FromProviders returns t with the prices of a providers file's entries
// that give one, under the entry's name and its model: a task or a row
// answered by that provider is priced by its entry.
func (t *Table) FromProviders(f *providerfile.File) *Table {
	if f == nil {
		return t
	}
	prices := map[string]Price{}
	for _, p := range f.Providers {
		if p.Price == (providerfile.Price{}) {
			// No price given: the table's own for the model, also under
			// the entry's name, which is what its rows record.
			if mp, ok := t.Lookup(p.Model); ok {
				if _, dup := prices[p.Name]; !dup {
					prices[p.Name] = mp
				}
			}
			continue
		}
		price := Price{InputPerMTok: p.Price.InputPerMTok, OutputPerMTok: p.Price.OutputPerMTok, CachedInputPerMTok: p.Price.CachedInputPerMTok}
		prices[p.Name] = price
		if p.Model != "" {
			if _, dup := prices[p.Model]; !dup {
				prices[p.Model] = price
			}
		}
	}
	return t.With(prices)
}
