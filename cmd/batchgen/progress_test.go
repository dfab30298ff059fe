package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestRunFinalLineAndRateLimitsApart: a job that draws 429s and 5xx ends
// its progress with a 100% line, and the summary counts the 429s as rate
// limits, apart from the errors.
func TestRunFinalLineAndRateLimitsApart(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{Latency: time.Millisecond, FailRate: 0.1, Seed: 11, Quota: 30, QuotaWindow: time.Second, NoRateLimitHeaders: true})
	srv := httptest.NewServer(mock)
	defer srv.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 80, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{商品名称}}", "--provider", "openai", "--base-url", srv.URL+"/v1",
		"--batch-size", "20", "--concurrency", "8", "--retry-delays", "50ms", "--progress-interval", "1h")
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	st := mock.Stats()
	if st.RateLimited == 0 || st.ServerErrors == 0 {
		t.Fatalf("the job drew no 429 or no 5xx (%+v); the test proves nothing", st)
	}
	final := regexp.MustCompile(`(?m)^batchgen: 80/80 rows \(100%\), 0 failed, [0-9.]+ rows/s avg, took \S+$`)
	if !final.MatchString(r.stderr) {
		t.Errorf("no final 100%% line in stderr:\n%s", r.stderr)
	}
	want := fmt.Sprintf("requests  %d this run  (rate limited %d, errors %d)", st.Requests, st.RateLimited, st.ServerErrors)
	if !strings.Contains(r.stdout, want) {
		t.Errorf("summary lacks %q:\n%s", want, r.stdout)
	}
}

// TestProgressNamesTheProvidersFileQuota: the progress line reads the quota
// from the providers, wherever they were given: a providers file's rpm
// shows as the quota waited for, not as one learnt from the provider (the
// line used to read --rpm alone).
func TestProgressNamesTheProvidersFileQuota(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 12, nil)
	providers := writeFile(t, filepath.Join(dir, "providers.yaml"), `providers:
  - {name: paced, kind: sim, rpm: 240, concurrency: 4, latency: 5ms, jitter: 1ms}
`)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{商品名称}}", "--providers", providers,
		"--batch-size", "4", "--progress-interval", "10ms")
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "rate-limited: waiting for the quota (240 requests/min)") {
		t.Errorf("no progress line names the file's quota of 240 requests/min; stderr:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, "learnt from the provider") {
		t.Errorf("a progress line calls the file's quota learnt; stderr:\n%s", r.stderr)
	}
}
