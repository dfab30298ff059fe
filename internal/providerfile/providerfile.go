// Package providerfile reads the providers file (`--providers FILE`, or
// the ProvidersFile template parameter on AWS): the model providers a task
// may call, each with its own quota, concurrency, timeout and price, and
// how rows are routed between them.
//
// Decoding is strict: an unknown key is an error naming the key, its line
// and the file, because a misspelt `rmp:` silently ignored would run a job
// without its quota. Every other rule lives in Validate, so a file, the
// single-provider flags of `batchgen run` (which build a one-entry File)
// and the Lambda wiring all pass the same checks.
package providerfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Mode is how rows are routed between providers.
type Mode string

// Routing modes.
const (
	// Ordered sends each row to the first provider (in file order) that
	// has a free slot; the next ones take the overflow and the failovers.
	Ordered Mode = "ordered"
	// Weighted spreads rows over the providers with a free slot in
	// proportion to their weights.
	Weighted Mode = "weighted"
)

// Kind is a provider's wire protocol.
type Kind string

// Provider kinds.
const (
	// KindOpenAI is any OpenAI-compatible chat completions server.
	KindOpenAI Kind = "openai"
	// KindAnthropic is Anthropic's Messages API.
	KindAnthropic Kind = "anthropic"
	// KindBedrock is Amazon Bedrock's Converse API.
	KindBedrock Kind = "bedrock"
	// KindSim is the in-process simulator (no network, no key).
	KindSim Kind = "sim"
	// KindMock is a `batchgen mock-llm` server: the OpenAI wire protocol at
	// base_url, no key needed.
	KindMock Kind = "mock"
)

// Defaults applied by Validate.
const (
	DefaultConcurrency = 8
	DefaultTimeout     = 60 * time.Second
	DefaultWeight      = 1
)

// File is the providers file.
type File struct {
	// Routing is ordered (the default) or weighted.
	Routing Mode `yaml:"routing"`
	// Providers are the routes, in preference order.
	Providers []Provider `yaml:"providers"`

	// name is where the file came from, for messages.
	name string
}

// Provider is one route: an endpoint and model with its own bulkhead.
type Provider struct {
	// Name identifies the provider in logs, metrics and the result's
	// provider column. Required, unique.
	Name string `yaml:"name"`
	// Kind is openai, anthropic, bedrock, sim or mock. Required.
	Kind Kind `yaml:"kind"`
	// BaseURL is the API root of an openai or mock provider (".../v1"),
	// of an anthropic one (without /v1, as its SDK takes it), or an
	// endpoint override for bedrock. Required for mock; openai and
	// anthropic default to the vendor's.
	BaseURL string `yaml:"base_url"`
	// Model is the model id sent. Defaults per kind (DefaultModel);
	// required for bedrock.
	Model string `yaml:"model"`
	// Region is the AWS region of a bedrock provider. Defaults to the SDK's
	// (AWS_REGION).
	Region string `yaml:"region"`
	// APIKeyEnv names the environment variable holding the key of an
	// openai, anthropic or mock provider (the key itself never goes in the
	// file). Defaults per kind (KeyEnv): OPENAI_API_KEY,
	// ANTHROPIC_API_KEY.
	APIKeyEnv string `yaml:"api_key_env"`
	// APIKeyParam names the SSM SecureString parameter holding the key of
	// an openai, anthropic or mock provider, read by the generator Lambda
	// at cold start (its role must be allowed to read it). Instead of
	// APIKeyEnv.
	APIKeyParam string `yaml:"api_key_param"`
	// RPM and TPM are this provider's requests and tokens per minute
	// quotas; 0 means unlimited (or unknown: learnt from 429s).
	RPM int `yaml:"rpm"`
	TPM int `yaml:"tpm"`
	// Concurrency bounds this provider's calls in flight. Defaults to 8.
	Concurrency int `yaml:"concurrency"`
	// Timeout bounds one call to this provider ("30s"). Defaults to 60s.
	Timeout time.Duration `yaml:"timeout"`
	// Weight is the provider's share in weighted routing. Defaults to 1; 0
	// makes it a standby that only takes failovers.
	Weight *int `yaml:"weight"`
	// Price is what a million tokens cost, for the task's estimated cost.
	Price Price `yaml:"price"`
	// Latency and Jitter shape a sim provider's simulated calls.
	Latency time.Duration `yaml:"latency"`
	Jitter  time.Duration `yaml:"jitter"`
	// BatchBucket, BatchPrefix and BatchRoleARN let a bedrock provider run
	// economy and auto tasks as batch inference jobs: the S3 bucket (and
	// key prefix, "provider-batches/" by default) holding the jobs' input
	// and output, and the service role Bedrock assumes to read and write
	// them. Without them, such tasks are called online, saying why.
	BatchBucket  string `yaml:"batch_bucket"`
	BatchPrefix  string `yaml:"batch_prefix"`
	BatchRoleARN string `yaml:"batch_role_arn"`

	// line is where the entry starts in its file, for messages.
	line int
}

