package llm

import (
	"net/http"
	"testing"
	"time"
)

func TestParseAnthropicRateLimits(t *testing.T) {
	now := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	tests := []struct {
		name  string
		h     http.Header
		want  RateLimits
		spent time.Duration
	}{
		{"none", nil, RateLimits{}, 0},
		{"requests and tokens", h(
			"anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "0",
			"anthropic-ratelimit-requests-reset", "2026-12-02T09:00:03Z",
			"anthropic-ratelimit-tokens-limit", "40000", "anthropic-ratelimit-tokens-remaining", "39000",
			"anthropic-ratelimit-tokens-reset", "2026-12-02T09:00:01Z"),
			RateLimits{Requests: RateWindow{50, 0, 3 * time.Second}, Tokens: RateWindow{40000, 39000, time.Second}}, 3 * time.Second},
		{"a reset in the past", h("anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-reset", "2026-12-02T08:59:00Z"),
			RateLimits{Requests: RateWindow{50, -1, 0}}, 0},
		{"mangled values", h("anthropic-ratelimit-requests-limit", "fifty", "anthropic-ratelimit-tokens-limit", "100",
			"anthropic-ratelimit-tokens-remaining", "-3", "anthropic-ratelimit-tokens-reset", "soon"),
			RateLimits{Tokens: RateWindow{100, -1, 0}}, 0},
		{"OpenAI's headers are not Anthropic's", h("x-ratelimit-limit-requests", "50"), RateLimits{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseAnthropicRateLimits(tt.h, now)
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if s := got.SpentReset(); s != tt.spent {
				t.Errorf("spent reset %v, want %v", s, tt.spent)
			}
		})
	}
}
