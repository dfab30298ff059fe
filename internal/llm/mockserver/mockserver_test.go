package mockserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/schema"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func chatBody(prompt string) string {
	return fmt.Sprintf(`{"model":"gpt-mock","messages":[{"role":"system","content":"be brief"},{"role":"user","content":%q}]}`, prompt)
}

// post sends a chat completion straight to the handler.
func post(s *Server, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
	return rec
}

type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, rec *httptest.ResponseRecorder) errorBody {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var e errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", rec.Body.String(), err)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error body %s lacks message or type", rec.Body.String())
	}
	return e
}

func code(e errorBody) string {
	if e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}

func TestQuotaSlidingWindow(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	s := New(Config{Quota: 3, QuotaWindow: time.Minute, Clock: clk})
	type step struct {
		Advance    time.Duration
		Status     int
		RetryAfter string
	}
	steps := []step{
		{0, 200, ""},
		{10 * time.Second, 200, ""},
		{10 * time.Second, 200, ""},        // t=20s: 3 in window
		{0, 429, "40"},                     // first leaves at t=60s
		{39 * time.Second, 429, "1"},       // t=59s: 1 s left
		{500 * time.Millisecond, 429, "1"}, // t=59.5s: rounded up
		{500 * time.Millisecond, 200, ""},  // t=60s: first has left (window is half-open)
		{0, 429, "10"},                     // the one from t=10s leaves at t=70s
		{time.Hour, 200, ""},               // window empty again
	}
	var got []step
	for _, st := range steps {
		clk.Advance(st.Advance)
		rec := post(s, chatBody("p"))
		got = append(got, step{st.Advance, rec.Code, rec.Header().Get("Retry-After")})
		if rec.Code == 429 {
			e := decodeError(t, rec)
			if e.Error.Type != "rate_limit_exceeded" || code(e) != "rate_limit_exceeded" {
				t.Errorf("429 body = %s, want type and code rate_limit_exceeded", rec.Body.String())
			}
		}
	}
	if diff := cmp.Diff(steps, got); diff != "" {
		t.Errorf("quota answers (-want +got):\n%s", diff)
	}
	st := s.Stats()
	if st.Succeeded != 5 || st.RateLimited != 4 || st.Requests != 9 {
		t.Errorf("stats = %+v, want 5 succeeded, 4 rate limited, 9 requests", st)
	}
}

