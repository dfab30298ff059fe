package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// TestCostShownInSummaryAndTasks: a run's summary shows the task's tokens
// and their estimated cost at the --prices table, and `batchgen tasks`
// shows the same tokens and cost.
func TestCostShownInSummaryAndTasks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 40, nil)
	prices := filepath.Join(dir, "prices.yaml")
	// Expensive enough that 40 short rows cost a visible amount.
	if err := os.WriteFile(prices, []byte("models:\n  sim-1: {input_per_mtok: 1000, output_per_mtok: 3000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "为{{商品名称}}写文案", "--sim-latency", "1ms", "--prices", prices)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	m := regexp.MustCompile(`tokens    (\d+) in \(0 cached\), (\d+) out  \(estimated cost \$([0-9.]+)\)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("summary has no tokens line:\n%s", r.stdout)
	}
	in64, _ := strconv.ParseInt(m[1], 10, 64)
	out64, _ := strconv.ParseInt(m[2], 10, 64)
	if in64 < 40 || out64 < 40 {
		t.Errorf("tokens %d in, %d out for 40 rows: want at least one each per row", in64, out64)
	}
	wantCost := fmt.Sprintf("%.4f", (float64(in64)*1000+float64(out64)*3000)/1e6)
	if m[3] != wantCost {
		t.Errorf("estimated cost $%s, want $%s from %d in and %d out", m[3], wantCost, in64, out64)
	}

	tasks := runBinary(t, context.Background(), "tasks", "--data", filepath.Join(dir, ".batchgen"), "--prices", prices)
	if tasks.code != 0 {
		t.Fatalf("tasks: exit %d, stderr:\n%s", tasks.code, tasks.stderr)
	}
	for _, want := range []string{"TOKENS", "COST", fmt.Sprintf("%d/%d", in64, out64), "$" + wantCost} {
		if !strings.Contains(tasks.stdout, want) {
			t.Errorf("tasks output lacks %q:\n%s", want, tasks.stdout)
		}
	}
	// Without --prices the built-in table prices the simulator at zero.
	tasks = runBinary(t, context.Background(), "tasks", "--data", filepath.Join(dir, ".batchgen"))
	if !strings.Contains(tasks.stdout, "$0.000000") {
		t.Errorf("tasks with the built-in prices lacks $0.000000:\n%s", tasks.stdout)
	}
	bad := runBinary(t, context.Background(), "tasks", "--data", filepath.Join(dir, ".batchgen"), "--prices", in)
	if bad.code != 2 || !strings.Contains(bad.stderr, "--prices") {
		t.Errorf("tasks --prices with a CSV: exit %d, stderr:\n%s", bad.code, bad.stderr)
	}
}

// TestCacheFlag: a second task over the same rows reuses the first one's
// outputs by default, gets fresh samples when it asks for variety
// (--temperature > 0), and reuses them anyway with --cache always.
func TestCacheFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 10, nil)
	run := func(extra ...string) result {
		t.Helper()
		r := runBinary(t, context.Background(), append([]string{"run", "--in", in, "--prompt", "为{{商品名称}}写文案", "--sim-latency", "1ms"}, extra...)...)
		if r.code != 0 {
			t.Fatalf("run %v: exit %d, stderr:\n%s", extra, r.code, r.stderr)
		}
		return r
	}
	// Each run is a new task (another batch size); the cache outlives tasks.
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"--batch-size", "10", "--temperature", "0.8"}, "requests  10 this run"},
		{[]string{"--batch-size", "9", "--temperature", "0.8"}, "requests  10 this run"},
		{[]string{"--batch-size", "8", "--temperature", "0.8", "--cache", "always"}, "requests  0 this run"},
		{[]string{"--batch-size", "7", "--temperature", "0"}, "requests  10 this run"},
		{[]string{"--batch-size", "6", "--temperature", "0"}, "requests  0 this run"},
		{[]string{"--batch-size", "5", "--temperature", "0", "--no-cache"}, "requests  10 this run"},
	}
	for _, st := range steps {
		if r := run(st.args...); !strings.Contains(r.stdout, st.want) {
			t.Errorf("run %v: summary lacks %q:\n%s", st.args, st.want, r.stdout)
		}
	}
	for _, bad := range [][]string{{"--cache", "sometimes"}, {"--no-cache", "--cache", "always"}} {
		r := runBinary(t, context.Background(), append([]string{"run", "--in", in, "--prompt", "{{sku}}"}, bad...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "--cache") {
			t.Errorf("run %v: exit %d, stderr %q; want 2 naming --cache", bad, r.code, r.stderr)
		}
	}
}

