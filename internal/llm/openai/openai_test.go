package openaillm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
)

const testKey = "sk-test-0123456789abcdef"

func okBody(content, finish string) string {
	return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-test",
		"choices":[{"index":0,"message":{"role":"assistant","content":%q,"refusal":null},"logprobs":null,"finish_reason":%q}],
		"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19,"prompt_tokens_details":{"cached_tokens":4}}}`, content, finish)
}

func errBody(message, typ, code string) string {
	return fmt.Sprintf(`{"error":{"message":%q,"type":%q,"param":null,"code":%q}}`, message, typ, code)
}

func newProvider(t *testing.T, baseURL string, mutate ...func(*Config)) *Provider {
	t.Helper()
	cfg := Config{Conn: llm.Conn{BaseURL: baseURL, APIKey: testKey, Model: "gpt-test", Timeout: 5 * time.Second}}
	for _, m := range mutate {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func ptr(f float64) *float64 { return &f }

func TestGenerateSendsRequestAndReadsResponse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		legacy   bool
		req      llm.Request
		wantBody map[string]any
	}{
		{
			name: "full request",
			req:  llm.Request{Model: "gpt-x", System: "be brief", Prompt: "为商品写文案", Temperature: ptr(0.2), TopP: ptr(0.9), MaxTokens: 64},
			wantBody: map[string]any{
				"model": "gpt-x",
				"messages": []any{
					map[string]any{"role": "system", "content": "be brief"},
					map[string]any{"role": "user", "content": "为商品写文案"},
				},
				"temperature": 0.2, "top_p": 0.9, "max_completion_tokens": float64(64),
			},
		},
		{
			name: "defaults: config model, no system, no settings",
			req:  llm.Request{Prompt: "hi"},
			wantBody: map[string]any{
				"model":    "gpt-test",
				"messages": []any{map[string]any{"role": "user", "content": "hi"}},
			},
		},
		{
			name:   "legacy max_tokens",
			legacy: true,
			req:    llm.Request{Prompt: "hi", MaxTokens: 10},
			wantBody: map[string]any{
				"model":      "gpt-test",
				"messages":   []any{map[string]any{"role": "user", "content": "hi"}},
				"max_tokens": float64(10),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				gotBody map[string]any
				gotAuth string
				gotPath string
			)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gotAuth, gotPath = r.Header.Get("Authorization"), r.URL.Path
				if err := json.NewDecoder(r.Body).Decode(&gotBody); err != nil {
					t.Errorf("decode request: %v", err)
				}
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, okBody("Fresh copy", "stop"))
			}))
			defer srv.Close()
			p := newProvider(t, srv.URL+"/v1", func(c *Config) { c.LegacyMaxTokens = tc.legacy })
			resp, err := p.Generate(context.Background(), tc.req)
			if err != nil {
				t.Fatalf("Generate: %v", err)
			}
			if diff := cmp.Diff(llm.Response{Text: "Fresh copy", Usage: llm.Usage{InputTokens: 12, OutputTokens: 7, CachedInputTokens: 4}}, resp); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantBody, gotBody); diff != "" {
				t.Errorf("request body (-want +got):\n%s", diff)
			}
			if want := "Bearer " + testKey; gotAuth != want {
				t.Errorf("Authorization = %q, want %q", gotAuth, want)
			}
			if gotPath != "/v1/chat/completions" {
				t.Errorf("path = %q, want /v1/chat/completions", gotPath)
			}
		})
	}
}

