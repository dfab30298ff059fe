package main

import (
	"context"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files")

// statusVolatile are the parts of `batchgen status` that differ between
// runs: the task id, the elapsed time and the rate.
var statusVolatile = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`\b[0-9a-f]{20}\b`), "TASK"},
	{regexp.MustCompile(`in [0-9.]+(ms|s|m[0-9.]*s?)  \([0-9.]+ rows/s\)`), "in ELAPSED  (RATE rows/s)"},
}

func normalizeStatus(s string) string {
	for _, v := range statusVolatile {
		s = v.re.ReplaceAllString(s, v.repl)
	}
	return strings.TrimSpace(s) + "\n"
}

// statusJob runs a 30-row job against the mock server in which three rows
// are refused by the content filter and one times out until its retries
// are spent, and returns its data directory and task id.
func statusJob(t *testing.T) (dir, task string) {
	t.Helper()
	srv := httptest.NewServer(mockserver.New(mockserver.Config{Latency: time.Millisecond}))
	t.Cleanup(srv.Close)
	dir = t.TempDir()
	var csv strings.Builder
	csv.WriteString("sku,name\n")
	for i := 1; i <= 30; i++ {
		m := ""
		switch {
		case i%10 == 0:
			m = " [[filter]]"
		case i == 7:
			m = " [[timeout]]"
		}
		fmt.Fprintf(&csv, "SKU-%d,item %d%s\n", i, i, m)
	}
	in := writeFile(t, filepath.Join(dir, "skus.csv"), csv.String())
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "Copy for {{name}}", "--provider", "openai", "--base-url", srv.URL+"/v1",
		"--model", "gpt-4o-mini", "--call-timeout", "300ms", "--calls-per-round", "1", "--rounds", "2", "--retry-delays", "10ms", "--batch-size", "10", "--quiet")
	if r.code != 3 {
		t.Fatalf("run: exit %d, want 3; stderr:\n%s", r.code, r.stderr)
	}
	return filepath.Join(dir, ".batchgen"), taskIDFrom(t, r.stdout)
}

// TestStatusGolden: `batchgen status` of a job with failures shows the
// counts, the rate, the failures by class with the last errors, the
// provider that answered, the tokens and cost, and what to do next; the
// README shows the same output (its volatile parts aside), so it stays
// true.
func TestStatusGolden(t *testing.T) {
	t.Parallel()
	dir, task := statusJob(t)
	r := runBinary(t, context.Background(), "status", task, "--data", dir)
	if r.code != 0 {
		t.Fatalf("status: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	got := normalizeStatus(r.stdout)
	golden := filepath.Join("testdata", "status.golden")
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("status output (-golden +got):\n%s\nraw:\n%s", diff, r.stdout)
	}

	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block, ok := readmeBlockAfter(string(readme), "batchgen status TASK --data .batchgen")
	if !ok {
		t.Fatal("README.md has no output block after `batchgen status TASK --data .batchgen`")
	}
	if diff := cmp.Diff(string(want), normalizeStatus(block)); diff != "" {
		t.Errorf("README's status output differs from the real one (-real +README):\n%s", diff)
	}

	if r := runBinary(t, context.Background(), "status", "0123456789abcdef0123", "--data", dir); r.code != 2 || !strings.Contains(r.stderr, "no task 0123456789abcdef0123") {
		t.Errorf("status of an unknown task: exit %d, stderr %q; want 2 naming the task", r.code, r.stderr)
	}
}

// readmeBlockAfter returns the fenced block that follows the fenced
// block holding the line cmd.
func readmeBlockAfter(readme, cmd string) (string, bool) {
	lines := strings.Split(readme, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != cmd {
			continue
		}
		j := i + 1
		for j < len(lines) && !strings.HasPrefix(lines[j], "```") {
			j++
		}
		j++ // past the closing fence
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j >= len(lines) || !strings.HasPrefix(lines[j], "```") {
			return "", false
		}
		var b strings.Builder
		for k := j + 1; k < len(lines) && !strings.HasPrefix(lines[k], "```"); k++ {
			b.WriteString(lines[k] + "\n")
		}
		return b.String(), true
	}
	return "", false
}

// TestTasksFilters: --state and --since pick the tasks shown.
func TestTasksFilters(t *testing.T) {
	t.Parallel()
	dir, task := statusJob(t)
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--state", "partial"}, true},
		{[]string{"--state", "succeeded,failed"}, false},
		{[]string{"--since", "1h"}, true},
		{[]string{"--since", time.Now().Add(time.Hour).Format(time.RFC3339)}, false},
	} {
		r := runBinary(t, context.Background(), append([]string{"tasks", "--data", dir}, tc.args...)...)
		if r.code != 0 {
			t.Fatalf("tasks %v: exit %d; stderr:\n%s", tc.args, r.code, r.stderr)
		}
		if got := strings.Contains(r.stdout, task); got != tc.want {
			t.Errorf("tasks %v lists the task: %v, want %v\n%s", tc.args, got, tc.want, r.stdout)
		}
	}
}
