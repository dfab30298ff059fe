package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestRunLearnsUnknownQuota runs a job with no --rpm over real HTTP against
// the mock provider (600 requests a minute, enforced over 5 s windows so it
// binds within the job, yet long beside the jitter of a loaded machine), with
// and without rate-limit headers: every row succeeds and is paid once, few
// calls are answered 429, and all of those come while the quota is being
// learned (the first half of the calls: the job's first window goes out
// unpaced), none after. Anthropic's headers (anthropic-ratelimit-*, reset
// as a time) teach the limiter as OpenAI's do.
func TestRunLearnsUnknownQuota(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		provider  string // openai when empty
		noHeaders bool
		max429    int
		maxLate   int // 429s allowed in the second half of the calls
	}{
		{name: "from headers", max429: 2},
		{name: "from Anthropic's headers", provider: "anthropic", max429: 2},
		// The first window goes out unpaced: the calls in flight when it
		// fills (8) are answered 429 before the first one is back. A
		// ceiling learned from 429s alone is probed upward after 20 s of
		// demand (the quota may have been raised), and a probe past the
		// quota draws one 429 by design: a job slowed past 20 s by a busy
		// machine may see one late.
		{name: "from 429s alone", noHeaders: true, max429: 10, maxLate: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mock := mockserver.New(mockserver.Config{
				Latency: 50 * time.Millisecond, Quota: 50, QuotaWindow: 5 * time.Second, NoRateLimitHeaders: tc.noHeaders,
			})
			// Record the order of answers: which calls got 429.
			var mu sync.Mutex
			var statuses []int
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
				mock.ServeHTTP(rec, r)
				if r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/messages" {
					mu.Lock()
					statuses = append(statuses, rec.status)
					mu.Unlock()
				}
			}))
			defer srv.Close()
			dir := t.TempDir()
			const rows = 200
			in := productsCSV(t, dir, rows, func(int) string { return "" })
			provider, baseURL := "openai", srv.URL+"/v1"
			if tc.provider == "anthropic" {
				provider, baseURL = "anthropic", srv.URL // the API root, without /v1
			}
			r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--provider", provider,
				"--base-url", baseURL, "--concurrency", "8", "--batch-size", "25", "--quiet")
			if r.code != 0 {
				t.Fatalf("exit %d, want 0; stderr:\n%s", r.code, r.stderr)
			}
			out := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
			for i, row := range out[1:] {
				if row[3] != "succeeded" {
					t.Errorf("row %d = %q, want succeeded", i+1, row)
				}
			}
			st := mock.Stats()
			for p, s := range st.PerPrompt {
				if s.Succeeded != 1 {
					t.Errorf("prompt %q paid %d times, want once", p, s.Succeeded)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			var late []int
			limited := 0
			for i, s := range statuses {
				if s == http.StatusTooManyRequests {
					limited++
					if i >= len(statuses)/2 {
						late = append(late, i)
					}
				}
			}
			t.Logf("%d calls, %d answered 429", len(statuses), limited)
			if limited > tc.max429 {
				t.Errorf("%d of %d calls answered 429, want at most %d", limited, len(statuses), tc.max429)
			}
			if len(late) > tc.maxLate {
				t.Errorf("calls %v (of %d) answered 429 after the first half: the limiter did not settle on the quota", late, len(statuses))
			}
		})
	}
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}
