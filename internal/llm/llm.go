// Package llm is the model provider port: one chat-style call per row, with
// typed errors that tell the pipeline whether to retry.
//
// Adapters: llm/sim (in-process simulator, the embedded default),
// llm/openai (any OpenAI-compatible chat completions server), llm/anthropic
// (Anthropic's Messages API) and llm/bedrock (Amazon Bedrock's Converse).
// The mockserver sub-package serves the OpenAI and Anthropic wire formats
// for tests and benchmarks.
package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/schema"
)

// Request is one model call.
type Request struct {
	Model  string
	System string
	Prompt string
	// Temperature and TopP are sent only when non-nil.
	Temperature *float64
	TopP        *float64
	// MaxTokens caps the completion; 0 leaves the provider's default.
	MaxTokens int
	// Columns, when not empty, asks for the answer as a JSON object of
	// their shape (schema.Columns.JSONSchema). An adapter holds the model
	// to it where its API can (OpenAI's strict structured outputs,
	// Bedrock's forced tool) and otherwise says it in the prompt; the
	// pipeline checks every answer (schema.Columns.Validate) either way.
	Columns schema.Columns
	// Corrections are earlier answers to this same prompt that did not fit
	// Columns, oldest first, each with what the model is told about it:
	// the adapter sends them as the conversation before the answer it asks
	// for now.
	Corrections []Correction
	// Pack, when set, makes this one call for several rows: Prompt is
	// schema.PackPrompt(Pack), and the answer an object holding one answer
	// per item id (schema.Columns.PackedJSONSchema, for Columns or for one
	// text each).
	Pack []schema.PackItem
}

// ResponseSchema is the JSON Schema the answer to r must match: the packed
// answer's for a packed call, the columns' for declared columns, nil for
// free text.
func (r Request) ResponseSchema() json.RawMessage {
	switch {
	case len(r.Pack) > 0:
		return r.Columns.PackedJSONSchema()
	case len(r.Columns) > 0:
		return r.Columns.JSONSchema()
	}
	return nil
}

// SchemaInstructions say ResponseSchema in words, for a server that cannot
// be held to it (JSON mode): see schema.SchemaMarker.
func (r Request) SchemaInstructions() string {
	return "Answer with only a JSON object that " + schema.SchemaMarker + "\n" + string(r.ResponseSchema())
}

// Correction is an answer that did not fit and the follow-up message that
// asks again (schema.Columns.FollowUp).
type Correction struct {
	Answer   string
	FollowUp string
}

// Response is a successful model call.
type Response struct {
	Text string
	// Usage is what the provider billed for the call, as it reported it
	// (or as estimated by a simulator).
	Usage Usage
	// Provider, when set, names the provider (and model) that answered,
	// for the result's provider column: a router sets the name of the route
	// it took. Empty means the task's provider and model.
	Provider string
	// RateLimits is what the answer's rate-limit headers said, if any.
	RateLimits RateLimits
}

// Usage counts the tokens of one call.
type Usage struct {
	// InputTokens counts prompt tokens, CachedInputTokens included.
	InputTokens int
	// OutputTokens counts completion tokens.
	OutputTokens int
	// CachedInputTokens is the part of InputTokens the provider read from
	// its prompt cache (OpenAI's cached_tokens, Bedrock's
	// cacheReadInputTokens); priced at the cached-input price where the
	// provider has one.
	CachedInputTokens int
}

// Provider generates text. Implementations return *Error (possibly wrapped)
// for failures they can classify; Classify handles the rest.
type Provider interface {
	Generate(ctx context.Context, req Request) (Response, error)
}

// ErrorClass says what kind of failure a call had. The string values are
// written to result files and accepted by --error-class filters.
type ErrorClass string

