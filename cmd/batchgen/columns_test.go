package main

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestRetryInvalidOutput: rows whose answers never fitted the declared columns end invalid_output (exit 3, the
// last answer kept), and `retry --error-class invalid_output` against a server that answers right reruns exactly
// those rows into typed cells.
func TestRetryInvalidOutput(t *testing.T) {
	t.Parallel()
	broken := mockserver.New(mockserver.Config{InvalidRate: 0.5, Seed: 11})
	first := httptest.NewServer(broken)
	defer first.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 30, nil)
	cols := "score:number!, giftable:boolean!, summary:text"
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--columns", cols,
		"--calls-per-round", "1", "--provider", "openai", "--base-url", first.URL+"/v1")
	if r.code != 3 || !strings.Contains(r.stdout, "failures  invalid_output ") {
		t.Fatalf("first run: exit %d, want 3 with invalid_output rows; stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	failed := int(broken.Stats().Broken)
	id := taskIDFrom(t, r.stdout)
	rows := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	class, errCol := slices.Index(rows[0], "error_class"), slices.Index(rows[0], "error")
	invalid := 0
	for _, row := range rows[1:] {
		if row[class] == "invalid_output" {
			invalid++
			if !strings.Contains(row[errCol], `{"broken":true}`) {
				t.Errorf("an invalid_output row does not keep its last answer: %q", row[errCol])
			}
		}
	}
	if invalid != failed || invalid == 0 {
		t.Fatalf("%d rows invalid_output, the mock broke %d answers", invalid, failed)
	}

	healed := mockserver.New(mockserver.Config{})
	second := httptest.NewServer(healed)
	defer second.Close()
	out := filepath.Join(dir, "retried.xlsx")
	r = runBinary(t, context.Background(), "retry", id, "--data", filepath.Join(dir, ".batchgen"), "--out", out, "--error-class", "invalid_output",
		"--provider", "openai", "--base-url", second.URL+"/v1")
	if r.code != 0 {
		t.Fatalf("retry: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if st := healed.Stats(); int(st.Succeeded) != invalid {
		t.Errorf("retry called the model %d times, want %d (the invalid_output rows)", st.Succeeded, invalid)
	}
	rows = readResult(t, out)
	status, score := slices.Index(rows[0], "status"), slices.Index(rows[0], "score")
	for i, row := range rows[1:] {
		if row[status] != "succeeded" || row[score] == "" {
			t.Errorf("row %d after retry: %q", i+2, row)
		}
	}
}

// TestRunSaysJSONMode: a server without structured outputs is asked in JSON mode, and the run's summary says so.
func TestRunSaysJSONMode(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(mockserver.New(mockserver.Config{NoStructuredOutputs: true}))
	defer srv.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 5, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}}", "--columns", "score:number!",
		"--provider", "openai", "--base-url", srv.URL+"/v1")
	if r.code != 0 || !strings.Contains(r.stdout, "note      provider openai") || !strings.Contains(r.stdout, "refused structured outputs") {
		t.Errorf("exit %d; stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}
