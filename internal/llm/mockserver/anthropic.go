package mockserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// anthropic is the dialect of Anthropic's Messages API (POST /v1/messages,
// the API root being the server's address without /v1):
//
//   - the key in x-api-key or as a bearer token;
//   - a request of model, max_tokens (required), system (a string or text
//     blocks), messages of user and assistant turns, and optionally
//     output_config.format of type json_schema, Anthropic's structured
//     outputs (NoStructuredOutputs refuses it, as older models do; a
//     schema written in the messages, as schema.SchemaInstructions words
//     it, is answered in its shape too);
//   - errors as {"type":"error","error":{"type","message"}}: 402
//     billing_error for the quota marker, 429 rate_limit_error, 500
//     api_error, 529 overloaded_error for a 503, 504 timeout_error;
//   - anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}
//     headers, reset being an RFC 3339 time, and retry-after in seconds;
//   - stop_reason end_turn, max_tokens, or refusal for the output filter.
type anthropic struct{}

// authorized takes the key in x-api-key, as the API documents it, or as a
// bearer token, as the official SDK's v2 sends it.
func (anthropic) authorized(r *http.Request, key string) bool {
	return r.Header.Get("X-Api-Key") == key || r.Header.Get("Authorization") == "Bearer "+key
}

// anthropicRequest is the part of a Messages request the mock reads.
type anthropicRequest struct {
	Model     string          `json:"model"`
	MaxTokens *int            `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Stream       bool `json:"stream"`
	OutputConfig *struct {
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	} `json:"output_config"`
}

func (anthropic) parse(s *Server, body []byte) (chatRequest, *apiError, int) {
	bad := badRequest
	var ar anthropicRequest
	if err := json.Unmarshal(body, &ar); err != nil {
		return bad("", "invalid JSON body: %v", err)
	}
	switch {
	case ar.Model == "":
		return bad("model", "model: Field required")
	case ar.MaxTokens == nil:
		return bad("max_tokens", "max_tokens: Field required")
	case *ar.MaxTokens < 1:
		return bad("max_tokens", "max_tokens: Input should be greater than or equal to 1")
	case len(ar.Messages) == 0:
		return bad("messages", "messages: at least one message is required")
	case ar.Stream:
		return bad("stream", "the mock server does not support streaming")
	}
	req := chatRequest{model: ar.Model, maxTokens: *ar.MaxTokens}
	var all strings.Builder
	if len(ar.System) > 0 && string(ar.System) != "null" {
		text, ok := contentText(ar.System)
		if !ok {
			return bad("system", "system: Input should be a valid string or a list of text blocks")
		}
		all.WriteString(text)
		all.WriteByte('\n')
	}
	found := false
	for i, m := range ar.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return bad(fmt.Sprintf("messages.%d.role", i), "messages.%d.role: Input should be 'user' or 'assistant'", i)
		}
		text, ok := contentText(m.Content)
		if !ok {
			return bad(fmt.Sprintf("messages.%d.content", i), "messages.%d.content: Input should be a valid string or a list of text blocks", i)
		}
		all.WriteString(text)
		all.WriteByte('\n')
		if m.Role == "user" && !found {
			// The row's question: later user messages are re-asks of it.
			req.prompt, found = text, true
		}
	}
	if !found {
		return bad("messages", "messages: a user message is required")
	}
	req.text = all.String()
	if oc := ar.OutputConfig; oc != nil && oc.Format != nil {
		f := oc.Format
		if f.Type != "json_schema" {
			return bad("output_config.format.type", "output_config.format.type: Input should be 'json_schema'")
		}
		if s.cfg.NoStructuredOutputs {
			return bad("output_config.format", "output_config.format: structured outputs are not supported by model %s", ar.Model)
		}
		if len(f.Schema) == 0 {
			return bad("output_config.format.schema", "output_config.format.schema: Field required")
		}
		cols, packed, err := answerShape(f.Schema)
		if err != nil {
			return bad("output_config.format.schema", "output_config.format.schema: %v", err)
		}
		req.columns, req.packed = cols, packed
	} else if cols, packed := schemaInMessages(req.text); cols != nil || packed {
		// Asked for JSON in words, as a model without structured outputs
		// is: answer in the shape asked.
		req.jsonObject = true
		req.columns, req.packed = cols, packed
	}
	req.inTokens = estimateTokens(req.text)
	return req, nil, 0
}

// writeError words e as Anthropic does: its error type by status, the
// quota marker as a billing error, and its own words for the prompt
// limit and the content filter.
func (anthropic) writeError(w http.ResponseWriter, status int, e apiError) {
	status, body := anthropicError(status, e)
	writeJSON(w, status, body)
}

// anthropicError is e, given in the server's terms, as Anthropic words it:
// its status and body.
func anthropicError(status int, e apiError) (int, map[string]any) {
	typ, msg := "invalid_request_error", e.Message
	switch {
	case e.Code == "insufficient_quota":
		status, typ = http.StatusPaymentRequired, "billing_error"
		msg = "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."
	case e.Code == "context_length_exceeded":
		msg = "prompt is too long: 8193 tokens > 8192 maximum"
	case e.Code == "content_filter":
		msg = "Output blocked by content filtering policy"
	case status == http.StatusUnauthorized:
		typ, msg = "authentication_error", "invalid x-api-key"
	case status == http.StatusForbidden:
		typ = "permission_error"
	case status == http.StatusNotFound:
		typ = "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		status, typ, msg = 529, "overloaded_error", "Overloaded"
	case status == http.StatusGatewayTimeout:
		typ = "timeout_error"
	case status >= 500:
		typ, msg = "api_error", "Internal server error"
	}
	return status, map[string]any{
		"type":  "error",
		"error": map[string]string{"type": typ, "message": msg},
	}
}

// limitHeaders sets anthropic-ratelimit-{requests,tokens}-{limit,remaining,
// reset}, reset being when the window is whole again, in RFC 3339.
func (anthropic) limitHeaders(h http.Header, now time.Time, limits []limitWindow) {
	for _, l := range limits {
		prefix := "Anthropic-Ratelimit-" + l.kind + "-"
		h.Set(prefix+"Limit", strconv.Itoa(l.limit))
		h.Set(prefix+"Remaining", strconv.Itoa(l.remaining))
		h.Set(prefix+"Reset", now.Add(l.reset).UTC().Format(time.RFC3339))
	}
}

// retryHeaders sets retry-after in whole seconds, Anthropic's only hint.
func (anthropic) retryHeaders(h http.Header, wait time.Duration, _ bool) {
	h.Set("Retry-After", strconv.Itoa(retrySeconds(wait)))
}

// anthropicStop is the stop_reason of each of the server's finish reasons.
var anthropicStop = map[string]string{"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal"}

func (anthropic) answer(w http.ResponseWriter, id int64, _ time.Time, req chatRequest, text, finish string) {
	writeJSON(w, http.StatusOK, anthropicMessage(id, req, text, finish))
}

// anthropicMessage is an answer as the Messages API gives it.
func anthropicMessage(id int64, req chatRequest, text, finish string) map[string]any {
	content := []map[string]string{}
	if text != "" {
		content = append(content, map[string]string{"type": "text", "text": text})
	}
	return map[string]any{
		"id":            fmt.Sprintf("msg_mock_%08d", id),
		"type":          "message",
		"role":          "assistant",
		"model":         req.model,
		"content":       content,
		"stop_reason":   anthropicStop[finish],
		"stop_sequence": nil,
		"usage": map[string]int{
			"input_tokens": req.inTokens, "output_tokens": estimateTokens(text),
			"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
		},
	}
}
