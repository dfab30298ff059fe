// Package anthropicllm is the llm.Provider for Anthropic's Messages API,
// through the official anthropic-sdk-go.
//
// As with the other adapters, the SDK's own retries are off: the pipeline
// owns retries, because it must account for them against the quota and the
// row's attempt budget. What this adapter adds is the translation of each
// failure into an *llm.Error of the classes every provider shares, and of
// Anthropic's rate-limit headers (anthropic-ratelimit-*, retry-after) into
// llm.RateLimits for the quota learner.
//
// Answers of declared columns are asked for with structured outputs
// (output_config.format of type json_schema). A model that refuses them is
// learnt once and asked in words from then on, the schema in the system
// prompt; the pipeline checks every answer either way.
package anthropicllm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/batchgen/batchgen/internal/llm"
)

// DefaultBaseURL is Anthropic's API root. The SDK adds /v1/messages.
const DefaultBaseURL = "https://api.anthropic.com"

// DefaultMaxTokens is the completion cap sent when a request sets none:
// the Messages API requires one. A call is billed for what it used, not
// for the cap.
const DefaultMaxTokens = 4096

// Config configures a Provider.
type Config struct {
	// Conn reaches the API. Its BaseURL is the API root without /v1, as
	// the SDK takes it (defaults to DefaultBaseURL); its Clock also turns
	// Anthropic's rate-limit reset times into durations.
	llm.Conn
}

// Provider calls the Messages API. It is safe for concurrent use.
type Provider struct {
	cfg      Config
	messages anthropic.MessageService
	// batches serves provider batches (batch.go).
	batches anthropic.MessageBatchService
	// inWords is set once the model refused structured outputs.
	inWords atomic.Bool
}

// New returns a Provider for cfg, or an error naming what is wrong with its
// BaseURL: not an absolute http(s) URL, or an API root that ends in /v1.
func New(cfg Config) (*Provider, error) {
	var err error
	if cfg.Conn, err = cfg.Open("anthropic", DefaultBaseURL); err != nil {
		return nil, err
	}
	if u, _ := url.Parse(cfg.BaseURL); strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/v1") {
		// The SDK adds /v1/messages itself: a root ending in /v1 would
		// call /v1/v1/messages and get 404s for every row.
		return nil, fmt.Errorf("anthropic base URL %q: give the API root without /v1 (the SDK adds /v1/messages)", llm.RedactURL(cfg.BaseURL))
	}
	// NewMessageService rather than anthropic.NewClient: the client reads
	// ANTHROPIC_* environment variables, and only main reads the
	// environment here.
	opts := []option.RequestOption{option.WithBaseURL(cfg.BaseURL), option.WithHTTPClient(cfg.HTTPClient), option.WithMaxRetries(0)}
	if key := cfg.APIKey; key != "" {
		// No key is a local server that wants none: send no header.
		opts = append(opts, option.WithAPIKey(key))
	}
	messages := anthropic.NewMessageService(opts...)
	return &Provider{cfg: cfg, messages: messages, batches: messages.Batches}, nil
}

// Generate sends req as one message (a system prompt, the user's prompt,
// and a re-ask's earlier exchanges) and returns the answer's text. Failures
// are *llm.Error, except a cancelled ctx, which is returned wrapped as is.
func (p *Provider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	params, inWords, err := p.params(req)
	if err != nil {
		return llm.Response{}, err
	}
	sch := req.ResponseSchema()

	callCtx, cancel := p.cfg.CallContext(ctx)
	defer cancel()
	timeout := p.cfg.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	var httpResp *http.Response
	// A request timeout of our own: without one the SDK refuses a large
	// max_tokens outright ("streaming is required").
	msg, err := p.messages.New(callCtx, params, option.WithResponseInto(&httpResp), option.WithRequestTimeout(timeout))
	if err != nil {
		e := p.classify(ctx, callCtx, err, httpResp)
		if sch != nil && !inWords && llm.RefusesFeature(e, "output_config", "structured output", "output_format") {
			// A model without structured outputs: learn it once, say so,
			// and ask in words from now on. A refused request is not
			// billed, so asking again at once costs nothing.
			if !p.inWords.Swap(true) {
				p.cfg.Logger.Warn("the model refused structured outputs (output_config.format); asking for JSON in the system prompt instead and checking every answer",
					"model", params.Model, "error", e.Error())
			}
			return p.Generate(ctx, req)
		}
		return llm.Response{}, e
	}
	out, err := p.response(msg)
	if err == nil && httpResp != nil {
		out.RateLimits = llm.ParseAnthropicRateLimits(httpResp.Header, p.cfg.Clock.Now())
	}
	return out, err
}

