// Package openaillm is the llm.Provider for OpenAI and every server that
// speaks its chat completions API (Azure OpenAI's v1 endpoint, vLLM, Ollama,
// LiteLLM, the batchgen mock), through the official openai-go SDK.
//
// The SDK's own retries are off: the pipeline owns retries, because it must
// account for them against the quota and the row's attempt budget. What this
// adapter adds is the translation of every failure into an *llm.Error whose
// class tells the pipeline whether to retry the row, fail it, or stop the job.
package openaillm

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/batchgen/batchgen/internal/llm"
)

// DefaultBaseURL is OpenAI's API.
const DefaultBaseURL = "https://api.openai.com/v1"

// Config configures a Provider.
type Config struct {
	// Conn reaches the API. Its BaseURL is the API root up to and
	// including the version segment (".../v1"), defaulting to
	// DefaultBaseURL; its APIKey is sent as a bearer token.
	llm.Conn
	// LegacyMaxTokens sends Request.MaxTokens as max_tokens instead of
	// max_completion_tokens, for servers that predate the latter. OpenAI's
	// reasoning models reject max_tokens.
	LegacyMaxTokens bool
}

// Provider calls an OpenAI-compatible chat completions endpoint. It is safe
// for concurrent use.
type Provider struct {
	cfg  Config
	chat openai.ChatCompletionService
	// files and batches serve provider batches (batch.go).
	files   openai.FileService
	batches openai.BatchService
	// jsonMode is set once the server refused structured outputs.
	jsonMode atomic.Bool
}

var _ llm.Provider = (*Provider)(nil)

// New returns a Provider for cfg. It fails only on a BaseURL that is not an
// absolute http(s) URL.
func New(cfg Config) (*Provider, error) {
	conn, err := cfg.Open("openai", DefaultBaseURL)
	if err != nil {
		return nil, err
	}
	cfg.Conn = conn
	// NewChatCompletionService rather than openai.NewClient: the client
	// reads OPENAI_* environment variables, and only main reads the
	// environment here.
	opts := []option.RequestOption{
		option.WithBaseURL(cfg.BaseURL),
		option.WithHTTPClient(cfg.HTTPClient),
		option.WithMaxRetries(0),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	return &Provider{cfg: cfg, chat: openai.NewChatCompletionService(opts...),
		files: openai.NewFileService(opts...), batches: openai.NewBatchService(opts...)}, nil
}

// Generate sends req as one chat completion (an optional system message and
// one user message) and returns the first choice. Failures are *llm.Error,
// except a cancelled ctx, which is returned wrapped as is.
func (p *Provider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	params, jsonMode, err := p.params(req)
	if err != nil {
		return llm.Response{}, err
	}
	shaped := req.ResponseSchema() != nil

	callCtx, cancel := p.cfg.CallContext(ctx)
	defer cancel()
	var httpResp *http.Response
	resp, err := p.chat.New(callCtx, params, option.WithResponseInto(&httpResp))
	if err != nil {
		e := p.classify(ctx, callCtx, err, httpResp)
		if shaped && !jsonMode && llm.RefusesFeature(e, "response_format", "json_schema", "structured output") {
			// A server without structured outputs: learn it once, say so,
			// and ask in JSON mode from now on; the pipeline checks every
			// answer against the columns either way. A refused request is
			// not billed, so asking again at once costs nothing.
			if !p.jsonMode.Swap(true) {
				p.cfg.Logger.Warn("the server refused structured outputs (response_format json_schema); asking for JSON mode instead and checking every answer",
					"base_url", llm.RedactURL(p.cfg.BaseURL), "error", e.Error())
			}
			return p.Generate(ctx, req)
		}
		return llm.Response{}, e
	}
	out, err := p.response(resp)
	if err == nil && httpResp != nil {
		out.RateLimits = llm.ParseRateLimits(httpResp.Header)
	}
	return out, err
}

// params is the chat completion req asks for, the same online and in a
// batch file; jsonMode reports that a shaped answer is asked for in JSON
// mode (the server refused structured outputs before).
func (p *Provider) params(req llm.Request) (params openai.ChatCompletionNewParams, jsonMode bool, err error) {
	model, err := p.cfg.ModelFor(req, "OpenAI")
	if err != nil {
		return params, false, err
	}
	params = openai.ChatCompletionNewParams{Model: model}
	if req.System != "" {
		params.Messages = append(params.Messages, openai.SystemMessage(req.System))
	}
	params.Messages = append(params.Messages, openai.UserMessage(req.Prompt))
	for _, c := range req.Corrections {
		params.Messages = append(params.Messages, openai.AssistantMessage(c.Answer), openai.UserMessage(c.FollowUp))
	}
	shaped := req.ResponseSchema() != nil
	jsonMode = shaped && p.jsonMode.Load()
	if shaped {
		params.ResponseFormat = p.responseFormat(req, jsonMode, &params)
	}
	if req.Temperature != nil {
		params.Temperature = openai.Float(*req.Temperature)
	}
	if req.TopP != nil {
		params.TopP = openai.Float(*req.TopP)
	}
	if req.MaxTokens > 0 {
		if p.cfg.LegacyMaxTokens {
			params.MaxTokens = openai.Int(int64(req.MaxTokens))
		} else {
			params.MaxCompletionTokens = openai.Int(int64(req.MaxTokens))
		}
	}
	return params, jsonMode, nil
}

// responseFormat asks for an answer of req's shape: strict structured
// outputs (json_schema), or JSON mode (json_object) on a server that
// refused those, with the shape said in the system message, as JSON mode
// requires the word JSON there and cannot be told the shape otherwise.
func (p *Provider) responseFormat(req llm.Request, jsonMode bool, params *openai.ChatCompletionNewParams) openai.ChatCompletionNewParamsResponseFormatUnion {
	if jsonMode {
		params.Messages = append([]openai.ChatCompletionMessageParamUnion{openai.SystemMessage(req.SchemaInstructions())}, params.Messages...)
		return openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	}
	return openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
		JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{
			Name: "answer", Strict: openai.Bool(true), Schema: req.ResponseSchema(),
		},
	}}
}