// TestTokenQuotaSlidingWindow: a request is charged its prompt and
// max_tokens when admitted and its usage once answered; one that does not
// fit the window is refused until enough charges leave it.
func TestTokenQuotaSlidingWindow(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	// Prompt "be brief\np\n" is 3 tokens, the answer "Copy for: p" 3: a
	// request with max_tokens 40 is charged 43, then 6.
	s := New(Config{TokenQuota: 50, QuotaWindow: time.Minute, Clock: clk})
	type step struct {
		Advance    time.Duration
		MaxTokens  int
		Status     int
		RetryAfter string
		Remaining  string // x-ratelimit-remaining-tokens
	}
	steps := []step{
		{0, 40, 200, "", "7"},                   // 43 charged at admission
		{10 * time.Second, 45, 429, "50", "44"}, // 6 + 48 > 50 until the first leaves at t=60s
		{0, 40, 200, "", "1"},                   // 6 + 43 fit
		{50 * time.Second, 45, 429, "10", "44"}, // t=60s: the first left; 6 + 48 > 50 until t=70s
		{10 * time.Second, 45, 200, "", "2"},    // t=70s: window empty, 48 charged
	}
	var got []step
	for _, st := range steps {
		clk.Advance(st.Advance)
		rec := post(s, fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"p"}]}`, st.MaxTokens))
		got = append(got, step{st.Advance, st.MaxTokens, rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("X-Ratelimit-Remaining-Tokens")})
		if rec.Code == 429 && !strings.Contains(decodeError(t, rec).Error.Message, "tokens") {
			t.Errorf("429 body = %s, want it to name the token quota", rec.Body.String())
		}
	}
	if diff := cmp.Diff(steps, got); diff != "" {
		t.Errorf("token quota answers (-want +got):\n%s", diff)
	}
	if st := s.Stats(); st.Tokens != 18 || st.Succeeded != 3 {
		t.Errorf("stats: %d tokens used by %d completions, want 18 by 3 (6 each, whatever was charged)", st.Tokens, st.Succeeded)
	}
}

// TestRateLimitHeaders: answers state the quotas per minute and what is
// left; a 429 adds Retry-After and retry-after-ms; NoRateLimitHeaders
// leaves all but Retry-After out.
func TestRateLimitHeaders(t *testing.T) {
	t.Parallel()
	names := []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
		"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens", "Retry-After", "Retry-After-Ms"}
	tests := []struct {
		name      string
		noHeaders bool
		want      [][]string // per request, the header values in names' order
	}{
		{"headers", false, [][]string{
			// 2 requests and 600 tokens per 10 s are 12 and 3600 a minute.
			// "prompt N" is 3 tokens: charged 63 at admission, 8 used.
			{"12", "6", "10s", "3600", "3222", "10s", "", ""},    // (600-63) x 6
			{"12", "0", "10s", "3600", "3174", "10s", "", ""},    // (600-8-63) x 6
			{"12", "0", "9s", "3600", "3504", "9s", "5", "5000"}, // refused at 5 s: the newest is whole at 14 s, the oldest leaves at 10 s
		}},
		{"no headers", true, [][]string{
			{"", "", "", "", "", "", "", ""},
			{"", "", "", "", "", "", "", ""},
			{"", "", "", "", "", "", "5", ""},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(t0)
			s := New(Config{Quota: 2, TokenQuota: 600, QuotaWindow: 10 * time.Second, NoRateLimitHeaders: tc.noHeaders, Clock: clk})
			var got [][]string
			for i, advance := range []time.Duration{0, 4 * time.Second, time.Second} {
				clk.Advance(advance)
				rec := post(s, fmt.Sprintf(`{"model":"m","max_tokens":60,"messages":[{"role":"user","content":"prompt %d"}]}`, i))
				var vals []string
				for _, n := range names {
					vals = append(vals, rec.Header().Get(n))
				}
				got = append(got, vals)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("headers %v (-want +got):\n%s", names, diff)
			}
		})
	}
}

func TestQuotaExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	s := New(Config{Quota: 20, Latency: 10 * time.Millisecond})
	srv := httptest.NewServer(s)
	defer srv.Close()
	const n = 100
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		status = map[int]int{}
	)
	for i := range n {
		wg.Go(func() {
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(fmt.Sprint("row ", i))))
			if err != nil {
				t.Errorf("post: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			status[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if diff := cmp.Diff(map[int]int{200: 20, 429: 80}, status); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	st := s.Stats()
	if st.Requests != n || st.Succeeded != 20 || st.RateLimited != 80 || st.InFlight != 0 {
		t.Errorf("stats = requests %d succeeded %d rate limited %d in flight %d, want %d/20/80/0",
			st.Requests, st.Succeeded, st.RateLimited, st.InFlight, n)
	}
	if st.PeakInFlight < 2 {
		t.Errorf("PeakInFlight = %d, want concurrent requests to be seen", st.PeakInFlight)
	}
}

func TestMarkers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		prompt     string
		wantStatus int
		wantCode   string
		wantType   string
		wantRetry  string
	}{
		{"plain", 200, "", "", ""},
		{"write [[filter]] copy", 400, "content_filter", "invalid_request_error", ""},
		{"[[too_long]]", 400, "context_length_exceeded", "invalid_request_error", ""},
		{"[[5xx]]", 500, "", "server_error", ""},
		{"[[flaky]]", 503, "", "server_error", "1"},
		{"[[quota]]", 429, "insufficient_quota", "insufficient_quota", ""},
	}
	for _, tc := range tests {
		t.Run(tc.prompt, func(t *testing.T) {
			t.Parallel()
			s := New(Config{})
			rec := post(s, chatBody(tc.prompt))
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tc.wantStatus, rec.Body.String())
			}
			if got := rec.Header().Get("Retry-After"); got != tc.wantRetry {
				t.Errorf("Retry-After = %q, want %q", got, tc.wantRetry)
			}
			if tc.wantStatus == 200 {
				return
			}
			e := decodeError(t, rec)
			if code(e) != tc.wantCode || e.Error.Type != tc.wantType {
				t.Errorf("error code/type = %q/%q, want %q/%q", code(e), e.Error.Type, tc.wantCode, tc.wantType)
			}
		})
	}
}

func TestMarkerInSystemPromptCounts(t *testing.T) {
	t.Parallel()
	s := New(Config{})
	rec := post(s, `{"model":"m","messages":[{"role":"system","content":"[[5xx]]"},{"role":"user","content":"hi"}]}`)
	if rec.Code != 500 {
		t.Fatalf("status = %d, want 500 for a marker in the system message", rec.Code)
	}
}

func TestFlakyFailsThenSucceeds(t *testing.T) {
	t.Parallel()
	s := New(Config{FlakyFailures: 2})
	var got []int
	for range 4 {
		got = append(got, post(s, chatBody("[[flaky]] row 1")).Code)
	}
	got = append(got, post(s, chatBody("[[flaky]] row 2")).Code)
	if diff := cmp.Diff([]int{503, 503, 200, 200, 503}, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	want := map[string]PromptStats{
		"[[flaky]] row 1": {Calls: 4, Succeeded: 2},
		"[[flaky]] row 2": {Calls: 1, Succeeded: 0},
	}
	if diff := cmp.Diff(want, s.Stats().PerPrompt); diff != "" {
		t.Errorf("PerPrompt (-want +got):\n%s", diff)
	}
}

func TestCompletionShape(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	s := New(Config{Clock: clk})
	tests := []struct {
		name       string
		body       string
		wantText   string
		wantFinish string
	}{
		{"string content", chatBody("Widget"), "Copy for: Widget", "stop"},
		{"parts content", `{"model":"gpt-mock","messages":[{"role":"user","content":[{"type":"text","text":"Wid"},{"type":"text","text":"get"}]}]}`, "Copy for: Widget", "stop"},
		// The row's question is the first user message: later ones re-ask it (a correction).
		{"first user message", `{"model":"gpt-mock","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`, "Copy for: a", "stop"},
		{"max_tokens cuts", `{"model":"gpt-mock","max_tokens":2,"messages":[{"role":"user","content":"a long product name"}]}`, "Copy for", "length"},
		{"max_completion_tokens cuts", `{"model":"gpt-mock","max_completion_tokens":1,"messages":[{"role":"user","content":"x"}]}`, "Copy", "length"},
		{"filtered output", chatBody("[[filter_output]]"), "", "content_filter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := post(s, tc.body)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
			}
			var c completion
			if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !strings.HasPrefix(c.ID, "chatcmpl-mock-") || c.Object != "chat.completion" || c.Model != "gpt-mock" || c.Created != t0.Unix() {
				t.Errorf("envelope = %+v", c)
			}
			if len(c.Choices) != 1 {
				t.Fatalf("choices = %d, want 1", len(c.Choices))
			}
			got := []string{c.Choices[0].Message.Role, c.Choices[0].Message.Content, c.Choices[0].FinishReason}
			if diff := cmp.Diff([]string{"assistant", tc.wantText, tc.wantFinish}, got); diff != "" {
				t.Errorf("role/content/finish (-want +got):\n%s", diff)
			}
			u := c.Usage
			if u.PromptTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens || (tc.wantText != "" && u.CompletionTokens <= 0) {
				t.Errorf("usage = %+v", u)
			}
		})
	}
}

