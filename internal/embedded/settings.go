package embedded

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/store"
)

// Settings are what the commands of the embedded runtime (run, quote,
// retry and serve) ask of a task and of the engine that runs it. Each is
// a flag, registered here once (RegisterSpec, RegisterEngine) and checked
// here once (CheckSpec, Check), so every error names the flag the user
// gave; the commands only add their own flags and print.
type Settings struct {
	// The task's spec: Prompt (or PromptFile), System, its output Columns
	// (or SchemaFile; Cols is what CheckSpec read from either), BatchSize
	// and RowsPerCall; MaxRows bounds the input.
	Prompt, PromptFile, System      string
	Columns, SchemaFile             string
	Cols                            schema.Columns
	BatchSize, RowsPerCall, MaxRows int

	// Concurrency, RPM and TPM are the single provider's quota (a
	// providers file gives each provider its own).
	Concurrency, RPM, TPM int
	// NoCache and CacheMode say whether answers are reused; CacheTTL for
	// how long (pipeline.ParseCacheTTL); CacheScope is serve's
	// --cache-scope (run's one principal shares).
	NoCache             bool
	CacheMode, CacheTTL string
	CacheScope          pipeline.CacheScope
	// Prices is the price table file.
	Prices string
	// MaxCost is --max-cost: NaN when not given.
	MaxCost float64
	// Mode and Deadline are --mode and --deadline ("" when not given);
	// ParsedMode and ParsedDeadline what Check read them as.
	Mode, Deadline string
	ParsedMode     store.Mode
	ParsedDeadline time.Time
	// BatchPoll is how often a provider batch is asked for its state.
	BatchPoll time.Duration
	// Quiet prints no progress; ProgressInterval spaces its plain lines.
	Quiet            bool
	ProgressInterval time.Duration
	LogLevel         string
	SweepAfter       time.Duration
	Provider         ProviderSettings
	Retry            RetrySettings
}

// RetrySettings tune retries; mostly for tests and impatient operators.
type RetrySettings struct {
	CallsPerRound, Rounds int
	Delays                string
	CallTimeout, Lease    time.Duration
}

// ProviderSettings are the model provider flags: one provider (Name and
// the rest), or a providers file (File) that replaces them.
type ProviderSettings struct {
	File    string
	Name    string
	BaseURL string
	Model   string
	Region  string
	// Temperature is NaN when not given.
	Temperature           float64
	MaxTokens             int
	SimLatency, SimJitter time.Duration

	// kind is Name as a provider kind, once checked; fs tells which flags
	// were given.
	kind providerfile.Kind
	fs   *pflag.FlagSet
}

// RegisterSpec registers the flags of what a task runs and how its input
// is bounded: run's own, and serve's default for inputs that bring none.
func (s *Settings) RegisterSpec(fs *pflag.FlagSet) {
	fs.StringVar(&s.Prompt, "prompt", "", "prompt template with {{column}} placeholders")
	fs.StringVar(&s.PromptFile, "prompt-file", "", "file holding the prompt template")
	fs.StringVar(&s.System, "system", "", "system prompt")
	fs.StringVar(&s.Columns, "columns", "", "answer as typed output columns instead of one text: 'name:type, ...' with types "+schema.TypeNames()+"; a trailing ! makes a column required (category:enum(a|b)!, score:number, summary)")
	fs.StringVar(&s.SchemaFile, "schema", "", "JSON Schema file of an object whose properties, in order, are the output columns (descriptions are passed to the model); instead of --columns")
	fs.IntVar(&s.BatchSize, "batch-size", pipeline.DefaultBatchSize, "rows per batch")
	fs.IntVar(&s.RowsPerCall, "rows-per-call", 1, "rows answered by one model call (1 to 100): many short rows a request when the request quota, not the token quota, is the wall; each answer is matched to its row by id, and a row the call did not answer is asked alone")
	fs.IntVar(&s.MaxRows, "max-rows", 200_000, "reject inputs with more data rows than this")
}