// Price is a provider's price list, in currency units (e.g. USD) per
// million tokens.
type Price struct {
	InputPerMTok       float64 `yaml:"input_per_mtok"`
	OutputPerMTok      float64 `yaml:"output_per_mtok"`
	CachedInputPerMTok float64 `yaml:"cached_input_per_mtok"`
}

// Error is a problem with the providers file, naming where it is.
type Error struct {
	// File is the file's name ("" for flags).
	File string
	// Line is the 1-based line, or 0 when not known.
	Line int
	// Msg says what is wrong.
	Msg string
}

func (e *Error) Error() string {
	switch {
	case e.File != "" && e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	case e.File != "":
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return e.Msg
}

// ssmName is a hierarchical SSM parameter name, as the template's
// ModelApiKeyParam takes it.
var ssmName = regexp.MustCompile(`^(/[A-Za-z0-9_.-]+)+$`)

// maxFileBytes bounds a providers file: a handful of entries is a few
// hundred bytes, so anything near this is not a providers file.
const maxFileBytes = 1 << 20

// Load reads, decodes and validates the providers file at path.
func Load(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("providers file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("providers file %s: %w", path, err)
	}
	if len(b) > maxFileBytes {
		return nil, &Error{File: path, Msg: fmt.Sprintf("larger than %d bytes", maxFileBytes)}
	}
	return Parse(path, b)
}

// Parse decodes and validates a providers file's content; name is used in
// messages (a path, or e.g. "ProvidersFile parameter").
func Parse(name string, data []byte) (*File, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{File: name, Msg: "empty: list the providers under `providers:`"}
		}
		return nil, lineError(name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &Error{File: name, Msg: "more than one YAML document; give one"}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if err := checkKeys(root, reflect.TypeFor[File](), "", name); err != nil {
		return nil, err
	}
	var f File
	if err := root.Decode(&f); err != nil {
		return nil, typeError(name, err)
	}
	f.name = name
	if seq := mapValue(root, "providers"); seq != nil && seq.Kind == yaml.SequenceNode {
		for i, n := range seq.Content {
			if i < len(f.Providers) {
				f.Providers[i].line = n.Line
			}
		}
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// typeError rewrites yaml's "yaml: unmarshal errors:\n  line 3: cannot
// unmarshal ..." as one *Error per line.
func typeError(name string, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return &Error{File: name, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var errs []error
	for _, m := range te.Errors {
		errs = append(errs, lineError(name, m))
	}
	return errors.Join(errs...)
}

// lineError turns yaml's "line 3: msg" into an *Error with its line.
func lineError(name, m string) *Error {
	line := 0
	if _, e := fmt.Sscanf(m, "line %d:", &line); e == nil && line > 0 {
		m = strings.TrimSpace(m[strings.Index(m, ":")+1:])
	}
	return &Error{File: name, Line: line, Msg: m}
}

func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// checkKeys reports the first key of n (a node decoding into t) that no
// field of t takes, with its line and the keys that are known.
func checkKeys(n *yaml.Node, t reflect.Type, path, file string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case n.Kind == yaml.AliasNode:
		return checkKeys(n.Alias, t, path, file)
	case t.Kind() == reflect.Struct && t != reflect.TypeFor[time.Duration]():
		if n.Kind != yaml.MappingNode {
			if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
				return nil
			}
			return &Error{File: file, Line: n.Line, Msg: fmt.Sprintf("%s: expected a mapping of keys, found %s", orTop(path), describe(n))}
		}
		fields := map[string]reflect.Type{}
		var known []string
		for i := range t.NumField() {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || tag == "" || tag == "-" {
				continue
			}
			fields[tag] = f.Type
			known = append(known, tag)
		}
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				return &Error{File: file, Line: k.Line, Msg: fmt.Sprintf("%s: unknown key %q (known keys: %s)", orTop(path), k.Value, strings.Join(known, ", "))}
			}
			if first, dup := seen[k.Value]; dup {
				return &Error{File: file, Line: k.Line, Msg: fmt.Sprintf("%s: key %q given twice (first on line %d)", orTop(path), k.Value, first)}
			}
			seen[k.Value] = k.Line
			if err := checkKeys(v, ft, join(path, k.Value), file); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
				return nil
			}
			return &Error{File: file, Line: n.Line, Msg: fmt.Sprintf("%s: expected a list (lines starting with \"- \"), found %s", orTop(path), describe(n))}
		}
		for i, c := range n.Content {
			if err := checkKeys(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), file); err != nil {
				return err
			}
		}
	}
	return nil
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "top level"
	}
	return path
}

