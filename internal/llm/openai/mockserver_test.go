package openaillm_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
)

const mockKey = "sk-mock-key-0123456789"

func newMock(t *testing.T, cfg mockserver.Config, mutate ...func(*openaillm.Config)) (*mockserver.Server, *openaillm.Provider) {
	t.Helper()
	cfg.RequireAPIKey = mockKey
	mock := mockserver.New(cfg)
	srv := httptest.NewServer(mock)
	t.Cleanup(srv.Close)
	pcfg := openaillm.Config{Conn: llm.Conn{BaseURL: srv.URL + "/v1", APIKey: mockKey, Model: "gpt-mock", Timeout: 2 * time.Second}}
	for _, m := range mutate {
		m(&pcfg)
	}
	p, err := openaillm.New(pcfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return mock, p
}

func TestAgainstMockServer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		prompt    string
		wantText  string
		wantClass llm.ErrorClass
		wantRetry time.Duration
	}{
		{prompt: "Widget", wantText: "Copy for: Widget"},
		{prompt: "商品：无线耳机", wantText: "Copy for: 商品：无线耳机"},
		{prompt: "[[filter]]", wantClass: llm.ClassContentFilter},
		{prompt: "[[filter_output]]", wantClass: llm.ClassContentFilter},
		{prompt: "[[too_long]]", wantClass: llm.ClassPromptTooLong},
		{prompt: "[[5xx]]", wantClass: llm.ClassServer},
		{prompt: "[[flaky]]", wantClass: llm.ClassServer, wantRetry: time.Second},
		{prompt: "[[quota]]", wantClass: llm.ClassQuotaExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.prompt, func(t *testing.T) {
			t.Parallel()
			_, p := newMock(t, mockserver.Config{})
			resp, err := p.Generate(context.Background(), llm.Request{System: "be brief", Prompt: tc.prompt})
			if tc.wantClass == "" {
				if err != nil {
					t.Fatalf("Generate: %v", err)
				}
				if resp.Text != tc.wantText || resp.Usage.InputTokens <= 0 || resp.Usage.OutputTokens <= 0 {
					t.Errorf("response = %+v, want text %q and token counts", resp, tc.wantText)
				}
				return
			}
			var lerr *llm.Error
			if !errors.As(err, &lerr) {
				t.Fatalf("err = %v, want *llm.Error", err)
			}
			if diff := cmp.Diff([]any{tc.wantClass, tc.wantRetry}, []any{lerr.Class, lerr.RetryAfter}); diff != "" {
				t.Errorf("class, retry-after (-want +got):\n%s\nerror: %v", diff, err)
			}
		})
	}
}

