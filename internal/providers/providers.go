// Package providers builds the llm.Provider of a providers-file entry: the
// one place that maps an entry's kind to its adapter (simulator, OpenAI or
// an OpenAI-compatible server, Anthropic, Bedrock). It is kept apart from package
// providerfile so that code which only reads the file (prices, labels)
// links no model SDK.
package providers

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	anthropicllm "github.com/batchgen/batchgen/internal/llm/anthropic"
	bedrockllm "github.com/batchgen/batchgen/internal/llm/bedrock"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/providerfile"
)

// Builder turns entries into providers. The zero value builds sim, openai,
// anthropic and mock entries with keys from the environment and rejects
// bedrock.
type Builder struct {
	// Clock drives the simulator. Defaults to clock.Real.
	Clock clock.Clock
	// Key returns the API key of an openai, anthropic or mock provider (""
	// for none).
	// Defaults to reading the environment variable p.APIKeyEnv (and
	// refusing p.APIKeyParam, which the Lambda wiring reads from SSM).
	Key func(p providerfile.Provider) (string, error)
	// Bedrock builds a bedrock provider (its AWS configuration is the
	// runtime's); nil rejects bedrock entries.
	Bedrock func(p providerfile.Provider) (llm.Provider, error)
	// BedrockBatch builds the batch inference side of a bedrock provider
	// with a batch bucket (providerfile.Provider.BatchBucket); nil calls
	// such a provider's economy tasks online.
	BedrockBatch func(p providerfile.Provider) (llm.BatchProvider, error)
	// Logger hears what an adapter learns of its server once (an
	// OpenAI-compatible server that refuses structured outputs). Defaults
	// to discarding.
	Logger *slog.Logger
}

// Build returns the provider of entry p (the package's Build calls it for
// each entry of a file).
func (b Builder) Build(p providerfile.Provider) (llm.Provider, error) {
	if b.Logger == nil {
		b.Logger = slog.New(slog.DiscardHandler)
	}
	switch p.Kind {
	case providerfile.KindSim:
		clk := b.Clock
		if clk == nil {
			clk = clock.Real{}
		}
		return sim.New(sim.Config{Latency: p.Latency, Jitter: p.Jitter, Clock: clk}), nil
	case providerfile.KindOpenAI, providerfile.KindMock:
		key, err := b.key(p)
		if err != nil {
			return nil, err
		}
		if p.Kind == providerfile.KindOpenAI && p.BaseURL == "" && key == "" {
			return nil, fmt.Errorf("needs an API key in $%s (or a base_url for a local OpenAI-compatible server)", p.APIKeyEnv)
		}
		return openaillm.New(openaillm.Config{Conn: b.conn(p, key)})
	case providerfile.KindAnthropic:
		key, err := b.key(p)
		if err != nil {
			return nil, err
		}
		if p.BaseURL == "" && key == "" {
			return nil, fmt.Errorf("needs an API key in $%s (or a base_url for a local server, such as batchgen mock-llm)", p.APIKeyEnv)
		}
		return anthropicllm.New(anthropicllm.Config{Conn: b.conn(p, key)})
	case providerfile.KindBedrock:
		if b.Bedrock == nil {
			return nil, fmt.Errorf("kind bedrock is not available in this build")
		}
		return b.Bedrock(p)
	}
	if _, err := providerfile.ParseKind(string(p.Kind)); err != nil {
		return nil, fmt.Errorf("kind %w", err)
	}
	return nil, fmt.Errorf("kind %q has no adapter in this build", p.Kind)
}

// conn is how an HTTP adapter reaches p's API with key.
func (b Builder) conn(p providerfile.Provider, key string) llm.Conn {
	return llm.Conn{BaseURL: p.BaseURL, APIKey: key, Model: p.Model, Logger: b.Logger.With("provider", p.Name)}
}

// Batch returns the batch API of entry p when it is not its provider's
// own (Bedrock's batch inference, through its control plane and bucket),
// or nil.
func (b Builder) Batch(p providerfile.Provider) (llm.BatchProvider, error) {
	if p.Kind != providerfile.KindBedrock || p.BatchBucket == "" || b.BedrockBatch == nil {
		return nil, nil
	}
	if err := bedrockllm.BatchFormat(p.Model); err != nil {
		if b.Logger != nil {
			b.Logger.Warn("the provider's economy and auto tasks are called online", "provider", p.Name, "why", err.Error())
		}
		return nil, nil
	}
	return b.BedrockBatch(p)
}

func (b Builder) key(p providerfile.Provider) (string, error) {
	if b.Key != nil {
		return b.Key(p)
	}
	if p.APIKeyParam != "" {
		return "", fmt.Errorf("api_key_param %s is an SSM parameter, read by the generator Lambda; here name the key's environment variable with api_key_env", p.APIKeyParam)
	}
	if p.APIKeyEnv == "" {
		return "", nil
	}
	return strings.TrimSpace(os.Getenv(p.APIKeyEnv)), nil
}