func TestGenerateClassifiesAnswers(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	type answer struct {
		status  int
		headers map[string]string
		body    string
	}
	tests := []struct {
		name        string
		answer      answer
		wantClass   llm.ErrorClass
		wantRetry   time.Duration
		wantMessage string // substring
	}{
		{"insufficient quota by code", answer{429, nil, errBody("You exceeded your current quota", "insufficient_quota", "insufficient_quota")}, llm.ClassQuotaExhausted, 0, "exceeded your current quota"},
		{"insufficient quota by type only", answer{429, map[string]string{"Retry-After": "5"}, errBody("quota", "insufficient_quota", "")}, llm.ClassQuotaExhausted, 0, "quota"},
		{"rate limited, Retry-After seconds", answer{429, map[string]string{"Retry-After": "7"}, errBody("Rate limit reached", "requests", "rate_limit_exceeded")}, llm.ClassRateLimited, 7 * time.Second, "Rate limit reached"},
		{"rate limited, retry-after-ms wins", answer{429, map[string]string{"Retry-After": "2", "Retry-After-Ms": "1500"}, errBody("slow down", "requests", "rate_limit_exceeded")}, llm.ClassRateLimited, 1500 * time.Millisecond, "slow down"},
		{"rate limited, HTTP date", answer{429, map[string]string{"Retry-After": now.Add(30 * time.Second).Format(http.TimeFormat)}, errBody("slow down", "requests", "")}, llm.ClassRateLimited, 30 * time.Second, "slow down"},
		{"rate limited, date in the past", answer{429, map[string]string{"Retry-After": now.Add(-time.Minute).Format(http.TimeFormat)}, errBody("slow down", "requests", "")}, llm.ClassRateLimited, 0, "slow down"},
		{"rate limited, reset hint", answer{429, map[string]string{"X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "6m0s", "X-Ratelimit-Remaining-Tokens": "100", "X-Ratelimit-Reset-Tokens": "9m"}, errBody("slow down", "requests", "")}, llm.ClassRateLimited, 6 * time.Minute, "slow down"},
		{"rate limited, garbage header", answer{429, map[string]string{"Retry-After": "soon"}, errBody("slow down", "requests", "")}, llm.ClassRateLimited, 0, "slow down"},
		{"500", answer{500, nil, errBody("The server had an error", "server_error", "")}, llm.ClassServer, 0, "server had an error"},
		{"503 with Retry-After", answer{503, map[string]string{"Retry-After": "3"}, errBody("overloaded", "server_error", "")}, llm.ClassServer, 3 * time.Second, "overloaded"},
		{"502 HTML from a proxy", answer{502, map[string]string{"Content-Type": "text/html"}, "<html><body>Bad Gateway</body></html>"}, llm.ClassServer, 0, "502 Bad Gateway"},
		{"500 empty body", answer{500, nil, ""}, llm.ClassServer, 0, "500"},
		{"408", answer{408, nil, errBody("timeout", "timeout", "")}, llm.ClassTimeout, 0, "timeout"},
		{"401 echoing the key", answer{401, nil, errBody("Incorrect API key provided: "+testKey+".", "invalid_request_error", "invalid_api_key")}, llm.ClassAuth, 0, "Incorrect API key provided: [redacted]"},
		{"403", answer{403, nil, errBody("region not supported", "invalid_request_error", "unsupported_country_region_territory")}, llm.ClassAuth, 0, "region not supported"},
		{"context length by code", answer{400, nil, errBody("too many tokens", "invalid_request_error", "context_length_exceeded")}, llm.ClassPromptTooLong, 0, "too many tokens"},
		{"context length by message", answer{400, nil, errBody("This model's maximum context length is 4096 tokens.", "BadRequestError", "")}, llm.ClassPromptTooLong, 0, "maximum context length"},
		{"413", answer{413, nil, ""}, llm.ClassPromptTooLong, 0, "413"},
		{"content filter", answer{400, nil, errBody("filtered", "invalid_request_error", "content_filter")}, llm.ClassContentFilter, 0, "filtered"},
		{"content policy", answer{400, nil, errBody("policy", "invalid_request_error", "content_policy_violation")}, llm.ClassContentFilter, 0, "policy"},
		{"other 400", answer{400, nil, errBody("Invalid value for temperature", "invalid_request_error", "invalid_value")}, llm.ClassBadRequest, 0, "Invalid value for temperature (invalid_value)"},
		{"404 model", answer{404, nil, errBody("The model does not exist", "invalid_request_error", "model_not_found")}, llm.ClassBadRequest, 0, "does not exist"},
		{"422 without JSON", answer{422, nil, "nope"}, llm.ClassBadRequest, 0, "422"},
		{"200 filtered", answer{200, nil, okBody("", "content_filter")}, llm.ClassContentFilter, 0, "content filter"},
		{"200 refusal", answer{200, nil, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`}, llm.ClassContentFilter, 0, "can't help"},
		{"200 no choices", answer{200, nil, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[]}`}, llm.ClassServer, 0, "no choices"},
		{"200 malformed JSON", answer{200, map[string]string{"Content-Type": "application/json"}, `{"id": nope}`}, llm.ClassServer, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				if w.Header().Get("Content-Type") == "" {
					w.Header().Set("Content-Type", "application/json")
				}
				for k, v := range tc.answer.headers {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.answer.status)
				io.WriteString(w, tc.answer.body)
			}))
			defer srv.Close()
			p := newProvider(t, srv.URL, func(c *Config) { c.Clock = clock.NewFake(now) })
			_, err := p.Generate(context.Background(), llm.Request{Prompt: "p"})
			var lerr *llm.Error
			if !errors.As(err, &lerr) {
				t.Fatalf("err = %v (%T), want *llm.Error", err, err)
			}
			type got struct {
				Class      llm.ErrorClass
				StatusCode int
				RetryAfter time.Duration
			}
			if diff := cmp.Diff(got{tc.wantClass, tc.answer.status, tc.wantRetry}, got{lerr.Class, lerr.StatusCode, lerr.RetryAfter}); diff != "" {
				t.Errorf("classification (-want +got):\n%s\nerror: %v", diff, err)
			}
			if !strings.Contains(lerr.Message, tc.wantMessage) {
				t.Errorf("Message = %q, want it to contain %q", lerr.Message, tc.wantMessage)
			}
			if s := fmt.Sprintf("%v %+v %#v", err, err, lerr.Message); strings.Contains(s, testKey) {
				t.Errorf("error text contains the API key: %s", s)
			}
			if n := hits.Load(); n != 1 {
				t.Errorf("server saw %d requests, want 1 (SDK retries must be off)", n)
			}
		})
	}
}