func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantParam  string
	}{
		{"not JSON", "POST", "/v1/chat/completions", "{", 400, ""},
		{"JSON array", "POST", "/v1/chat/completions", "[]", 400, ""},
		{"no model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, 400, "model"},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400, "messages"},
		{"no user message", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"x"}]}`, 400, "messages"},
		{"bad role", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"wizard","content":"x"}]}`, 400, "messages[0].role"},
		{"bad content", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":42}]}`, 400, "messages[0].content"},
		{"image part", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}`, 400, "messages[0].content"},
		{"stream", "POST", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`, 400, "stream"},
		{"n=2", "POST", "/v1/chat/completions", `{"model":"m","n":2,"messages":[{"role":"user","content":"x"}]}`, 400, "n"},
		{"max_tokens 0", "POST", "/v1/chat/completions", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, 400, "max_tokens"},
		{"too large", "POST", "/v1/chat/completions", chatBody(strings.Repeat("x", 2048)), 413, ""},
		{"GET completions", "GET", "/v1/chat/completions", "", 405, ""},
		{"POST stats", "POST", "/stats", "", 405, ""},
		{"unknown path", "GET", "/v1/embeddings", "", 404, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := New(Config{MaxBodyBytes: 1024})
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tc.wantStatus, rec.Body.String())
			}
			e := decodeError(t, rec)
			var param string
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			if param != tc.wantParam {
				t.Errorf("param = %q, want %q", param, tc.wantParam)
			}
			if tc.wantStatus == 405 && rec.Header().Get("Allow") == "" {
				t.Error("405 without an Allow header")
			}
			if st := s.Stats(); st.Succeeded != 0 {
				t.Errorf("Succeeded = %d after a malformed request", st.Succeeded)
			}
		})
	}
}