func TestMockServerQuotaAndRecovery(t *testing.T) {
	t.Parallel()
	mock, p := newMock(t, mockserver.Config{Quota: 1, QuotaWindow: time.Minute})
	ctx := context.Background()
	if _, err := p.Generate(ctx, llm.Request{Prompt: "a"}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	_, err := p.Generate(ctx, llm.Request{Prompt: "b"})
	var lerr *llm.Error
	if !errors.As(err, &lerr) || lerr.Class != llm.ClassRateLimited || lerr.RetryAfter < 59*time.Second || lerr.RetryAfter > 60*time.Second {
		t.Fatalf("second call err = %v (retry after %v), want rate limited for about 60s", err, lerr.RetryAfter)
	}
	mock.Reset()
	if _, err := p.Generate(ctx, llm.Request{Prompt: "b"}); err != nil {
		t.Fatalf("after reset: %v", err)
	}
}

func TestMockServerFlakyRecovers(t *testing.T) {
	t.Parallel()
	mock, p := newMock(t, mockserver.Config{})
	req := llm.Request{Prompt: "[[flaky]] row 7"}
	if _, err := p.Generate(context.Background(), req); err == nil {
		t.Fatal("first call succeeded, want the flaky failure")
	}
	resp, err := p.Generate(context.Background(), req)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if resp.Text != "Copy for: [[flaky]] row 7" {
		t.Errorf("text = %q", resp.Text)
	}
	if got := mock.Stats().PerPrompt[req.Prompt]; got != (mockserver.PromptStats{Calls: 2, Succeeded: 1}) {
		t.Errorf("per-prompt stats = %+v, want 2 calls, 1 success", got)
	}
}

func TestMockServerWrongKey(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{RequireAPIKey: mockKey})
	srv := httptest.NewServer(mock)
	defer srv.Close()
	p, err := openaillm.New(openaillm.Config{Conn: llm.Conn{BaseURL: srv.URL + "/v1", APIKey: "sk-wrong-key-999", Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Generate(context.Background(), llm.Request{Prompt: "x"})
	var lerr *llm.Error
	if !errors.As(err, &lerr) || lerr.Class != llm.ClassAuth || !lerr.Class.Fatal() {
		t.Fatalf("err = %v, want fatal class %s", err, llm.ClassAuth)
	}
	if strings.Contains(err.Error(), "sk-wrong-key-999") {
		t.Errorf("error shows the key: %v", err)
	}
}

func TestMockServerHangTimesOut(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{})
	srv := httptest.NewServer(mock)
	defer srv.Close()
	p, err := openaillm.New(openaillm.Config{Conn: llm.Conn{BaseURL: srv.URL + "/v1", Model: "m", Timeout: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Generate(context.Background(), llm.Request{Prompt: "[[timeout]]"})
	var lerr *llm.Error
	if !errors.As(err, &lerr) || lerr.Class != llm.ClassTimeout {
		t.Fatalf("err = %v, want class %s", err, llm.ClassTimeout)
	}
	deadline := time.Now().Add(10 * time.Second)
	for mock.Stats().Canceled != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("server never saw the client give up: %+v", mock.Stats())
		}
		runtime.Gosched()
	}
}

func TestMockServerMaxTokens(t *testing.T) {
	t.Parallel()
	for _, legacy := range []bool{false, true} {
		_, p := newMock(t, mockserver.Config{}, func(c *openaillm.Config) { c.LegacyMaxTokens = legacy })
		resp, err := p.Generate(context.Background(), llm.Request{Prompt: "a fairly long product name", MaxTokens: 2})
		if err != nil {
			t.Fatalf("legacy=%v: %v", legacy, err)
		}
		if resp.Text != "Copy for" || resp.Usage.OutputTokens != 2 {
			t.Errorf("legacy=%v: response = %+v, want text cut to 2 tokens", legacy, resp)
		}
	}
}

// TestRateLimitHeadersSurface: the adapter hands the answer's x-ratelimit-*
// headers to the caller, on a completion and on a 429, and a 429 without
// them still carries its Retry-After.
func TestRateLimitHeadersSurface(t *testing.T) {
	t.Parallel()
	for _, noHeaders := range []bool{false, true} {
		t.Run(map[bool]string{false: "headers", true: "no headers"}[noHeaders], func(t *testing.T) {
			t.Parallel()
			_, p := newMock(t, mockserver.Config{Quota: 1, TokenQuota: 6000, NoRateLimitHeaders: noHeaders})
			resp, err := p.Generate(t.Context(), llm.Request{Prompt: "one", MaxTokens: 50})
			if err != nil {
				t.Fatalf("first call: %v", err)
			}
			_, err = p.Generate(t.Context(), llm.Request{Prompt: "two", MaxTokens: 50})
			var e *llm.Error
			if !errors.As(err, &e) || e.Class != llm.ClassRateLimited {
				t.Fatalf("second call: %v, want rate_limited", err)
			}
			type seen struct {
				OK, Limited llm.RateLimits
				RetryAfter  bool
			}
			want := seen{RetryAfter: true}
			if !noHeaders {
				want.OK = llm.RateLimits{
					Requests: llm.RateWindow{Limit: 1, Remaining: 0, Reset: time.Minute},
					Tokens:   llm.RateWindow{Limit: 6000, Remaining: 6000 - 51, Reset: time.Minute}, // "one\n" is 1 token, plus max_tokens
				}
				want.Limited = llm.RateLimits{
					Requests: llm.RateWindow{Limit: 1, Remaining: 0},
					Tokens:   llm.RateWindow{Limit: 6000, Remaining: 6000 - 5},
				}
			}
			got := seen{OK: resp.RateLimits, Limited: e.RateLimits, RetryAfter: e.RetryAfter > 0}
			// Resets depend on the wall clock between the calls: only
			// their presence on the completion is checked exactly.
			got.Limited.Requests.Reset, got.Limited.Tokens.Reset = 0, 0
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rate limits seen (-want +got):\n%s", diff)
			}
		})
	}
}