func TestGenerateTimeouts(t *testing.T) {
	t.Parallel()
	// The server answers only when the client gives up.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices a client hang-up only once the body is read.
		io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	tests := []struct {
		name      string
		timeout   time.Duration
		ctx       func() (context.Context, context.CancelFunc)
		wantClass llm.ErrorClass
		wantIs    error
	}{
		{
			name:      "config timeout",
			timeout:   50 * time.Millisecond,
			ctx:       func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			wantClass: llm.ClassTimeout, wantIs: context.DeadlineExceeded,
		},
		{
			name: "caller deadline",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 50*time.Millisecond)
			},
			wantClass: llm.ClassTimeout, wantIs: context.DeadlineExceeded,
		},
		{
			name: "caller cancels",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(50*time.Millisecond, cancel)
				return ctx, cancel
			},
			wantIs: context.Canceled,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newProvider(t, srv.URL, func(c *Config) { c.Timeout = tc.timeout })
			ctx, cancel := tc.ctx()
			defer cancel()
			_, err := p.Generate(ctx, llm.Request{Prompt: "p"})
			if !errors.Is(err, tc.wantIs) {
				t.Fatalf("err = %v, want errors.Is %v", err, tc.wantIs)
			}
			var lerr *llm.Error
			isClassified := errors.As(err, &lerr)
			switch {
			case tc.wantClass == "" && isClassified:
				t.Errorf("err = %v, want an unclassified cancellation", err)
			case tc.wantClass != "" && (!isClassified || lerr.Class != tc.wantClass):
				t.Errorf("err = %v, want class %s", err, tc.wantClass)
			}
		})
	}
}

func TestGenerateConnectionFailures(t *testing.T) {
	t.Parallel()
	// A port that refuses: listen, note the address, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()

	hangUp := func(afterHeaders bool) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if afterHeaders {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(200)
				io.WriteString(w, `{"id":"x",`)
				w.(http.Flusher).Flush()
			}
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			conn.Close()
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	tests := []struct {
		name    string
		baseURL string
	}{
		{"connection refused", refused},
		{"closed before answering", hangUp(false)},
		{"closed mid-body", hangUp(true)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newProvider(t, tc.baseURL)
			_, err := p.Generate(context.Background(), llm.Request{Prompt: "p"})
			var lerr *llm.Error
			if !errors.As(err, &lerr) || lerr.Class != llm.ClassConnection {
				t.Fatalf("err = %v, want class %s", err, llm.ClassConnection)
			}
			if !lerr.Class.Retryable() {
				t.Errorf("class %s not retryable", lerr.Class)
			}
		})
	}
}

func TestTransportErrorsHideKeyInURL(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// Some gateways take the key as a query parameter.
	p := newProvider(t, "http://"+addr+"/v1?api-key="+testKey)
	_, err = p.Generate(context.Background(), llm.Request{Prompt: "p"})
	if err == nil {
		t.Fatal("Generate succeeded against a closed port")
	}
	if strings.Contains(err.Error(), testKey) {
		t.Errorf("error contains the API key: %v", err)
	}
}

func TestGenerateWithoutModel(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Conn: llm.Conn{BaseURL: "http://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Generate(context.Background(), llm.Request{Prompt: "p"})
	var lerr *llm.Error
	if !errors.As(err, &lerr) || lerr.Class != llm.ClassBadRequest {
		t.Fatalf("err = %v, want class %s", err, llm.ClassBadRequest)
	}
}

func TestNewRejectsBadBaseURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		baseURL string
		wantErr bool
	}{
		{"default", "", false},
		{"https", "https://example.com/v1", false},
		{"relative", "/v1", true},
		{"ftp", "ftp://example.com", true},
		{"garbage", "http://[::1", true},
		{"key in query stays hidden", "ftp://example.com?key=" + testKey, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(Config{Conn: llm.Conn{BaseURL: tc.baseURL}})
			if (err != nil) != tc.wantErr {
				t.Fatalf("New(%q) err = %v, want error %v", tc.baseURL, err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), testKey) {
				t.Errorf("error contains the key: %v", err)
			}
		})
	}
}