// CheckSpec validates the flags RegisterSpec registers and reads
// --prompt-file into the prompt and --columns or --schema into Cols.
func (s *Settings) CheckSpec() error {
	if s.Prompt != "" && s.PromptFile != "" {
		return report.Rejectf("--prompt and --prompt-file are both set; use one")
	}
	if s.PromptFile != "" {
		b, err := os.ReadFile(s.PromptFile)
		if err != nil {
			return report.Rejectf("--prompt-file: %w", UnwrapPathError(err))
		}
		s.Prompt = strings.TrimRight(string(b), "\r\n")
		if strings.TrimSpace(s.Prompt) == "" {
			return report.Rejectf("--prompt-file %s is empty", s.PromptFile)
		}
	}
	if s.Columns != "" && s.SchemaFile != "" {
		return report.Rejectf("--columns and --schema are both set; use one")
	}
	if s.Columns != "" {
		cols, err := schema.ParseShort(s.Columns)
		if err != nil {
			return report.Rejectf("--columns: %w", err)
		}
		s.Cols = cols
	}
	if s.SchemaFile != "" {
		b, err := os.ReadFile(s.SchemaFile)
		if err != nil {
			return report.Rejectf("--schema: %w", UnwrapPathError(err))
		}
		cols, err := schema.ParseJSONSchema(b)
		if err != nil {
			return report.Rejectf("--schema %s: %w", s.SchemaFile, err)
		}
		s.Cols = cols
	}
	if s.BatchSize < 1 || s.BatchSize > 1000 {
		return report.Rejectf("--batch-size %d: must be between 1 and 1000", s.BatchSize)
	}
	if s.RowsPerCall < 1 || s.RowsPerCall > schema.MaxRowsPerCall {
		return report.Rejectf("--rows-per-call %d: must be between 1 and %d", s.RowsPerCall, schema.MaxRowsPerCall)
	}
	if s.MaxRows < 1 {
		return report.Rejectf("--max-rows %d: must be at least 1", s.MaxRows)
	}
	return nil
}

// TaskSpec is the task spec the settings ask for, on the first of
// providers.
func (s *Settings) TaskSpec(providers *providerfile.File) store.TaskSpec {
	var temperature *float64
	if t := s.Provider.Temperature; !math.IsNaN(t) {
		temperature = &t
	}
	rowsPerCall := s.RowsPerCall
	if rowsPerCall <= 1 {
		rowsPerCall = 0 // one row a call: a task asked as before keeps its id
	}
	return providers.Spec(store.TaskSpec{
		Prompt: s.Prompt, System: s.System, Temperature: temperature, MaxTokens: s.Provider.MaxTokens,
		BatchSize: s.BatchSize, Columns: s.Cols, RowsPerCall: rowsPerCall,
	})
}

