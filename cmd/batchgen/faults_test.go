package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestProviderFaultStorm runs a job through every provider fault at once
// over real HTTP: random 5xx, a quota that answers 429 with Retry-After,
// flaky rows, connection resets, hung calls, content-filter 400s. Each row
// ends with the right outcome and no row is paid for twice.
func TestProviderFaultStorm(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{
		Latency: 5 * time.Millisecond, FailRate: 0.25, Seed: 3,
		Quota: 25, QuotaWindow: time.Second, FlakyFailures: 2,
		// Without rate-limit headers the limiter learns the quota from
		// 429s, so the storm has some (with them it would avoid them).
		NoRateLimitHeaders: true,
	})
	srv := httptest.NewServer(mock)
	defer srv.Close()
	dir := t.TempDir()
	marker := func(i int) string {
		switch {
		case i%23 == 0:
			return " [[filter]]"
		case i%29 == 0:
			return " [[timeout]]"
		case i%7 == 0:
			return " [[flaky]]"
		case i%11 == 0:
			return " [[reset]]"
		}
		return ""
	}
	const rows = 120
	in := productsCSV(t, dir, rows, marker)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--provider", "openai", "--base-url", srv.URL+"/v1",
		"--concurrency", "8", "--batch-size", "20", "--call-timeout", "1s", "--calls-per-round", "3", "--rounds", "2", "--retry-delays", "50ms", "--quiet")
	if r.code != 3 {
		t.Fatalf("exit %d, want 3 (some rows fail); stderr:\n%s", r.code, r.stderr)
	}
	out := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	if len(out) != rows+1 {
		t.Fatalf("%d result rows, want %d", len(out)-1, rows)
	}
	for i, row := range out[1:] {
		n := i + 1
		want, class := "succeeded", ""
		switch m := marker(n); {
		case strings.Contains(m, "filter"):
			want, class = "failed", "content_filter"
		case strings.Contains(m, "timeout"):
			want, class = "failed", "retry_exhausted"
		}
		if row[0] != fmt.Sprintf("SKU-%05d", n) || row[3] != want || row[5] != class {
			t.Errorf("row %d = %q, want %s %s", n, row, want, class)
		}
	}
	st := mock.Stats()
	for p, s := range st.PerPrompt {
		if s.Succeeded > 1 {
			t.Errorf("prompt %q paid %d times", p, s.Succeeded)
		}
	}
	if st.RateLimited == 0 || st.ServerErrors == 0 || st.Resets == 0 || st.Canceled == 0 {
		t.Errorf("the storm lacked a fault kind: %+v", st)
	}
	t.Logf("model saw %d requests: %d 429, %d 5xx, %d resets, %d timeouts, %d filtered", st.Requests, st.RateLimited, st.ServerErrors, st.Resets, st.Canceled, st.Filtered)
}

// TestInsufficientQuotaStopsCalling: once the provider says the account is
// out of quota (billing), the job stops calling it and fails the remaining
// rows fast with that class, instead of burning through the sheet.
func TestInsufficientQuotaStopsCalling(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{Latency: 2 * time.Millisecond, QuotaMarker: "SKU-00010"})
	srv := httptest.NewServer(mock)
	defer srv.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 300, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}}", "--provider", "openai", "--base-url", srv.URL+"/v1",
		"--concurrency", "1", "--batch-size", "50", "--quiet")
	if r.code != 3 {
		t.Fatalf("exit %d, want 3; stderr:\n%s", r.code, r.stderr)
	}
	st := mock.Stats()
	// Batches run side by side (pipeline.BatchesInFlight), one call at a
	// time taking turns in no fixed order, so some rows of each may be sent
	// before row 10's answer arrives; after it, with one call at a time,
	// none.
	if st.QuotaExhausted != 1 || st.AfterQuota != 0 {
		t.Errorf("%d insufficient_quota answers, then %d more requests (of %d); the job should stop calling after the first (row 10)", st.QuotaExhausted, st.AfterQuota, st.Requests)
	}
	failed := 0
	for _, row := range readResult(t, filepath.Join(dir, "skus.result.xlsx"))[1:] {
		if row[3] == "failed" {
			failed++
			if row[5] != "insufficient_quota" {
				t.Errorf("row %q failed with %q, want insufficient_quota", row[0], row[5])
			}
		}
	}
	if succeeded := 300 - failed; int64(succeeded) != st.Succeeded || int64(failed) != 300-(st.Requests-1) {
		t.Errorf("%d rows failed and %d succeeded for %d paid calls; want every row after the quota error failed fast", failed, succeeded, st.Succeeded)
	}
}