func TestRequireAPIKey(t *testing.T) {
	t.Parallel()
	s := New(Config{RequireAPIKey: "sk-right"})
	tests := []struct {
		name   string
		header string
		want   int
	}{
		{"missing", "", 401},
		{"wrong", "Bearer sk-wrong", 401},
		{"right", "Bearer sk-right", 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody("x")))
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Fatalf("status = %d, want %d", rec.Code, tc.want)
			}
			if strings.Contains(rec.Body.String(), "sk-wrong") {
				t.Errorf("401 body echoes the presented key: %s", rec.Body.String())
			}
		})
	}
}

// outcomes runs the same prompts (each twice) through a fresh server.
func outcomes(cfg Config, prompts int) []int {
	s := New(cfg)
	var out []int
	for range 2 {
		for i := range prompts {
			out = append(out, post(s, chatBody(fmt.Sprint("row ", i))).Code)
		}
	}
	return out
}

func TestFailRateIsDeterministic(t *testing.T) {
	t.Parallel()
	const prompts = 1000
	a := outcomes(Config{FailRate: 0.3, Seed: 7}, prompts)
	b := outcomes(Config{FailRate: 0.3, Seed: 7}, prompts)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("same seed, different outcomes (-a +b):\n%s", diff)
	}
	c := outcomes(Config{FailRate: 0.3, Seed: 8}, prompts)
	if cmp.Equal(a, c) {
		t.Error("different seeds gave identical outcomes")
	}
	counts := map[int]int{}
	for _, code := range a {
		counts[code]++
	}
	failed := float64(counts[500]+counts[503]) / float64(len(a))
	if failed < 0.25 || failed > 0.35 {
		t.Errorf("failure fraction = %.3f, want about 0.3 (counts %v)", failed, counts)
	}
	if counts[500] == 0 || counts[503] == 0 {
		t.Errorf("counts = %v, want both 500s and 503s", counts)
	}
	// A retry of a failed call is a new roll: not every failed row fails
	// again, or retries could never help.
	recovered := 0
	for i := range prompts {
		if a[i] != 200 && a[prompts+i] == 200 {
			recovered++
		}
	}
	if recovered == 0 {
		t.Error("no row that failed once succeeded on its second call")
	}
	if got := outcomes(Config{FailRate: 1}, 10); strings.Contains(fmt.Sprint(got), "200") {
		t.Errorf("FailRate 1 outcomes = %v, want all failures", got)
	}
}

