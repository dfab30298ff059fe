package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/quota"
)

// providerOptions are the model provider flags shared by the commands that
// call a model.
type providerOptions struct {
	name        string
	baseURL     string
	model       string
	temperature float64
	maxTokens   int
	simLatency  time.Duration
	simJitter   time.Duration
}

func (p *providerOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&p.name, "provider", "sim", "model provider: sim (in-process simulator, no key) or openai (any OpenAI-compatible server)")
	fs.StringVar(&p.baseURL, "base-url", "", "OpenAI-compatible API base URL, e.g. http://127.0.0.1:8089/v1; default $OPENAI_BASE_URL, else OpenAI's")
	fs.StringVar(&p.model, "model", "", "model name; default sim-1 for sim, gpt-4o-mini for openai")
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

func (p *providerOptions) validate() error {
	switch p.name {
	case "sim", "openai":
	default:
		return fmt.Errorf("--provider %q: use sim or openai", p.name)
	}
	if p.baseURL == "" {
		// As the OpenAI SDKs and tools read it.
		p.baseURL = os.Getenv("OPENAI_BASE_URL")
	}
	if p.name == "openai" && p.baseURL == "" && os.Getenv("OPENAI_API_KEY") == "" {
		return errors.New("--provider openai needs OPENAI_API_KEY in the environment (or --base-url for a local OpenAI-compatible server)")
	}
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

func (p *providerOptions) modelName() string {
	if p.model != "" {
		return p.model
	}
	if p.name == "openai" {
		return "gpt-4o-mini"
	}
	return "sim-1"
}

func (p *providerOptions) temperaturePtr() *float64 {
	if math.IsNaN(p.temperature) {
		return nil
	}
	t := p.temperature
	return &t
}

func (p *providerOptions) build(clk clock.Clock) (llm.Provider, error) {
	switch p.name {
	case "openai":
		key := os.Getenv("OPENAI_API_KEY")
		if key == "" {
			key = "unused" // local OpenAI-compatible servers ignore it; the SDK wants one
		}
		return openaillm.New(openaillm.Config{BaseURL: p.baseURL, APIKey: key, Model: p.modelName()})
	default:
		return sim.New(sim.Config{Latency: p.simLatency, Jitter: p.simJitter, Clock: clk}), nil
	}
}

// countingProvider counts calls and their outcomes for the run summary.
type countingProvider struct {
	llm.Provider
	stats *runStats
}

// Generate calls the wrapped provider and counts the call and its outcome.
func (c countingProvider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	resp, err := c.Provider.Generate(ctx, req)
	c.stats.countCall(err)
	return resp, err
}

func newLimiter(rpm int) *quota.Local {
	return quota.NewLocal(quota.LocalConfig{RPM: rpm})
}