// RegisterEngine registers the flags of everything that calls the model:
// run, quote, retry and serve.
func (s *Settings) RegisterEngine(fs *pflag.FlagSet) {
	fs.IntVar(&s.Concurrency, "concurrency", 8, "model calls in flight at once")
	fs.IntVar(&s.RPM, "rpm", 0, "provider quota in requests per minute across the job (0: learn it from the provider's rate-limit headers and 429s)")
	fs.IntVar(&s.TPM, "tpm", 0, "provider quota in tokens (prompt + completion) per minute across the job (0: learn it like --rpm)")
	fs.BoolVar(&s.NoCache, "no-cache", false, "call the model even for prompts answered before (same as --cache off)")
	fs.StringVar(&s.CacheMode, "cache", "auto", "reuse outputs cached for identical calls: auto (unless --temperature > 0), always, or off")
	fs.StringVar(&s.CacheTTL, "cache-ttl", "30d", "how long a cached output is reused: whole days (30d) or a duration (12h)")
	fs.StringVar(&s.Prices, "prices", "", "price table (YAML, models: {MODEL: {input_per_mtok, output_per_mtok, cached_input_per_mtok}}) overriding the built-in one, for the estimated cost")
	s.MaxCost = math.NaN()
	fs.Var(optionalFloat{&s.MaxCost}, "max-cost", "spending cap of the task in USD, at the price table's prices: no call starts that could pass it, and the rows left are marked not_started (retry with a higher --max-cost runs them); 0 removes a cap set before")
	fs.StringVar(&s.Mode, "mode", "", "how the rows are called: online (the default; under the quota, at the online price), economy (the provider's batch API: half the price, answers within hours) or auto (economy until --deadline leaves just the time the rest needs online); a task keeps its mode from run to run")
	fs.StringVar(&s.Deadline, "deadline", "", "with --mode auto: when the task must be done, a duration from now (6h) or an RFC 3339 time (2026-12-02T18:00:00Z)")
	fs.DurationVar(&s.BatchPoll, "batch-poll", 30*time.Second, "how often a provider batch is asked for its state (economy and auto modes)")
	fs.BoolVar(&s.Quiet, "quiet", false, "no progress output")
	fs.StringVar(&s.LogLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	fs.DurationVar(&s.ProgressInterval, "progress-interval", 5*time.Second, "interval of plain progress lines when stderr is not a terminal")
	fs.IntVar(&s.Retry.CallsPerRound, "calls-per-round", 3, "model calls per row per attempt of its batch")
	fs.IntVar(&s.Retry.Rounds, "rounds", 4, "attempts of a batch before rows still failing retryably are marked failed")
	fs.StringVar(&s.Retry.Delays, "retry-delays", "10s,60s,300s", "graded delays before a released batch is tried again")
	fs.DurationVar(&s.Retry.CallTimeout, "call-timeout", 60*time.Second, "timeout of one model call")
	fs.DurationVar(&s.Retry.Lease, "lease", 2*time.Minute, "batch claim lease, renewed while the batch runs")
	fs.DurationVar(&s.SweepAfter, "sweep-after", 5*time.Minute, "re-enqueue batches left unclaimed this long (lost messages, stuck workers)")
	s.Provider.register(fs)
}

// Checked is what Check read the engine's settings as.
type Checked struct {
	Providers   *providerfile.File
	Prices      *pricing.Table
	RetryDelays []time.Duration
	CacheTTL    time.Duration
	LogLevel    slog.Level
}

// Check validates the flags RegisterEngine registers and reads the files
// they name (providers, prices).
func (s *Settings) Check() (Checked, error) {
	var c Checked
	if s.Concurrency < 1 {
		return c, report.Rejectf("--concurrency %d: must be at least 1", s.Concurrency)
	}
	if s.RPM < 0 {
		return c, report.Rejectf("--rpm %d: must be 0 (learn the quota) or more", s.RPM)
	}
	if s.TPM < 0 {
		return c, report.Rejectf("--tpm %d: must be 0 (learn the quota) or more", s.TPM)
	}
	if !math.IsNaN(s.MaxCost) {
		if err := pipeline.CheckMaxCost("--max-cost", s.MaxCost); err != nil {
			return c, report.Rejectf("%w", err)
		}
	}
	if s.SweepAfter < time.Second {
		return c, report.Rejectf("--sweep-after %s: must be at least 1s", s.SweepAfter)
	}
	if s.BatchPoll < time.Second {
		return c, report.Rejectf("--batch-poll %s: must be at least 1s", s.BatchPoll)
	}
	if s.Mode != "" || s.Deadline != "" {
		m, deadline, err := pipeline.ParseModeDeadline(s.Mode, s.Deadline, time.Now())
		if err != nil {
			return c, report.Rejectf("--%w", err)
		}
		s.ParsedMode, s.ParsedDeadline = m, deadline
	}
	r := s.Retry
	if r.CallsPerRound < 1 || r.Rounds < 1 {
		return c, report.Rejectf("--calls-per-round and --rounds must be at least 1")
	}
	if r.Lease <= 0 || r.CallTimeout <= 0 {
		return c, report.Rejectf("--lease %s and --call-timeout %s: both must be positive", r.Lease, r.CallTimeout)
	}
	var err error
	if c.RetryDelays, err = pipeline.ParseRetryDelays(r.Delays); err != nil {
		return c, report.Rejectf("--retry-delays: %w", err)
	}
	if _, err := pipeline.ParseCacheMode(s.CacheMode); err != nil {
		return c, report.Rejectf("--cache: %w", err)
	}
	if s.NoCache && s.CacheMode != string(pipeline.CacheAuto) && s.CacheMode != string(pipeline.CacheOff) {
		return c, report.Rejectf("--no-cache contradicts --cache %s; give one", s.CacheMode)
	}
	if c.CacheTTL, err = pipeline.ParseCacheTTL(s.CacheTTL); err != nil {
		return c, report.Rejectf("--cache-ttl: %w", err)
	}
	if c.Providers, err = s.providers(); err != nil {
		return c, report.Rejectf("%w", err)
	}
	if err := c.LogLevel.UnmarshalText([]byte(s.LogLevel)); err != nil {
		return c, report.Rejectf("--log-level %q: use debug, info, warn or error", s.LogLevel)
	}
	prices, err := pricing.Load(s.Prices)
	if err != nil {
		return c, report.Rejectf("--prices: %w", err)
	}
	c.Prices = prices.FromProviders(c.Providers)
	return c, nil
}

// Logger is a text logger at the checked level.
func (c Checked) Logger(w io.Writer) *slog.Logger {
	level := new(slog.LevelVar)
	level.Set(c.LogLevel)
	return logging.NewText(w, level)
}

// Terms are cur with what --max-cost, --mode and --deadline ask for.
func (s *Settings) Terms(cur store.Terms) store.Terms {
	if !math.IsNaN(s.MaxCost) {
		cur.MaxCost = s.MaxCost
	}
	if s.Mode != "" || s.Deadline != "" {
		cur.Mode, cur.Deadline = s.ParsedMode, s.ParsedDeadline
	}
	return cur
}

func (p *ProviderSettings) register(fs *pflag.FlagSet) {
	p.fs = fs
	fs.StringVar(&p.File, "providers", "", "providers file (YAML): several providers, each with its own rpm, tpm, concurrency and timeout, routed in order or by weight, with failover; replaces --provider, --base-url, --model, --region, --rpm, --tpm, --concurrency, --call-timeout")
	fs.StringVar(&p.Name, "provider", "sim", "model provider: sim (in-process simulator, no key), openai (any OpenAI-compatible server, key in $OPENAI_API_KEY), anthropic (the Messages API, key in $ANTHROPIC_API_KEY) or bedrock (Amazon Bedrock Converse, AWS credentials from the default chain)")
	fs.StringVar(&p.BaseURL, "base-url", "", "API root: openai's ends in /v1 (http://127.0.0.1:8089/v1; default $OPENAI_BASE_URL, else OpenAI's), anthropic's does not (http://127.0.0.1:8089; default $ANTHROPIC_BASE_URL, else Anthropic's); bedrock: an endpoint override")
	fs.StringVar(&p.Model, "model", "", "model name; default sim-1 for sim, gpt-4o-mini for openai, claude-haiku-4-5 for anthropic; bedrock: a model id, inference profile id or ARN (required)")
	fs.StringVar(&p.Region, "region", "", "bedrock: AWS region of the endpoint; default the AWS configuration's (AWS_REGION)")
	p.Temperature = math.NaN()
	fs.Var(optionalFloat{&p.Temperature}, "temperature", "sampling temperature, 0 to 2; default the provider's")
	fs.IntVar(&p.MaxTokens, "max-tokens", 0, "completion token cap; 0 for the provider's default")
	fs.DurationVar(&p.SimLatency, "sim-latency", 300*time.Millisecond, "simulated call latency (provider sim)")
	fs.DurationVar(&p.SimJitter, "sim-jitter", 50*time.Millisecond, "simulated latency jitter (provider sim)")
}

// optionalFloat is a float flag whose unset value is NaN, shown in the help
// as no default at all.
type optionalFloat struct{ p *float64 }

func (f optionalFloat) String() string {
	if f.p == nil || math.IsNaN(*f.p) {
		return ""
	}
	return strconv.FormatFloat(*f.p, 'g', -1, 64)
}

func (f optionalFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) {
		return fmt.Errorf("%q is not a number", s)
	}
	*f.p = v
	return nil
}