// TestCacheTTLFlag: outputs cached under --cache-ttl 1ms are not reused by
// the next run, which caches them again for the default 30 days, so the
// run after it reuses them; a bad TTL is rejected naming the flag.
func TestCacheTTLFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 10, nil)
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"--batch-size", "10", "--cache-ttl", "1ms"}, "requests  10 this run"},
		{[]string{"--batch-size", "9"}, "requests  10 this run"},
		{[]string{"--batch-size", "8", "--cache-ttl", "1d"}, "requests  0 this run"},
	}
	for _, st := range steps {
		r := runBinary(t, context.Background(), append([]string{"run", "--in", in, "--prompt", "为{{商品名称}}写文案", "--sim-latency", "1ms"}, st.args...)...)
		if r.code != 0 {
			t.Fatalf("run %v: exit %d, stderr:\n%s", st.args, r.code, r.stderr)
		}
		if !strings.Contains(r.stdout, st.want) {
			t.Errorf("run %v: summary lacks %q:\n%s", st.args, st.want, r.stdout)
		}
	}
	for _, bad := range []string{"0d", "soon", "-1h"} {
		r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}}", "--cache-ttl", bad)
		if r.code != 2 || !strings.Contains(r.stderr, "--cache-ttl") || !strings.Contains(r.stderr, bad) {
			t.Errorf("run --cache-ttl %s: exit %d, stderr %q; want 2 naming --cache-ttl and the value", bad, r.code, r.stderr)
		}
	}
}