// params is the message req asks for, the same online and in a batch;
// inWords reports that a shaped answer is asked for in the system prompt
// (the model refused structured outputs before).
func (p *Provider) params(req llm.Request) (params anthropic.MessageNewParams, inWords bool, err error) {
	model, err := p.cfg.ModelFor(req, "Anthropic")
	if err != nil {
		return params, false, err
	}
	maxTokens := req.MaxTokens
	if maxTokens <= 0 {
		maxTokens = DefaultMaxTokens
	}
	params = anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: int64(maxTokens)}
	params.Messages = append(params.Messages, anthropic.NewUserMessage(anthropic.NewTextBlock(req.Prompt)))
	for _, c := range req.Corrections {
		params.Messages = append(params.Messages,
			anthropic.NewAssistantMessage(anthropic.NewTextBlock(c.Answer)),
			anthropic.NewUserMessage(anthropic.NewTextBlock(c.FollowUp)))
	}
	system := req.System
	sch := req.ResponseSchema()
	inWords = sch != nil && p.inWords.Load()
	switch {
	case inWords:
		system = strings.TrimSpace(req.SchemaInstructions() + "\n\n" + system)
	case sch != nil:
		var format map[string]any
		if err := json.Unmarshal(sch, &format); err != nil {
			return params, false, &llm.Error{Class: llm.ClassBadRequest, Message: fmt.Sprintf("answer schema: %v", err)}
		}
		params.OutputConfig = anthropic.OutputConfigParam{Format: anthropic.JSONOutputFormatParam{Schema: format}}
	}
	if system != "" {
		params.System = []anthropic.TextBlockParam{{Text: system}}
	}
	// req.Temperature and req.TopP are not sent: the Messages API has
	// deprecated sampling settings, and this SDK no longer carries them.
	return params, inWords, nil
}

// JSONMode reports whether the model refused structured outputs and
// answers with columns are asked for in the system prompt, for the run's
// summary (named as the OpenAI adapter's, whose fallback is JSON mode).
func (p *Provider) JSONMode() bool { return p.inWords.Load() }

// response turns a message into the answer: its text blocks, in order.
func (p *Provider) response(msg *anthropic.Message) (llm.Response, error) {
	if msg == nil {
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "empty answer"}
	}
	var text strings.Builder
	for _, block := range msg.Content {
		if block.Type == "text" {
			text.WriteString(block.Text)
		}
	}
	if msg.StopReason == anthropic.StopReasonRefusal {
		return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: http.StatusOK,
			Message: p.cfg.Clean("the model declined to answer (stop_reason refusal)")}
	}
	u := msg.Usage
	// Anthropic's input_tokens leaves out what was read from or written to
	// its prompt cache; llm.Usage counts every prompt token as input.
	return llm.Response{
		Text: text.String(),
		Usage: llm.Usage{
			InputTokens:       int(u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens),
			OutputTokens:      int(u.OutputTokens),
			CachedInputTokens: int(u.CacheReadInputTokens),
		},
	}, nil
}

// classify turns a failed call into an *llm.Error. ctx is the caller's,
// callCtx the one with this call's timeout.
func (p *Provider) classify(ctx, callCtx context.Context, err error, httpResp *http.Response) error {
	if apiErr := (*anthropic.Error)(nil); errors.As(err, &apiErr) {
		return p.fromStatus(apiErr.StatusCode, string(apiErr.Type()), apiErr.Message, llm.ResponseHeader(apiErr.Response))
	}
	return p.cfg.Failure(ctx, callCtx, err, httpResp, "anthropic message", func(status int, h http.Header) *llm.Error {
		return p.fromStatus(status, "", "", h)
	})
}

// fromStatus classifies an error answer from its status and Anthropic's
// error type (its body's error.type).
func (p *Provider) fromStatus(status int, typ, message string, h http.Header) *llm.Error {
	e := &llm.Error{StatusCode: status, Message: p.cfg.ErrorMessage(status, typ, message), RateLimits: llm.ParseAnthropicRateLimits(h, p.cfg.Clock.Now())}
	e.Class = llm.ClassOfStatus(status)
	lower := strings.ToLower(message)
	// What Anthropic's types and words say beyond the status.
	switch {
	case typ == "billing_error" || status == http.StatusPaymentRequired || strings.Contains(lower, "credit balance"):
		e.Class = llm.ClassQuotaExhausted
	case typ == "overloaded_error" || typ == "api_error" || typ == "timeout_error":
		e.Class = llm.ClassServer
	case e.Class == llm.ClassBadRequest && strings.Contains(lower, "prompt is too long"):
		e.Class = llm.ClassPromptTooLong
	case e.Class == llm.ClassBadRequest && strings.Contains(lower, "content filtering"):
		e.Class = llm.ClassContentFilter
	}
	if e.Class == llm.ClassRateLimited || e.Class == llm.ClassServer {
		e.RetryAfter = llm.RetryAfter(h, p.cfg.Clock.Now())
		if e.RetryAfter == 0 {
			e.RetryAfter = e.RateLimits.SpentReset()
		}
	}
	return e
}