func TestJitterSpreadsLatency(t *testing.T) {
	t.Parallel()
	s := New(Config{Latency: 100 * time.Millisecond, Jitter: 40 * time.Millisecond})
	seen := map[time.Duration]bool{}
	for i := range 100 {
		d := s.latency(s.roll(fmt.Sprint(i), 1))
		if d < 60*time.Millisecond || d > 140*time.Millisecond {
			t.Fatalf("latency %v outside [60ms, 140ms]", d)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Errorf("%d distinct latencies for 100 prompts, want a spread", len(seen))
	}
}

// waitFor polls cond until it holds or a real-time deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

func TestClientDisconnectEndsWait(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		prompt string
	}{
		{"during latency", "plain"},
		{"during [[timeout]] hang", "[[timeout]]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A fake clock that never advances: only the disconnect can
			// end the wait.
			s := New(Config{Latency: time.Hour, Clock: clock.NewFake(t0)})
			srv := httptest.NewServer(s)
			defer srv.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody(tc.prompt)))
			done := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
					err = fmt.Errorf("got status %d, want the client to give up", resp.StatusCode)
				} else {
					err = nil
				}
				done <- err
			}()
			// The client gives up once the server holds the request: a
			// timeout set beforehand could end it before the server saw it
			// on a loaded machine, and then there is no disconnect to notice.
			waitFor(t, "the server to hold the request", func() bool { return s.Stats().InFlight == 1 })
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the server to notice the disconnect", func() bool {
				st := s.Stats()
				return st.Canceled == 1 && st.InFlight == 0
			})
		})
	}
}

func TestHangTimeout(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	s := New(Config{HangTimeout: time.Minute, Clock: clk})
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(s, chatBody("[[timeout]]")) }()
	for {
		select {
		case rec := <-done:
			if rec.Code != http.StatusGatewayTimeout {
				t.Fatalf("status = %d, want 504", rec.Code)
			}
			if elapsed := clk.Now().Sub(t0); elapsed < time.Minute {
				t.Fatalf("answered after %v of fake time, want >= 1m", elapsed)
			}
			return
		default:
			clk.Advance(time.Second)
			runtime.Gosched()
		}
	}
}

func TestStatsResetHealthz(t *testing.T) {
	t.Parallel()
	s := New(Config{Quota: 1})
	srv := httptest.NewServer(s)
	defer srv.Close()
	do := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, body := do("GET", "/healthz", ""); code != 200 || !strings.Contains(string(body), `"ok"`) {
		t.Errorf("healthz = %d %s", code, body)
	}
	do("POST", "/v1/chat/completions", chatBody("a"))
	do("POST", "/v1/chat/completions", chatBody("a")) // 429: quota 1
	do("POST", "/chat/completions", "{")              // 400, no /v1 prefix
	_, body := do("GET", "/stats", "")
	var got Stats
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("stats JSON: %v", err)
	}
	want := Stats{Requests: 3, Succeeded: 1, RateLimited: 1, Tokens: 6, BadRequests: 1, PeakInFlight: 1,
		PerPrompt: map[string]PromptStats{"a": {Calls: 2, Succeeded: 1}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if _, body := do("GET", "/stats?summary=1", ""); strings.Contains(string(body), "per_prompt") {
		t.Errorf("summary stats include per_prompt: %s", body)
	}
	if code, _ := do("POST", "/reset", ""); code != 200 {
		t.Fatalf("reset = %d", code)
	}
	if diff := cmp.Diff(Stats{PerPrompt: map[string]PromptStats{}}, s.Stats(), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("stats after reset (-want +got):\n%s", diff)
	}
	// The quota window was cleared too.
	if code, _ := do("POST", "/v1/chat/completions", chatBody("a")); code != 200 {
		t.Errorf("after reset status = %d, want 200", code)
	}
}

func TestPerPromptTrackingIsBounded(t *testing.T) {
	t.Parallel()
	s := New(Config{MaxTrackedPrompts: 3})
	for i := range 10 {
		post(s, chatBody(fmt.Sprint(i)))
	}
	post(s, chatBody("0"))
	st := s.Stats()
	if len(st.PerPrompt) != 3 || st.UntrackedPrompts != 7 || st.Succeeded != 11 {
		t.Errorf("tracked %d prompts, untracked %d, succeeded %d; want 3, 7, 11", len(st.PerPrompt), st.UntrackedPrompts, st.Succeeded)
	}
	if got := st.PerPrompt["0"]; got != (PromptStats{Calls: 2, Succeeded: 2}) {
		t.Errorf("PerPrompt[0] = %+v, want 2 calls, 2 succeeded", got)
	}
}

func TestServeShutsDownOnContext(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()

	url := "http://" + ln.Addr().String()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("x")))
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status = %d", resp.StatusCode)
	}
	// A hanging request must not hold up the shutdown.
	hung := make(chan error, 1)
	go func() {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("[[timeout]]")))
		if err == nil {
			resp.Body.Close()
		}
		hung <- err
	}()
	waitFor(t, "the hanging request to arrive", func() bool { return s.Stats().InFlight == 1 })
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve = %v, want nil after ctx cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after ctx cancel")
	}
	<-hung
}

