package providerfile

import (
	"fmt"
	"strings"
	"time"
)

// Kinds are the provider kinds, in the order messages list them.
var Kinds = []Kind{KindOpenAI, KindBedrock, KindSim, KindMock}

// ParseKind reads a provider kind as every entry point takes it: a file's
// `kind:`, batchgen's --provider, the template's MODEL_PROVIDER.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("%q: use %s", s, kindList())
}

func kindList() string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// DefaultModel is the model of a provider of kind k that names none ("" for
// bedrock, which must name one).
func DefaultModel(k Kind) string { return defaultModels[k] }

// defaultModels is the model of a provider that names none.
var defaultModels = map[Kind]string{KindOpenAI: "gpt-4o-mini", KindSim: "sim-1", KindMock: "mock-1"}

// Single is one provider given by an entry point's own settings instead of
// a file: batchgen's single-provider flags (--provider, --model, --rpm,
// ...) or the template's model parameters (MODEL_PROVIDER, MODEL_NAME,
// QUOTA_RPM, ...). File turns it into the one-entry file both take, so a
// provider set up either way passes the same Validate and gets the same
// name, defaults and quota.
type Single struct {
	// Kind is the provider kind, as ParseKind reads it.
	Kind Kind
	// Model is the model; "" for the kind's default (DefaultModel).
	Model string
	// BaseURL, Region and APIKeyParam are as in a file's entry.
	BaseURL, Region, APIKeyParam string
	// RPM, TPM and Concurrency are the quota and the calls in flight.
	RPM, TPM, Concurrency int
	// Timeout bounds one call; 0 for the default.
	Timeout time.Duration
	// Latency and Jitter shape the simulator's calls (kind sim only; other
	// kinds ignore them).
	Latency, Jitter time.Duration
}

// File returns the one-entry providers file of s, validated. The entry is
// named kind/model, as rows answered by a task's own provider are labelled.
// A sim entry takes no base URL ($OPENAI_BASE_URL is not the simulator's)
// and only sim takes a latency; only openai takes an API key parameter.
func (s Single) File() (*File, error) {
	model := s.Model
	if model == "" {
		model = DefaultModel(s.Kind)
	}
	entry := Provider{
		Name: string(s.Kind) + "/" + model, Kind: s.Kind, BaseURL: s.BaseURL, Model: model, Region: s.Region,
		RPM: s.RPM, TPM: s.TPM, Concurrency: s.Concurrency, Timeout: s.Timeout,
	}
	switch s.Kind {
	case KindOpenAI:
		entry.APIKeyParam = s.APIKeyParam
	case KindSim:
		entry.BaseURL = ""
		entry.Latency, entry.Jitter = s.Latency, s.Jitter
	}
	f := &File{Providers: []Provider{entry}}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return f, nil
}

// Concurrency is the most rows f's providers have in flight at once: the
// sum of their concurrency (a generator's row slots).
func (f *File) Concurrency() int {
	n := 0
	for _, p := range f.Providers {
		n += p.Concurrency
	}
	return n
}

// PackTokens is the most estimated prompt tokens one call packing several
// rows should carry so that it fits any of f's token quotas with room to
// spare: a quarter of the smallest tpm, or 0 when no provider has one.
func (f *File) PackTokens() int {
	n := 0
	for _, p := range f.Providers {
		if p.TPM > 0 && (n == 0 || p.TPM/4 < n) {
			n = max(p.TPM/4, 1)
		}
	}
	return n
}

// RPM is the requests per minute f's providers allow together, or 0 when a
// provider has no rpm (its quota is learnt from the provider's answers, so
// the sum is not known in advance). The progress line paces its ETA by it.
func (f *File) RPM() int {
	n := 0
	for _, p := range f.Providers {
		if p.RPM <= 0 {
			return 0
		}
		n += p.RPM
	}
	return n
}
