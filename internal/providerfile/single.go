package providerfile

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Kinds are the provider kinds, in the order messages list them.
var Kinds = []Kind{KindOpenAI, KindAnthropic, KindBedrock, KindSim, KindMock}

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

// kindDefaults are what each provider kind takes by default: the one
// statement of them, read by every entry point through the functions
// below.
var kindDefaults = map[Kind]struct {
	// model is the model of a provider that names none ("" for bedrock,
	// which must name one).
	model string
	// keyEnv is the environment variable the key is read from when the
	// entry names neither api_key_env nor api_key_param ("" for none).
	keyEnv string
	// baseURLEnv is the environment variable batchgen's --base-url
	// defaults to, as the provider's own SDKs and tools read it.
	baseURLEnv string
	// takesKey: the kind is called with an API key (bedrock signs with
	// IAM credentials, sim needs none).
	takesKey bool
}{
	KindOpenAI:    {model: "gpt-4o-mini", keyEnv: "OPENAI_API_KEY", baseURLEnv: "OPENAI_BASE_URL", takesKey: true},
	KindAnthropic: {model: "claude-haiku-4-5", keyEnv: "ANTHROPIC_API_KEY", baseURLEnv: "ANTHROPIC_BASE_URL", takesKey: true},
	KindBedrock:   {},
	KindSim:       {model: "sim-1"},
	KindMock:      {model: "mock-1", baseURLEnv: "OPENAI_BASE_URL", takesKey: true},
}

// DefaultModel is the model of a provider of kind k that names none ("" for
// bedrock, which must name one).
func DefaultModel(k Kind) string { return kindDefaults[k].model }

// KeyEnv is the environment variable a provider of kind k reads its API key
// from by default: OPENAI_API_KEY, ANTHROPIC_API_KEY, or "" for kinds that
// take none by default.
func KeyEnv(k Kind) string { return kindDefaults[k].keyEnv }

// BaseURLEnv is the environment variable batchgen's --base-url defaults to
// for kind k (OPENAI_BASE_URL, ANTHROPIC_BASE_URL), or "".
func BaseURLEnv(k Kind) string { return kindDefaults[k].baseURLEnv }

// TakesKey reports whether kind k is called with an API key.
func TakesKey(k Kind) bool { return kindDefaults[k].takesKey }

// keyKinds lists the kinds that take an API key, for messages.
func keyKinds() string {
	var names []string
	for _, k := range Kinds {
		if TakesKey(k) {
			names = append(names, string(k))
		}
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

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
	// BatchBucket and BatchRoleARN let a bedrock provider run batch
	// inference jobs (as in a file's entry; other kinds ignore them).
	BatchBucket, BatchRoleARN string
	// Names are what the entry point calls the settings, for its errors;
	// the zero value uses the file's keys.
	Names SettingNames
}

// SettingNames are what an entry point calls the settings that depend on
// the provider kind (run's --provider and --model, the stack's
// MODEL_PROVIDER and MODEL_NAME), so that the kind rules, written once in
// kindRules, word a Single's errors in its caller's terms.
type SettingNames struct{ Kind, Model, BaseURL, Region string }

// fileNames are a providers file's keys.
var fileNames = SettingNames{Kind: "kind", Model: "model", BaseURL: "base_url", Region: "region"}

// kindRule is a setting that p's kind requires or does not use.
type kindRule struct {
	// field names the setting: one of fileNames's values.
	field string
	// required: the kind needs the setting (else it does not use it).
	required bool
	// hint says what to give.
	hint string
}

// kindRules are the settings an entry's kind requires and it lacks, or
// does not use and it has: the one statement of which kind takes what.
func kindRules(p Provider) []kindRule {
	var out []kindRule
	if p.Kind == KindBedrock && p.Model == "" {
		out = append(out, kindRule{field: fileNames.Model, required: true, hint: "a Bedrock model id (amazon.nova-lite-v1:0), inference profile id (us.amazon.nova-lite-v1:0) or ARN"})
	}
	if p.Kind == KindMock && p.BaseURL == "" {
		out = append(out, kindRule{field: fileNames.BaseURL, required: true, hint: "the batchgen mock-llm server's http://HOST:PORT/v1"})
	}
	if p.Kind == KindSim && p.BaseURL != "" {
		out = append(out, kindRule{field: fileNames.BaseURL, hint: "the simulator runs in-process"})
	}
	if p.Region != "" && p.Kind != KindBedrock {
		out = append(out, kindRule{field: fileNames.Region, hint: "only bedrock has a region"})
	}
	return out
}

// message words r for kind k in names.
func (r kindRule) message(k Kind, names SettingNames) string {
	field := map[string]string{fileNames.Model: names.Model, fileNames.BaseURL: names.BaseURL, fileNames.Region: names.Region}[r.field]
	if r.required {
		return fmt.Sprintf("%s %s needs %s: %s", names.Kind, k, field, r.hint)
	}
	return fmt.Sprintf("%s is not used by %s %s (%s)", field, names.Kind, k, r.hint)
}

// File returns the one-entry providers file of s, validated. The entry is
// named kind/model, as rows answered by a task's own provider are labelled.
// A sim entry takes no base URL ($OPENAI_BASE_URL is not the simulator's)
// and only sim takes a latency; only openai and anthropic take an API key
// parameter.
func (s Single) File() (*File, error) {
	model := s.Model
	if model == "" {
		model = DefaultModel(s.Kind)
	}
	entry := Provider{
		Name: string(s.Kind) + "/" + model, Kind: s.Kind, BaseURL: s.BaseURL, Model: model, Region: s.Region,
		RPM: s.RPM, TPM: s.TPM, Concurrency: s.Concurrency, Timeout: s.Timeout,
	}
	switch {
	case TakesKey(s.Kind) && s.Kind != KindMock:
		entry.APIKeyParam = s.APIKeyParam
	case s.Kind == KindSim:
		entry.BaseURL = ""
		entry.Latency, entry.Jitter = s.Latency, s.Jitter
	case s.Kind == KindBedrock && s.BatchBucket != "" && s.BatchRoleARN != "":
		entry.BatchBucket, entry.BatchRoleARN = s.BatchBucket, s.BatchRoleARN
	}
	names := s.Names
	if names == (SettingNames{}) {
		names = fileNames
	}
	// The kind rules first, in the caller's terms; Validate checks them
	// again in the file's, and the rest.
	if rules := kindRules(entry); len(rules) > 0 {
		return nil, errors.New(rules[0].message(s.Kind, names))
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

// onlineSecondsPerCall is how long one online call is taken to last when
// estimating a pace from concurrency alone: a generous figure for a
// completion of a few hundred tokens.
const onlineSecondsPerCall = 2.0

// OnlineRate is how many rows a second f's providers answer online at
// most: their concurrency at onlineSecondsPerCall a call, and no faster
// than their rpm when every provider has one. An auto task cuts over to
// online when its waiting rows would need the time left at this pace.
func (f *File) OnlineRate() float64 {
	rate := float64(f.Concurrency()) / onlineSecondsPerCall
	if rpm := f.RPM(); rpm > 0 {
		rate = min(rate, float64(rpm)/60)
	}
	return rate
}