func TestListenAndServeReportsListenError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = New(Config{}).ListenAndServe(context.Background(), ln.Addr().String())
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("ListenAndServe on a taken port = %v, want an error naming the address", err)
	}
}

func BenchmarkCompletion(b *testing.B) {
	s := New(Config{Quota: 1 << 30})
	body := chatBody("为商品无线耳机写一段 50 字以内的营销文案")
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if rec := post(s, body); rec.Code != 200 {
				b.Fatalf("status %d", rec.Code)
			}
		}
	})
}

// TestAdmitMatchesNaiveWindow drives the ring through growth and wrap-around
// and compares every decision with a plain list of accept times.
func TestAdmitMatchesNaiveWindow(t *testing.T) {
	t.Parallel()
	const (
		quota  = 150
		window = 10 * time.Second
	)
	s := New(Config{Quota: quota, QuotaWindow: window})
	var naive []time.Time
	now := t0
	accepted, rejected := 0, 0
	rng := uint64(1)
	next := func(n uint64) uint64 { // xorshift: reproducible, no global state
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return rng % n
	}
	for i := range 5000 {
		// About 17 requests/s against a quota of 15/s: both outcomes occur.
		now = now.Add(time.Duration(next(120)) * time.Millisecond)
		kept := naive[:0]
		for _, at := range naive {
			if at.After(now.Add(-window)) {
				kept = append(kept, at)
			}
		}
		naive = kept
		wantOK := len(naive) < quota
		var wantWait time.Duration
		if wantOK {
			naive = append(naive, now)
		} else {
			wantWait = naive[0].Add(window).Sub(now)
		}
		if wantOK {
			accepted++
		} else {
			rejected++
		}
		gotWait, _, gotOK := s.admitLocked(now, int64(i), 0)
		if gotOK != wantOK || gotWait != wantWait {
			t.Fatalf("request %d at +%v: admit = (%v, %v), want (%v, %v)", i, now.Sub(t0), gotWait, gotOK, wantWait, wantOK)
		}
	}
	if accepted == 0 || rejected < 100 {
		t.Errorf("accepted %d, rejected %d: the run did not exercise both outcomes", accepted, rejected)
	}
	if len(s.window) > quota {
		t.Errorf("ring grew to %d entries, want at most Quota %d", len(s.window), quota)
	}
}

