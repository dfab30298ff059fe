package llm

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// RateLimits is what a provider said about its rate limits in the headers
// of one answer (OpenAI's x-ratelimit-* family): the quota and how much of
// it is left. The limiter paces to it when the quota was not configured or
// was configured too high. The zero value says nothing.
type RateLimits struct {
	// Requests and Tokens are the request and token quotas.
	Requests, Tokens RateWindow
}

// RateWindow is one quota as the provider reported it.
type RateWindow struct {
	// Limit is the quota per minute (x-ratelimit-limit-*); 0 when not sent.
	Limit int
	// Remaining is what is left of it now (x-ratelimit-remaining-*); -1
	// when a limit was sent without it. A window without a Limit is all
	// zero.
	Remaining int
	// Reset is how long until the quota is whole again
	// (x-ratelimit-reset-*); 0 when not sent.
	Reset time.Duration
}

// Known reports whether the headers carried any limit.
func (r RateLimits) Known() bool { return r.Requests.Limit > 0 || r.Tokens.Limit > 0 }

// ParseRateLimits reads the x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// headers. Malformed values count as not sent: a header a proxy mangled must
// not stop a job.
func ParseRateLimits(h http.Header) RateLimits {
	if h == nil {
		return RateLimits{}
	}
	window := func(kind string) RateWindow {
		w := RateWindow{Remaining: -1}
		v, err := strconv.Atoi(strings.TrimSpace(h.Get("X-Ratelimit-Limit-" + kind)))
		if err != nil || v <= 0 {
			return RateWindow{}
		}
		w.Limit = v
		if v, err := strconv.Atoi(strings.TrimSpace(h.Get("X-Ratelimit-Remaining-" + kind))); err == nil && v >= 0 {
			w.Remaining = v
		}
		if d, err := time.ParseDuration(strings.TrimSpace(h.Get("X-Ratelimit-Reset-" + kind))); err == nil && d > 0 {
			w.Reset = d
		}
		return w
	}
	return RateLimits{Requests: window("requests"), Tokens: window("tokens")}
}

// ParseAnthropicRateLimits reads Anthropic's
// anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset} headers
// (per minute; reset is an RFC 3339 time, made a duration from now). The
// tokens window is Anthropic's most restrictive token limit in force.
// Malformed values count as not sent, as in ParseRateLimits.
func ParseAnthropicRateLimits(h http.Header, now time.Time) RateLimits {
	if h == nil {
		return RateLimits{}
	}
	window := func(kind string) RateWindow {
		prefix := "Anthropic-Ratelimit-" + kind + "-"
		v, err := strconv.Atoi(strings.TrimSpace(h.Get(prefix + "Limit")))
		if err != nil || v <= 0 {
			return RateWindow{}
		}
		w := RateWindow{Limit: v, Remaining: -1}
		if v, err := strconv.Atoi(strings.TrimSpace(h.Get(prefix + "Remaining"))); err == nil && v >= 0 {
			w.Remaining = v
		}
		if at, err := time.Parse(time.RFC3339, strings.TrimSpace(h.Get(prefix+"Reset"))); err == nil && at.After(now) {
			w.Reset = at.Sub(now)
		}
		return w
	}
	return RateLimits{Requests: window("Requests"), Tokens: window("Tokens")}
}

// SpentReset is how long until the longest spent window (nothing
// remaining) is whole again: a wait hint for an answer without
// Retry-After. 0 when no window is spent or none says.
func (r RateLimits) SpentReset() time.Duration {
	var d time.Duration
	for _, w := range []RateWindow{r.Requests, r.Tokens} {
		if w.Limit > 0 && w.Remaining == 0 {
			d = max(d, w.Reset)
		}
	}
	return d
}

// RetryAfter reads how long a provider asked the client to wait:
// retry-after-ms (OpenAI, Azure: the most precise), then Retry-After
// (seconds or an HTTP date), then, when a limit is spent, its
// x-ratelimit-reset-* hint. 0 when none is usable.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && !math.IsInf(ms, 0) {
			return capDuration(ms * float64(time.Millisecond))
		}
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil {
			if secs > 0 && !math.IsInf(secs, 0) {
				return capDuration(secs * float64(time.Second))
			}
			return 0
		}
		if at, err := http.ParseTime(v); err == nil {
			return max(at.Sub(now), 0)
		}
	}
	var d time.Duration
	for _, kind := range []string{"requests", "tokens"} {
		if strings.TrimSpace(h.Get("X-Ratelimit-Remaining-"+kind)) != "0" {
			continue
		}
		if reset, err := time.ParseDuration(strings.TrimSpace(h.Get("X-Ratelimit-Reset-" + kind))); err == nil {
			d = max(d, reset)
		}
	}
	return d
}

// capDuration converts nanoseconds to a Duration without overflowing.
func capDuration(ns float64) time.Duration {
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// DefaultOutputTokens is what EstimateRequestTokens assumes a completion
// uses when the request sets no MaxTokens. The provider's usage corrects it
// after the call, so it only shapes the first seconds of pacing.
const DefaultOutputTokens = 256

// messageOverheadTokens approximates the tokens a chat format adds around
// each message (role markers).
const messageOverheadTokens = 4

// EstimateTokens approximates a tokenizer without loading one: about four
// bytes per token for ASCII text and one token per other character (CJK
// text runs near one token per character; accented Latin is
// overestimated, which errs on the side of the quota).
func EstimateTokens(s string) int {
	if s == "" {
		return 0
	}
	ascii, other := 0, 0
	for _, r := range s {
		if r < utf8.RuneSelf {
			ascii++
		} else {
			other++
		}
	}
	return (ascii+3)/4 + other
}

// EstimateRequestTokens is what a call is charged against a tokens-per-minute
// quota before it is sent: the prompt's estimated tokens
// (EstimateInputTokens) plus the most the completion may use (MaxTokens, or
// DefaultOutputTokens when unset), the way providers count a request at
// admission. The usage the provider returns replaces the estimate
// afterwards (Limiter.Settle).
func EstimateRequestTokens(req Request) int {
	if req.MaxTokens > 0 {
		return EstimateInputTokens(req) + req.MaxTokens
	}
	return EstimateInputTokens(req) + DefaultOutputTokens
}

// EstimateInputTokens is the estimated prompt of a call: the system prompt,
// the prompt, the columns' schema (which travels with the request) and a
// re-ask's earlier exchanges, with each message's overhead.
func EstimateInputTokens(req Request) int {
	n := EstimateTokens(req.Prompt) + messageOverheadTokens
	if req.System != "" {
		n += EstimateTokens(req.System) + messageOverheadTokens
	}
	if sch := req.ResponseSchema(); sch != nil {
		n += EstimateTokens(string(sch))
	}
	for _, c := range req.Corrections {
		n += EstimateTokens(c.Answer) + EstimateTokens(c.FollowUp) + 2*messageOverheadTokens
	}
	return n
}
