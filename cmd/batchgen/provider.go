package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/batchgen/batchgen/internal/providerfile"
)

// providerOptions are the model provider flags shared by the commands that
// call a model.
type providerOptions struct {
	// file is --providers: several providers, each with its own quota,
	// concurrency and timeout, instead of the single-provider flags.
	file string
	fs   *pflag.FlagSet
	name string
	// kind is name as a provider kind, once validate has read it.
	kind        providerfile.Kind
	baseURL     string
	model       string
	region      string
	temperature float64
	maxTokens   int
	simLatency  time.Duration
	simJitter   time.Duration
}

func (p *providerOptions) register(fs *pflag.FlagSet) {
	p.fs = fs
	fs.StringVar(&p.file, "providers", "", "providers file (YAML): several providers, each with its own rpm, tpm, concurrency and timeout, routed in order or by weight, with failover; replaces --provider, --base-url, --model, --region, --rpm, --tpm, --concurrency, --call-timeout")
	fs.StringVar(&p.name, "provider", "sim", "model provider: sim (in-process simulator, no key), openai (any OpenAI-compatible server, key in $OPENAI_API_KEY), anthropic (the Messages API, key in $ANTHROPIC_API_KEY) or bedrock (Amazon Bedrock Converse, AWS credentials from the default chain)")
	fs.StringVar(&p.baseURL, "base-url", "", "API root: openai's ends in /v1 (http://127.0.0.1:8089/v1; default $OPENAI_BASE_URL, else OpenAI's), anthropic's does not (http://127.0.0.1:8089; default $ANTHROPIC_BASE_URL, else Anthropic's); bedrock: an endpoint override")
	fs.StringVar(&p.model, "model", "", "model name; default sim-1 for sim, gpt-4o-mini for openai, claude-haiku-4-5 for anthropic; bedrock: a model id, inference profile id or ARN (required)")
	fs.StringVar(&p.region, "region", "", "bedrock: AWS region of the endpoint; default the AWS configuration's (AWS_REGION)")
	p.temperature = math.NaN()
	fs.Var(optionalFloat{&p.temperature}, "temperature", "sampling temperature, 0 to 2; default the provider's")
	fs.IntVar(&p.maxTokens, "max-tokens", 0, "completion token cap; 0 for the provider's default")
	fs.DurationVar(&p.simLatency, "sim-latency", 300*time.Millisecond, "simulated call latency (provider sim)")
	fs.DurationVar(&p.simJitter, "sim-jitter", 50*time.Millisecond, "simulated latency jitter (provider sim)")
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

func (p *providerOptions) validate() error {
	if p.file != "" {
		for _, name := range singleFlags {
			if p.fs != nil && p.fs.Changed(name) {
				return fmt.Errorf("--%s and --providers are both set: give each provider's settings in the providers file", name)
			}
		}
	}
	if p.file != "" {
		return p.validateSettings()
	}
	kind, err := providerfile.ParseKind(p.name)
	if err != nil {
		return fmt.Errorf("--provider %w", err)
	}
	p.kind = kind
	if env := providerfile.BaseURLEnv(kind); p.baseURL == "" && env != "" {
		// As the vendor's SDKs and tools read it.
		p.baseURL = os.Getenv(env)
	}
	if env := providerfile.KeyEnv(kind); env != "" && p.baseURL == "" && os.Getenv(env) == "" {
		return fmt.Errorf("--provider %s needs %s in the environment (or --base-url for a local server)", kind, env)
	}
	return p.validateSettings()
}

// validateSettings checks the model settings every provider takes.
func (p *providerOptions) validateSettings() error {
	if !math.IsNaN(p.temperature) && (p.temperature < 0 || p.temperature > 2) {
		return fmt.Errorf("--temperature %v: must be between 0 and 2", p.temperature)
	}
	if p.maxTokens < 0 {
		return fmt.Errorf("--max-tokens %d: must be 0 or more", p.maxTokens)
	}
	if p.simLatency < 0 || p.simJitter < 0 {
		return errors.New("--sim-latency and --sim-jitter must not be negative")
	}
	return nil
}

func (p *providerOptions) temperaturePtr() *float64 {
	if math.IsNaN(p.temperature) {
		return nil
	}
	t := p.temperature
	return &t
}

// providers returns the providers file of o: --providers, or the one
// entry of the single-provider flags (providerfile.Single, as the AWS
// stack's model parameters build theirs), so both take one code path.
func (o *runOptions) providers() (*providerfile.File, error) {
	p := &o.provider
	if p.file != "" {
		return providerfile.Load(p.file)
	}
	f, err := providerfile.Single{
		Kind: p.kind, Model: p.model, BaseURL: p.baseURL, Region: p.region,
		RPM: o.rpm, TPM: o.tpm, Concurrency: o.concurrency, Timeout: o.retry.callTimeout,
		Latency: p.simLatency, Jitter: p.simJitter,
		Names: providerfile.SettingNames{Kind: "--provider", Model: "--model", BaseURL: "--base-url", Region: "--region"},
	}.File()
	if err != nil {
		return nil, err
	}
	return f, nil
}