func (f optionalFloat) Type() string { return "float" }

// singleFlags are the flags a providers file replaces.
var singleFlags = []string{"provider", "base-url", "model", "region", "rpm", "tpm", "concurrency", "call-timeout", "sim-latency", "sim-jitter"}

// providers checks the provider flags and returns the providers file of
// s: --providers, or the one entry of the single-provider flags
// (providerfile.Single, as the AWS stack's model parameters build theirs),
// so both take one code path.
func (s *Settings) providers() (*providerfile.File, error) {
	p := &s.Provider
	if !math.IsNaN(p.Temperature) && (p.Temperature < 0 || p.Temperature > 2) {
		return nil, fmt.Errorf("--temperature %v: must be between 0 and 2", p.Temperature)
	}
	if p.MaxTokens < 0 {
		return nil, fmt.Errorf("--max-tokens %d: must be 0 or more", p.MaxTokens)
	}
	if p.SimLatency < 0 || p.SimJitter < 0 {
		return nil, errors.New("--sim-latency and --sim-jitter must not be negative")
	}
	if p.File != "" {
		for _, name := range singleFlags {
			if p.fs != nil && p.fs.Changed(name) {
				return nil, fmt.Errorf("--%s and --providers are both set: give each provider's settings in the providers file", name)
			}
		}
		return providerfile.Load(p.File)
	}
	kind, err := providerfile.ParseKind(p.Name)
	if err != nil {
		return nil, fmt.Errorf("--provider %w", err)
	}
	p.kind = kind
	if env := providerfile.BaseURLEnv(kind); p.BaseURL == "" && env != "" {
		// As the vendor's SDKs and tools read it.
		p.BaseURL = os.Getenv(env)
	}
	if env := providerfile.KeyEnv(kind); env != "" && p.BaseURL == "" && os.Getenv(env) == "" {
		return nil, fmt.Errorf("--provider %s needs %s in the environment (or --base-url for a local server)", kind, env)
	}
	return providerfile.Single{
		Kind: p.kind, Model: p.Model, BaseURL: p.BaseURL, Region: p.Region,
		RPM: s.RPM, TPM: s.TPM, Concurrency: s.Concurrency, Timeout: s.Retry.CallTimeout,
		Latency: p.SimLatency, Jitter: p.SimJitter,
		Names: providerfile.SettingNames{Kind: "--provider", Model: "--model", BaseURL: "--base-url", Region: "--region"},
	}.File()
}