// Error classes. The first group is retryable, the second permanent for the
// row, and the last group permanent for the whole provider (every further
// call would fail the same way, so the job should stop calling).
const (
	ClassRateLimited ErrorClass = "rate_limited"
	ClassServer      ErrorClass = "server_error"
	ClassTimeout     ErrorClass = "timeout"
	ClassConnection  ErrorClass = "connection"

	ClassBadRequest    ErrorClass = "bad_request"
	ClassContentFilter ErrorClass = "content_filter"
	ClassPromptTooLong ErrorClass = "prompt_too_long"
	// ClassInvalidOutput marks a row whose answers never fitted the task's
	// declared columns, however often it was asked again; assigned by the
	// pipeline. A later round would ask the same model the same question,
	// so it is not retried on a timer.
	ClassInvalidOutput ErrorClass = "invalid_output"

	ClassQuotaExhausted ErrorClass = "insufficient_quota"
	ClassAuth           ErrorClass = "auth"

	// ClassRetryExhausted marks a row whose retryable failures outlasted
	// every attempt; it is assigned by the pipeline, never by a provider.
	ClassRetryExhausted ErrorClass = "retry_exhausted"
)

// Retryable reports whether a call failing with class c may succeed if tried
// again later.
func (c ErrorClass) Retryable() bool {
	switch c {
	case ClassRateLimited, ClassServer, ClassTimeout, ClassConnection, ClassBatchUnfinished:
		return true
	}
	return false
}

// Fatal reports whether class c means no call to the provider can succeed
// until an operator acts (billing, credentials).
func (c ErrorClass) Fatal() bool { return c == ClassQuotaExhausted || c == ClassAuth }

// ClassOfStatus is the class of an HTTP error answer from its status alone:
// the mapping every provider adapter starts from, refining it only where
// its API says more (OpenAI's insufficient_quota and context-length codes,
// say). 5xx and anything unexpected are transient until proven otherwise
// (see Classify).
func ClassOfStatus(status int) ErrorClass {
	switch {
	case status == http.StatusTooManyRequests:
		return ClassRateLimited
	case status == http.StatusRequestTimeout:
		return ClassTimeout
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return ClassAuth
	case status == http.StatusRequestEntityTooLarge:
		return ClassPromptTooLong
	case status >= 400 && status < 500:
		return ClassBadRequest
	}
	return ClassServer
}

// Error is a classified provider failure.
type Error struct {
	Class ErrorClass
	// StatusCode is the HTTP status, when there was one.
	StatusCode int
	// RetryAfter is the provider's requested wait (Retry-After), or 0.
	RetryAfter time.Duration
	// RateLimits is what the answer's rate-limit headers said, if any.
	RateLimits RateLimits
	// Message is the provider's explanation, safe to show to users.
	Message string
	// Err is the underlying error, if any.
	Err error
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	if e.StatusCode != 0 {
		return fmt.Sprintf("%s (HTTP %d): %s", e.Class, e.StatusCode, msg)
	}
	return fmt.Sprintf("%s: %s", e.Class, msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Classify returns err as an *Error: the one inside it if there is one,
// otherwise a class inferred from timeouts and network errors. Unknown
// errors are treated as transient server errors, because a permanent
// misclassification would fail rows that a retry would have saved, while
// retries are bounded anyway. Classify(nil) is nil.
func Classify(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Class: ClassTimeout, Message: "model call timed out", Err: err}
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		if netErr.Timeout() {
			return &Error{Class: ClassTimeout, Message: "model call timed out", Err: err}
		}
		return &Error{Class: ClassConnection, Message: err.Error(), Err: err}
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return &Error{Class: ClassConnection, Message: err.Error(), Err: err}
	}
	return &Error{Class: ClassServer, Message: err.Error(), Err: err}
}

// RefusesFeature reports whether err is a bad request whose message names
// one of features (case-insensitively): the server refusing a part of the
// request it does not support, such as structured outputs, rather than the
// request being wrong otherwise. An adapter that sees it falls back to a
// request without that part.
func RefusesFeature(err error, features ...string) bool {
	var e *Error
	if !errors.As(err, &e) || e.Class != ClassBadRequest {
		return false
	}
	msg := strings.ToLower(e.Message)
	for _, f := range features {
		if strings.Contains(msg, f) {
			return true
		}
	}
	return false
}
