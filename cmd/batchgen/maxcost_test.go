package main

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestMaxCost runs a job against a real mock-llm server, priced at $1,000
// a million tokens, with --max-cost $0.50: the job stops before its calls
// pass the cap (exit 3, saying why), the result marks the rows it did not
// start, and what the answered rows cost (their tokens in the result, at
// the price) stays under the cap. `retry --max-cost` with a higher cap
// runs the rest, and no row is paid twice (the server's paid log).
func TestMaxCost(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := startMockLLM(t, dir, "m", "--latency", "5ms")
	prices := writeFile(t, filepath.Join(dir, "prices.yaml"), "models:\n  mock-1: {input_per_mtok: 1000, output_per_mtok: 1000}\n")
	const rows = 120
	in := productsCSV(t, dir, rows, nil)
	args := []string{"--prices", prices, "--provider", "mock", "--base-url", m.baseURL, "--max-tokens", "50", "--concurrency", "4", "--quiet"}

	r := runBinary(t, context.Background(), append([]string{"run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--max-cost", "0.5"}, args...)...)
	if r.code != 3 || !strings.Contains(r.stderr, "max cost $0.5000 reached") {
		t.Fatalf("exit %d, want 3 and the cap named; stderr:\n%s", r.code, r.stderr)
	}
	out := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	col := map[string]int{}
	for i, h := range out[0] {
		col[h] = i
	}
	cost, answered, notStarted := 0.0, 0, 0
	for _, row := range out[1:] {
		cell := func(name string) string {
			if i, ok := col[name]; ok && i < len(row) {
				return row[i]
			}
			return ""
		}
		in, _ := strconv.Atoi(cell("input_tokens"))
		outTok, _ := strconv.Atoi(cell("output_tokens"))
		cost += float64(in+outTok) * 1000 / 1e6
		switch cell("status") {
		case "succeeded":
			answered++
		case "not_started":
			notStarted++
		}
	}
	t.Logf("stopped at $%.4f: %d rows answered, %d not started", cost, answered, notStarted)
	if cost > 0.5 {
		t.Errorf("the answered rows cost $%.4f, past the cap of $0.50", cost)
	}
	if answered == 0 || notStarted == 0 || answered+notStarted != rows {
		t.Errorf("%d answered and %d not started of %d rows: want the cap to stop the job midway", answered, notStarted, rows)
	}
	id := taskIDFrom(t, r.stdout)

	r = runBinary(t, context.Background(), append([]string{"retry", id, "--data", filepath.Join(dir, ".batchgen"), "--max-cost", "100"}, args...)...)
	if r.code != 0 {
		t.Fatalf("retry with a higher cap: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	for _, row := range readResult(t, filepath.Join(dir, "skus.result.xlsx"))[1:] {
		if row[col["status"]] != "succeeded" {
			t.Errorf("after the retry: row %q", row)
		}
	}
	counts := paid(t, m)
	if len(counts) != rows {
		t.Errorf("%d prompts paid, want %d", len(counts), rows)
	}
	for prompt, n := range counts {
		if n != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n)
		}
	}
}