// TestServeShowsCost: the task status API of batchgen serve shows a task's
// tokens and their cost at the --prices table.
func TestServeShowsCost(t *testing.T) {
	t.Parallel()
	mock := httptest.NewServer(mockserver.New(mockserver.Config{Latency: time.Millisecond}))
	t.Cleanup(mock.Close)
	data := t.TempDir()
	prices := filepath.Join(t.TempDir(), "prices.yaml")
	if err := os.WriteFile(prices, []byte("models:\n  gpt-4o-mini: {input_per_mtok: 1000, output_per_mtok: 2000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startServe(t, data, mock, "--prompt", "Copy for {{name}}", "--prices", prices)
	dropCSV(t, data, "priced.csv", rowsCSV(6, "priced"))
	waitFor(t, "the result of priced.csv", func() bool { return exists(filepath.Join(data, "results", "priced.result.xlsx")) })
	tasks := srv.tasks()
	if len(tasks) != 1 {
		t.Fatalf("tasks = %+v, want one", tasks)
	}
	var view struct {
		InputTokens   int64    `json:"input_tokens"`
		OutputTokens  int64    `json:"output_tokens"`
		EstimatedCost *float64 `json:"estimated_cost"`
	}
	if code := srv.getJSON("/api/tasks/"+tasks[0].TaskID, &view); code != http.StatusOK {
		t.Fatalf("GET task: %d", code)
	}
	if view.InputTokens <= 0 || view.OutputTokens <= 0 || view.EstimatedCost == nil {
		t.Fatalf("task view %+v: want tokens and an estimated cost", view)
	}
	want := (float64(view.InputTokens)*1000 + float64(view.OutputTokens)*2000) / 1e6
	if math.Abs(*view.EstimatedCost-want) > 1e-9 {
		t.Errorf("estimated_cost %v, want %v from %d in and %d out at the --prices table", *view.EstimatedCost, want, view.InputTokens, view.OutputTokens)
	}
}

// routedProviders is a providers file routing over two simulators of very
// different prices, by weight, so both answer rows.
const routedProviders = `routing: weighted
providers:
  - {name: dear, kind: sim, latency: 1ms, weight: 1, price: {input_per_mtok: 1000, output_per_mtok: 3000}}
  - {name: cheap, kind: sim, latency: 1ms, weight: 1, price: {input_per_mtok: 10, output_per_mtok: 20}}
`

// routedPrices are routedProviders' prices by entry name.
var routedPrices = map[string]pricing.Price{"dear": {InputPerMTok: 1000, OutputPerMTok: 3000}, "cheap": {InputPerMTok: 10, OutputPerMTok: 20}}

// routedCost reads a routed task's result workbook back, sums each row's
// tokens per provider that answered (its provider and token columns), and
// returns the exact cost: each provider's tokens at its own price. It fails
// the test unless both providers answered.
func routedCost(t *testing.T, result string) pricing.Estimate {
	t.Helper()
	out := readResult(t, result)
	col := map[string]int{}
	for i, h := range out[0] {
		col[h] = i
	}
	usage := map[string]store.Usage{}
	for i, row := range out[1:] {
		p := row[col["provider"]]
		if _, ok := routedPrices[p]; !ok {
			t.Fatalf("row %d answered by %q, want dear or cheap", i+1, p)
		}
		in64, err1 := strconv.ParseInt(row[col["input_tokens"]], 10, 64)
		out64, err2 := strconv.ParseInt(row[col["output_tokens"]], 10, 64)
		if err1 != nil || err2 != nil || in64 == 0 || out64 == 0 {
			t.Fatalf("row %d tokens %q/%q: want counts", i+1, row[col["input_tokens"]], row[col["output_tokens"]])
		}
		usage[p] = usage[p].Add(store.Usage{InputTokens: in64, OutputTokens: out64})
	}
	if len(usage) != 2 {
		t.Fatalf("rows answered by %v: want both providers used", usage)
	}
	exact := pricing.Estimate{Known: true, Cost: routedPrices["dear"].Cost(usage["dear"]) + routedPrices["cheap"].Cost(usage["cheap"])}
	// At one provider's price the cost would be another: the check that
	// readers price per provider can fail.
	all := usage["dear"].Add(usage["cheap"])
	for name, p := range routedPrices {
		if one := (pricing.Estimate{Known: true, Cost: p.Cost(all)}); one.String() == exact.String() {
			t.Fatalf("all tokens at %s's price cost %s, the same as per provider: the test cannot tell them apart", name, one)
		}
	}
	return exact
}

// TestCostPerProvider: a task routed over two providers of different
// prices costs each provider's tokens at its own price (read back per row
// from the result's provider and token columns), not all of them at one,
// in the run summary, `batchgen status` and `batchgen tasks`.
func TestCostPerProvider(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	providers := writeFile(t, filepath.Join(dir, "providers.yaml"), routedProviders)
	in := productsCSV(t, dir, 60, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "为{{商品名称}}写文案", "--providers", providers, "--batch-size", "10")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	want := routedCost(t, filepath.Join(dir, "skus.result.xlsx"))
	if !strings.Contains(r.stdout, "(estimated cost "+want.String()+")") {
		t.Errorf("summary lacks the per-provider cost %s:\n%s", want, r.stdout)
	}

	// batchgen status prices the same way.
	m := regexp.MustCompile(`task\s+(\S+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("summary names no task:\n%s", r.stdout)
	}
	st := runBinary(t, context.Background(), "status", m[1], "--data", filepath.Join(dir, ".batchgen"), "--providers", providers)
	if st.code != 0 {
		t.Fatalf("status: exit %d, stderr:\n%s", st.code, st.stderr)
	}
	if !strings.Contains(st.stdout, "(estimated cost "+want.String()+")") {
		t.Errorf("status lacks the per-provider cost %s:\n%s", want, st.stdout)
	}

	// batchgen tasks too, from the task's own per-provider sums.
	tasks := runBinary(t, context.Background(), "tasks", "--data", filepath.Join(dir, ".batchgen"), "--providers", providers)
	if tasks.code != 0 {
		t.Fatalf("tasks: exit %d, stderr:\n%s", tasks.code, tasks.stderr)
	}
	if line := taskLineOf(tasks.stdout, m[1]); !strings.Contains(line, " "+want.String()+" ") {
		t.Errorf("tasks line of %s lacks the per-provider cost %s:\n%s", m[1], want, tasks.stdout)
	}
	// Without the providers file nothing prices "dear" and "cheap": the
	// cost is unknown, not the simulator's free price for every token.
	tasks = runBinary(t, context.Background(), "tasks", "--data", filepath.Join(dir, ".batchgen"))
	if line := taskLineOf(tasks.stdout, m[1]); !strings.Contains(line, " unknown ") {
		t.Errorf("tasks line of %s without --providers: want cost unknown:\n%s", m[1], tasks.stdout)
	}
	bad := runBinary(t, context.Background(), "tasks", "--data", filepath.Join(dir, ".batchgen"), "--providers", filepath.Join(dir, "missing.yaml"))
	if bad.code != 2 || !strings.Contains(bad.stderr, "--providers") {
		t.Errorf("tasks --providers with a missing file: exit %d, stderr:\n%s", bad.code, bad.stderr)
	}
}

// taskLineOf returns the line of `batchgen tasks` output that lists task
// id, or "".
func taskLineOf(out, id string) string {
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, id+" ") {
			return line
		}
	}
	return ""
}

// TestServeCostPerProvider: GET /api/tasks/{id} and the task list of a
// server routing over two providers of different prices show a task's
// exact cost, each provider's tokens at its own price.
func TestServeCostPerProvider(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	providers := writeFile(t, filepath.Join(t.TempDir(), "providers.yaml"), routedProviders)
	srv := startServeWith(t, data, nil, "--providers", providers, "--prompt", "Copy for {{name}}")
	dropCSV(t, data, "routed.csv", rowsCSV(40, "routed"))
	result := filepath.Join(data, "results", "routed.result.xlsx")
	waitFor(t, "the result of routed.csv", func() bool { return exists(result) })
	want := routedCost(t, result)
	tasks := srv.tasks()
	if len(tasks) != 1 {
		t.Fatalf("tasks = %+v, want one", tasks)
	}
	var view struct {
		EstimatedCost *float64 `json:"estimated_cost"`
	}
	if code := srv.getJSON("/api/tasks/"+tasks[0].TaskID, &view); code != http.StatusOK {
		t.Fatalf("GET task: %d", code)
	}
	if view.EstimatedCost == nil || math.Abs(*view.EstimatedCost-want.Cost) > 1e-9 {
		t.Errorf("estimated_cost %v, want %v: each provider's tokens at its own price", view.EstimatedCost, want.Cost)
	}
	var list struct {
		Tasks []struct {
			EstimatedCost *float64 `json:"estimated_cost"`
		} `json:"tasks"`
	}
	if code := srv.getJSON("/api/tasks", &list); code != http.StatusOK || len(list.Tasks) != 1 {
		t.Fatalf("GET /api/tasks: %d, %d tasks", code, len(list.Tasks))
	}
	if got := list.Tasks[0].EstimatedCost; got == nil || math.Abs(*got-want.Cost) > 1e-9 {
		t.Errorf("listed estimated_cost %v, want %v", got, want.Cost)
	}
}
