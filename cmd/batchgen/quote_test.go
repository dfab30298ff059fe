package main

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// TestQuote quotes a 300-row job against a real mock-llm server (priced
// by a --prices table), then runs it: the quote answers its sample of 20
// and says 280 rows are left; the run pays for those 280 only (the
// server's paid log: every prompt once); and the quote's cost, the
// sample's plus the rows left, lies within 15% of what the run reports.
func TestQuote(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := startMockLLM(t, dir, "m", "--latency", "5ms")
	prices := writeFile(t, filepath.Join(dir, "prices.yaml"), "models:\n  mock-1: {input_per_mtok: 1000, output_per_mtok: 1000}\n")
	const rows = 300
	in := productsCSV(t, dir, rows, func(i int) string { return strings.Repeat("，经典款", i%7) })
	args := []string{"--in", in, "--prompt", "{{sku}} {{商品名称}}", "--prices", prices, "--provider", "mock", "--base-url", m.baseURL, "--rpm", "6000"}

	q := runBinary(t, context.Background(), append([]string{"quote"}, args...)...)
	if q.code != 0 {
		t.Fatalf("quote: exit %d; stderr:\n%s", q.code, q.stderr)
	}
	t.Logf("quote:\n%s", q.stdout)
	if !strings.Contains(q.stdout, "rows      300: 280 left to run; measured on 20 answered") {
		t.Errorf("quote does not say its sample of 20 left 280 rows:\n%s", q.stdout)
	}
	quoted := moneyIn(t, `they cost \$([0-9.]+)`, q.stdout) + moneyIn(t, `online +\$([0-9.]+)`, q.stdout)
	if paid := paid(t, m); len(paid) != 20 {
		t.Errorf("the quote paid for %d prompts, want its sample of 20", len(paid))
	}

	r := runBinary(t, context.Background(), append([]string{"run"}, args...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "requests  280 this run") {
		t.Errorf("the run after the quote should make the 280 calls left:\n%s", r.stdout)
	}
	for prompt, n := range paid(t, m) {
		if n != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n)
		}
	}
	actual := moneyIn(t, `estimated cost \$([0-9.]+)`, r.stdout)
	t.Logf("quoted $%.4f, the run reports $%.4f", quoted, actual)
	if math.Abs(quoted-actual) > 0.15*actual {
		t.Errorf("quoted $%.4f, the run cost $%.4f: more than 15%% apart", quoted, actual)
	}
}