// JSONMode reports whether the server refused structured outputs and
// answers with columns are asked for in JSON mode, for the run's summary.
func (p *Provider) JSONMode() bool { return p.jsonMode.Load() }

func (p *Provider) response(resp *openai.ChatCompletion) (llm.Response, error) {
	if resp == nil || len(resp.Choices) == 0 {
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "completion had no choices"}
	}
	c := resp.Choices[0]
	if c.FinishReason == "content_filter" {
		return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: http.StatusOK, Message: "completion stopped by the provider's content filter"}
	}
	if c.Message.Content == "" && c.Message.Refusal != "" {
		return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: http.StatusOK, Message: p.cfg.Clean("model refused: " + c.Message.Refusal)}
	}
	return llm.Response{
		Text: c.Message.Content,
		Usage: llm.Usage{
			InputTokens:       int(resp.Usage.PromptTokens),
			OutputTokens:      int(resp.Usage.CompletionTokens),
			CachedInputTokens: int(resp.Usage.PromptTokensDetails.CachedTokens),
		},
	}, nil
}

// classify turns a failed call into an *llm.Error. ctx is the caller's,
// callCtx the one with this call's timeout.
func (p *Provider) classify(ctx, callCtx context.Context, err error, httpResp *http.Response) error {
	if apiErr := (*openai.Error)(nil); errors.As(err, &apiErr) {
		return p.fromStatus(apiErr.StatusCode, apiErr.Code, apiErr.Type, apiErr.Message, llm.ResponseHeader(apiErr.Response))
	}
	return p.cfg.Failure(ctx, callCtx, err, httpResp, "chat completion", func(status int, h http.Header) *llm.Error {
		return p.fromStatus(status, "", "", "", h)
	})
}

// fromStatus classifies an HTTP error answer from its status and OpenAI's
// error code and type.
func (p *Provider) fromStatus(status int, code, typ, message string, h http.Header) *llm.Error {
	e := &llm.Error{StatusCode: status, Message: p.cfg.ErrorMessage(status, code, message), RateLimits: llm.ParseRateLimits(h)}
	lowerMsg := strings.ToLower(message)
	e.Class = llm.ClassOfStatus(status)
	// What OpenAI's codes say beyond the status.
	switch {
	case e.Class == llm.ClassRateLimited && (code == "insufficient_quota" || typ == "insufficient_quota"):
		e.Class = llm.ClassQuotaExhausted
	case e.Class == llm.ClassBadRequest && (code == "context_length_exceeded" || code == "string_above_max_length" ||
		strings.Contains(lowerMsg, "maximum context length") || strings.Contains(lowerMsg, "context_length_exceeded")):
		e.Class = llm.ClassPromptTooLong
	case e.Class == llm.ClassBadRequest && (code == "content_filter" || code == "content_policy_violation" ||
		typ == "content_filter" || typ == "content_policy_violation"):
		e.Class = llm.ClassContentFilter
	}
	if e.Class == llm.ClassRateLimited || e.Class == llm.ClassServer {
		e.RetryAfter = retryAfter(h, p.cfg.Clock.Now())
	}
	return e
}

// retryAfter is llm.RetryAfter; a variable so the adapter's tests keep
// their name for it.
var retryAfter = llm.RetryAfter
