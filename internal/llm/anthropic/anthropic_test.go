package anthropicllm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/schema"
)

const testKey = "sk-ant-test-0123456789abcdef"

func okBody(text, stop string) string {
	return fmt.Sprintf(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-test",
		"content":[{"type":"text","text":%q}],"stop_reason":%q,"stop_sequence":null,
		"usage":{"input_tokens":12,"output_tokens":7,"cache_read_input_tokens":30,"cache_creation_input_tokens":5}}`, text, stop)
}

func errBody(typ, message string) string {
	return fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, typ, message)
}

func newProvider(t *testing.T, baseURL string) *Provider {
	t.Helper()
	p, err := New(Config{Conn: llm.Conn{BaseURL: baseURL, APIKey: testKey, Model: "claude-test", Timeout: 5 * time.Second,
		Clock: clock.NewFake(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// TestGenerateSendsTheMessage holds the request to the Messages API's
// shape: the key (x-api-key or a bearer token), the path under the root, a max_tokens even
// when the task sets none, the system prompt, a re-ask's turns, and the
// columns' schema as output_config.format; and reads the answer's text and
// usage, prompt-cache tokens counted as input.
func TestGenerateSendsTheMessage(t *testing.T) {
	t.Parallel()
	var got struct {
		path, key string
		body      map[string]any
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.path, got.key = r.URL.Path, r.Header.Get("X-Api-Key")
		if got.key == "" {
			got.key = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &got.body); err != nil {
			t.Errorf("request body %s: %v", raw, err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Anthropic-Ratelimit-Requests-Limit", "50")
		w.Header().Set("Anthropic-Ratelimit-Requests-Remaining", "49")
		w.Header().Set("Anthropic-Ratelimit-Requests-Reset", "2026-12-02T09:00:01Z")
		io.WriteString(w, okBody(`{"summary":"拼出想象力"}`, "end_turn"))
	}))
	defer srv.Close()
	cols := schema.Columns{{Name: "summary", Type: schema.Text, Required: true}}
	resp, err := newProvider(t, srv.URL).Generate(t.Context(), llm.Request{
		System: "be brief", Prompt: "为积木写一句文案", Columns: cols,
		Corrections: []llm.Correction{{Answer: "nope", FollowUp: "again, as JSON"}},
	})
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if got.path != "/v1/messages" || got.key != testKey {
		t.Errorf("sent to %s with key %q, want /v1/messages with the key", got.path, got.key)
	}
	if got.body["max_tokens"] != float64(DefaultMaxTokens) || got.body["model"] != "claude-test" {
		t.Errorf("max_tokens %v, model %v: want %d and the configured model", got.body["max_tokens"], got.body["model"], DefaultMaxTokens)
	}
	if sys, _ := json.Marshal(got.body["system"]); !strings.Contains(string(sys), "be brief") {
		t.Errorf("system %s: want the system prompt", sys)
	}
	if msgs, _ := got.body["messages"].([]any); len(msgs) != 3 {
		t.Errorf("messages %v: want the prompt, the wrong answer and the follow-up", got.body["messages"])
	}
	format, _ := json.Marshal(got.body["output_config"])
	if !strings.Contains(string(format), `"type":"json_schema"`) || !strings.Contains(string(format), `"summary"`) {
		t.Errorf("output_config %s: want the columns' schema as a json_schema format", format)
	}
	if _, ok := got.body["temperature"]; ok {
		t.Error("temperature sent: the Messages API has deprecated it")
	}
	want := llm.Usage{InputTokens: 12 + 30 + 5, OutputTokens: 7, CachedInputTokens: 30}
	if resp.Usage != want || resp.Text != `{"summary":"拼出想象力"}` {
		t.Errorf("answer %q with usage %+v, want the text with usage %+v", resp.Text, resp.Usage, want)
	}
	if rl := resp.RateLimits.Requests; rl.Limit != 50 || rl.Remaining != 49 || rl.Reset != time.Second {
		t.Errorf("rate limits %+v: want 50, 49 left, whole in 1s", rl)
	}
}

// TestErrorClasses maps each of Anthropic's error answers to the classes
// every provider shares.
func TestErrorClasses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		status     int
		header     map[string]string
		body       string
		class      llm.ErrorClass
		retryAfter time.Duration
		message    string
	}{
		{"rate limited", 429, map[string]string{"Retry-After": "7"},
			errBody("rate_limit_error", "This request would exceed the rate limit for your organization of 50 requests per minute."), llm.ClassRateLimited, 7 * time.Second, "50 requests per minute"},
		{"rate limited, the reset only", 429, map[string]string{"Anthropic-Ratelimit-Tokens-Limit": "40000",
			"Anthropic-Ratelimit-Tokens-Remaining": "0", "Anthropic-Ratelimit-Tokens-Reset": "2026-12-02T09:00:12Z"},
			errBody("rate_limit_error", "tokens per minute exceeded"), llm.ClassRateLimited, 12 * time.Second, "rate_limit_error"},
		{"overloaded", 529, nil, errBody("overloaded_error", "Overloaded"), llm.ClassServer, 0, "Overloaded"},
		{"api error", 500, nil, errBody("api_error", "Internal server error"), llm.ClassServer, 0, "api_error"},
		{"billing", 402, nil, errBody("billing_error", "Your credit balance is too low."), llm.ClassQuotaExhausted, 0, "credit balance"},
		{"credit balance as a bad request", 400, nil, errBody("invalid_request_error", "Your credit balance is too low to access the Anthropic API."), llm.ClassQuotaExhausted, 0, "credit balance"},
		{"bad key", 401, nil, errBody("authentication_error", "invalid x-api-key"), llm.ClassAuth, 0, "invalid x-api-key"},
		{"no access", 403, nil, errBody("permission_error", "Your API key does not have permission to use the specified resource."), llm.ClassAuth, 0, "permission"},
		{"prompt too long", 400, nil, errBody("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"), llm.ClassPromptTooLong, 0, "prompt is too long"},
		{"request too large", 413, nil, errBody("request_too_large", "Request exceeds the maximum allowed number of bytes."), llm.ClassPromptTooLong, 0, "request_too_large"},
		{"content filter", 400, nil, errBody("invalid_request_error", "Output blocked by content filtering policy"), llm.ClassContentFilter, 0, "content filtering"},
		{"unknown model", 404, nil, errBody("not_found_error", "model: claude-nope"), llm.ClassBadRequest, 0, "claude-nope"},
		{"a proxy's page", 502, nil, "<html>Bad Gateway</html>", llm.ClassServer, 0, "502"},
		{"the key echoed", 401, nil, errBody("authentication_error", "invalid x-api-key "+testKey), llm.ClassAuth, 0, "[redacted]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			_, err := newProvider(t, srv.URL).Generate(t.Context(), llm.Request{Prompt: "p"})
			var e *llm.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T): want an *llm.Error", err, err)
			}
			if e.Class != tt.class || e.RetryAfter != tt.retryAfter || e.StatusCode != tt.status {
				t.Errorf("class %s, retry after %v, status %d; want %s, %v, %d (%v)", e.Class, e.RetryAfter, e.StatusCode, tt.class, tt.retryAfter, tt.status, e)
			}
			if !strings.Contains(e.Error(), tt.message) || strings.Contains(e.Error(), testKey) {
				t.Errorf("message %q: want it to say %q and never the key", e.Error(), tt.message)
			}
		})
	}
}

// TestRefusal: a stop_reason of refusal is the content filter, failing
// the row for good.
func TestRefusal(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, okBody("", "refusal"))
	}))
	defer srv.Close()
	_, err := newProvider(t, srv.URL).Generate(t.Context(), llm.Request{Prompt: "p"})
	if e := llm.Classify(err); e == nil || e.Class != llm.ClassContentFilter {
		t.Errorf("refusal: %v, want class content_filter", err)
	}
}

// TestModelWithoutStructuredOutputs: a model that refuses output_config is
// learnt once; that call and every later one ask for the shape in the
// system prompt, and the answers fit the columns.
func TestModelWithoutStructuredOutputs(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{NoStructuredOutputs: true})
	var refused atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		mock.ServeHTTP(rec, r)
		if rec.Code == http.StatusBadRequest {
			refused.Add(1)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	defer srv.Close()
	p := newProvider(t, srv.URL)
	cols := schema.Columns{{Name: "category", Type: schema.Enum, Values: []string{"toys", "home"}, Required: true}, {Name: "price", Type: schema.Number}}
	for i := range 3 {
		resp, err := p.Generate(t.Context(), llm.Request{Prompt: fmt.Sprintf("row %d", i), Columns: cols})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if _, err := cols.Validate(resp.Text); err != nil {
			t.Errorf("call %d: answer %s does not fit: %v", i, resp.Text, err)
		}
	}
	if refused.Load() != 1 || !p.JSONMode() {
		t.Errorf("%d refusals (asked in words: %v), want 1: the refusal is learnt once", refused.Load(), p.JSONMode())
	}
}

// TestBaseURL: the root is taken without /v1, as the SDK takes it; a root
// with /v1 is refused at once rather than answered 404 for every row.
func TestBaseURL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url string
		ok  bool
	}{
		{"", true}, {"https://api.anthropic.com", true}, {"http://127.0.0.1:8089/", true},
		{"http://127.0.0.1:8089/v1", false}, {"api.anthropic.com", false}, {"ftp://x", false},
	} {
		_, err := New(Config{Conn: llm.Conn{BaseURL: tt.url}})
		if (err == nil) != tt.ok {
			t.Errorf("base URL %q: error %v, want ok %v", tt.url, err, tt.ok)
		}
	}
}