// TestStructuredAnswers: a json_schema request gets an object of that schema (its text quoting the row's prompt),
// InvalidRate breaks about that share of them so that the columns' check refuses exactly those, and the same seed
// breaks the same ones.
func TestStructuredAnswers(t *testing.T) {
	t.Parallel()
	cols := schema.Columns{
		{Name: "category", Type: schema.Enum, Values: []string{"a", "b"}, Required: true},
		{Name: "n", Type: schema.Integer}, {Name: "when", Type: schema.Date}, {Name: "tags", Type: schema.List},
		{Name: "ok", Type: schema.Boolean}, {Name: "summary", Type: schema.Text, Required: true},
	}
	format, _ := json.Marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "answer", "strict": true, "schema": cols.JSONSchema()}})
	run := func() (broken []int) {
		s := New(Config{InvalidRate: 0.05, Seed: 7})
		for i := range 1000 {
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"row %d"}],"response_format":%s}`, i, format)
			rec := post(s, body)
			var c completion
			if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil || rec.Code != 200 {
				t.Fatalf("row %d: %d %s", i, rec.Code, rec.Body)
			}
			norm, err := cols.Validate(c.Choices[0].Message.Content)
			if err != nil {
				broken = append(broken, i)
				continue
			}
			if !strings.Contains(norm, fmt.Sprintf("summary for: row %d", i)) {
				t.Fatalf("row %d: %s does not quote the prompt", i, norm)
			}
		}
		if st := s.Stats(); st.Broken != int64(len(broken)) || st.Structured != 1000 {
			t.Errorf("stats %+v, %d refused by the check", st, len(broken))
		}
		return broken
	}
	first := run()
	if len(first) < 30 || len(first) > 70 {
		t.Errorf("%d of 1000 answers broken at --invalid-rate 0.05", len(first))
	}
	if again := run(); !slices.Equal(first, again) {
		t.Error("the same seed broke other answers")
	}
	// A schema that is not one, and a refused json_schema.
	rec := post(New(Config{}), `{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"array"}}}}`)
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "Invalid schema") {
		t.Errorf("a bad schema: %d %s", rec.Code, rec.Body)
	}
	rec = post(New(Config{NoStructuredOutputs: true}), fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":%s}`, format))
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "'json_schema' is not supported") {
		t.Errorf("no structured outputs: %d %s", rec.Code, rec.Body)
	}
}

// TestPackedAnswers: a packed call (schema.PackPrompt, its schema in response_format) gets one item per row id,
// each the answer the row's prompt gets alone; InvalidRate breaks items (left out, given twice, or wrong) and
// counts them, and what SplitPacked finds wrong is exactly what was broken.
func TestPackedAnswers(t *testing.T) {
	t.Parallel()
	for _, cols := range []schema.Columns{nil, {{Name: "category", Type: schema.Enum, Values: []string{"a", "b"}, Required: true}, {Name: "summary", Type: schema.Text}}} {
		s := New(Config{InvalidRate: 0.2, Seed: 3})
		format, _ := json.Marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "answer", "strict": true, "schema": cols.PackedJSONSchema()}})
		undecided, calls := 0, 50
		for c := range calls {
			var items []schema.PackItem
			var ids []string
			for i := range 10 {
				id := strconv.Itoa(c*10 + i)
				items, ids = append(items, schema.PackItem{ID: id, Prompt: "row " + id}), append(ids, id)
			}
			prompt, _ := json.Marshal(schema.PackPrompt(items))
			rec := post(s, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%s}],"response_format":%s}`, prompt, format))
			var comp completion
			if err := json.Unmarshal(rec.Body.Bytes(), &comp); err != nil || rec.Code != 200 {
				t.Fatalf("call %d: %d %s", c, rec.Code, rec.Body)
			}
			outputs, problems, err := cols.SplitPacked(comp.Choices[0].Message.Content, ids)
			if err != nil {
				t.Fatalf("call %d: %v\n%s", c, err, comp.Choices[0].Message.Content)
			}
			undecided += len(problems)
			for id, out := range outputs {
				if !strings.Contains(out, "for: row "+id) {
					t.Errorf("item %s answered %s", id, out)
				}
			}
		}
		st := s.Stats()
		if st.Packed != int64(calls) || st.PackedItems != int64(calls*10) || st.BrokenItems != int64(undecided) {
			t.Errorf("columns %v: stats %+v, %d items undecided", cols.Names(), st, undecided)
		}
		if undecided < 60 || undecided > 140 {
			t.Errorf("columns %v: %d of 500 items broken at InvalidRate 0.2", cols.Names(), undecided)
		}
	}
}
