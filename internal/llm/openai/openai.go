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
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
)

// DefaultBaseURL is OpenAI's API.
const DefaultBaseURL = "https://api.openai.com/v1"

// Config configures a Provider.
type Config struct {
	// BaseURL is the API root, up to and including the version segment
	// (".../v1"). Defaults to DefaultBaseURL.
	BaseURL string
	// APIKey is sent as a bearer token. It never appears in errors. Empty
	// sends no Authorization header (local servers).
	APIKey string
	// Model is used when a Request names none.
	Model string
	// Timeout bounds each call; 0 leaves only the caller's ctx. A call that
	// runs out of it fails with ClassTimeout.
	Timeout time.Duration
	// HTTPClient sends the requests. Defaults to llm.HTTPClient.
	HTTPClient *http.Client
	// LegacyMaxTokens sends Request.MaxTokens as max_tokens instead of
	// max_completion_tokens, for servers that predate the latter. OpenAI's
	// reasoning models reject max_tokens.
	LegacyMaxTokens bool
	// Clock turns an HTTP-date Retry-After into a duration. Defaults to
	// clock.Real.
	Clock clock.Clock
	// Logger says, once, that the server refused structured outputs.
	// Defaults to discarding.
	Logger *slog.Logger
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
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if err := llm.CheckBaseURL("openai", cfg.BaseURL); err != nil {
		return nil, err
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = llm.HTTPClient()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
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

	callCtx := ctx
	if p.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	var httpResp *http.Response
	resp, err := p.chat.New(callCtx, params, option.WithResponseInto(&httpResp))
	if err != nil {
		e := p.classify(ctx, callCtx, err, httpResp)
		if shaped && !jsonMode && refusesJSONSchema(e) {
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
	model := req.Model
	if model == "" {
		model = p.cfg.Model
	}
	if model == "" {
		return params, false, &llm.Error{Class: llm.ClassBadRequest, Message: "no model configured for the OpenAI provider"}
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

// refusesJSONSchema reports whether a failed call is the server refusing
// structured outputs (a 400 or 422 that names response_format or
// json_schema), not the request being wrong otherwise.
func refusesJSONSchema(e error) bool {
	var le *llm.Error
	if !errors.As(e, &le) || le.Class != llm.ClassBadRequest {
		return false
	}
	msg := strings.ToLower(le.Message)
	return strings.Contains(msg, "response_format") || strings.Contains(msg, "json_schema") || strings.Contains(msg, "structured output")
}

func (p *Provider) response(resp *openai.ChatCompletion) (llm.Response, error) {
	if resp == nil || len(resp.Choices) == 0 {
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "completion had no choices"}
	}
	c := resp.Choices[0]
	if c.FinishReason == "content_filter" {
		return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: http.StatusOK, Message: "completion stopped by the provider's content filter"}
	}
	if c.Message.Content == "" && c.Message.Refusal != "" {
		return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: http.StatusOK, Message: p.clean("model refused: " + c.Message.Refusal)}
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
	var apiErr *openai.Error
	switch {
	case errors.As(err, &apiErr):
		var h http.Header
		if apiErr.Response != nil {
			h = apiErr.Response.Header
		}
		return p.fromStatus(apiErr.StatusCode, apiErr.Code, apiErr.Type, apiErr.Message, h)
	case httpResp != nil && httpResp.StatusCode >= 400:
		// An error body the SDK could not decode (a proxy's HTML page):
		// the status still says what happened.
		return p.fromStatus(httpResp.StatusCode, "", "", "", httpResp.Header)
	}
	return llm.CallFailure(ctx, callCtx, p.cfg.Timeout, err, httpResp, p.cfg.APIKey, "chat completion")
}

// fromStatus classifies an HTTP error answer from its status and OpenAI's
// error code and type.
func (p *Provider) fromStatus(status int, code, typ, message string, h http.Header) *llm.Error {
	e := &llm.Error{StatusCode: status, Message: p.describe(status, code, message), RateLimits: llm.ParseRateLimits(h)}
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

// describe builds the user-facing message: the provider's, or the status
// text, with the error code appended for searching provider docs.
func (p *Provider) describe(status int, code, message string) string {
	msg := strings.TrimSpace(message)
	if msg == "" {
		msg = strings.TrimSpace(fmt.Sprintf("%d %s", status, http.StatusText(status)))
	}
	if code != "" && !strings.Contains(msg, code) {
		msg += " (" + code + ")"
	}
	return p.clean(msg)
}

// clean removes the API key and bounds the length of a provider message.
func (p *Provider) clean(msg string) string { return llm.CleanMessage(msg, p.cfg.APIKey) }

// retryAfter is llm.RetryAfter; a variable so the adapter's tests keep
// their name for it.
var retryAfter = llm.RetryAfter