// Name is where the file came from ("" for a file built from flags).
func (f *File) Name() string { return f.name }

// Validate applies the defaults and checks every rule, returning all the
// problems found at once, each naming the provider and its line.
func (f *File) Validate() error {
	var errs []error
	fail := func(line int, format string, a ...any) {
		errs = append(errs, &Error{File: f.name, Line: line, Msg: fmt.Sprintf(format, a...)})
	}
	switch f.Routing {
	case "":
		f.Routing = Ordered
	case Ordered, Weighted:
	default:
		fail(0, "routing %q: use ordered or weighted", f.Routing)
	}
	if len(f.Providers) == 0 {
		fail(0, "no providers: list at least one under `providers:`")
	}
	names := map[string]int{}
	anyWeight := false
	for i := range f.Providers {
		p := &f.Providers[i]
		where := fmt.Sprintf("providers[%d]", i)
		if p.Name != "" {
			where = fmt.Sprintf("provider %q", p.Name)
		}
		bad := func(format string, a ...any) { fail(p.line, where+": "+format, a...) }
		switch {
		case p.Name == "":
			bad("name is required")
		case strings.TrimSpace(p.Name) != p.Name || strings.ContainsAny(p.Name, ",\n\t") || len(p.Name) > 64:
			bad("name: use at most 64 characters without commas, tabs or surrounding spaces")
		default:
			if j, dup := names[p.Name]; dup {
				bad("name is also used by providers[%d]; names must be unique", j)
			}
			names[p.Name] = i
		}
		if p.Kind == "" {
			bad("kind is required: %s", kindList())
		} else if _, err := ParseKind(string(p.Kind)); err != nil {
			bad("kind %v", err)
		}
		if p.Model == "" {
			p.Model = DefaultModel(p.Kind)
		}
		for _, r := range kindRules(*p) {
			bad("%s", r.message(p.Kind, fileNames))
		}
		if p.BaseURL != "" && !strings.HasPrefix(p.BaseURL, "http://") && !strings.HasPrefix(p.BaseURL, "https://") {
			bad("base_url %q: must start with http:// or https://", p.BaseURL)
		}
		if p.APIKeyParam != "" {
			switch {
			case !TakesKey(p.Kind):
				bad("api_key_param is only used by %s (bedrock signs with IAM credentials, sim needs no key)", keyKinds())
			case p.APIKeyEnv != "":
				bad("api_key_env and api_key_param are both set: give one (api_key_param on AWS, api_key_env elsewhere)")
			case !ssmName.MatchString(p.APIKeyParam):
				bad("api_key_param %q: want an SSM parameter name such as /batchgen/openai-key", p.APIKeyParam)
			}
		}
		if p.APIKeyEnv == "" && p.APIKeyParam == "" {
			p.APIKeyEnv = KeyEnv(p.Kind)
		}
		if p.APIKeyEnv != "" && !TakesKey(p.Kind) {
			bad("api_key_env is only used by %s (bedrock signs with IAM credentials, sim needs no key)", keyKinds())
		}
		if p.Kind == KindAnthropic && strings.HasSuffix(strings.TrimRight(p.BaseURL, "/"), "/v1") {
			bad("base_url %q: anthropic takes the API root without /v1 (its SDK adds /v1/messages)", p.BaseURL)
		}
		batch := p.BatchBucket != "" || p.BatchPrefix != "" || p.BatchRoleARN != ""
		switch {
		case batch && p.Kind != KindBedrock:
			bad("batch_bucket, batch_prefix and batch_role_arn are only used by bedrock (openai and anthropic sell their batch APIs with the key)")
		case batch && (p.BatchBucket == "" || p.BatchRoleARN == ""):
			bad("batch_bucket and batch_role_arn go together: the bucket of the batch jobs' files and the ARN of the service role Bedrock assumes to read and write them")
		case batch && p.BatchPrefix == "":
			p.BatchPrefix = "provider-batches/"
		}
		if (p.Latency != 0 || p.Jitter != 0) && p.Kind != KindSim {
			bad("latency and jitter are only used by sim")
		}
		if p.Latency < 0 || p.Jitter < 0 {
			bad("latency and jitter must not be negative")
		}
		if p.RPM < 0 {
			bad("rpm %d: must be 0 (unlimited) or more", p.RPM)
		}
		if p.TPM < 0 {
			bad("tpm %d: must be 0 (unlimited) or more", p.TPM)
		}
		switch {
		case p.Concurrency == 0:
			p.Concurrency = DefaultConcurrency
		case p.Concurrency < 0 || p.Concurrency > 10_000:
			bad("concurrency %d: must be between 1 and 10000", p.Concurrency)
		}
		switch {
		case p.Timeout == 0:
			p.Timeout = DefaultTimeout
		case p.Timeout < 0:
			bad("timeout %v: must be positive", p.Timeout)
		}
		if p.Weight == nil {
			w := DefaultWeight
			p.Weight = &w
		} else if *p.Weight < 0 {
			bad("weight %d: must be 0 (standby) or more", *p.Weight)
		}
		if *p.Weight > 0 {
			anyWeight = true
		}
		if p.Price.InputPerMTok < 0 || p.Price.OutputPerMTok < 0 || p.Price.CachedInputPerMTok < 0 {
			bad("price: amounts must not be negative")
		}
	}
	if f.Routing == Weighted && len(f.Providers) > 0 && !anyWeight {
		fail(0, "routing weighted: every weight is 0; give at least one provider a positive weight")
	}
	return errors.Join(errs...)
}

// Line is the 1-based line where p's entry starts in its file; 0 for an
// entry not read from a file.
func (p Provider) Line() int { return p.line }

// Names lists the providers' names in file order.
func (f *File) Names() []string {
	var names []string
	for _, p := range f.Providers {
		names = append(names, p.Name)
	}
	return names
}

// Lookup returns the provider called name.
func (f *File) Lookup(name string) (Provider, bool) {
	i := slices.IndexFunc(f.Providers, func(p Provider) bool { return p.Name == name })
	if i < 0 {
		return Provider{}, false
	}
	return f.Providers[i], true
}
