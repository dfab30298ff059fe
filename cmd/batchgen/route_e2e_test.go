package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// mockLLM is a `batchgen mock-llm` process.
type mockLLM struct {
	cmd     *exec.Cmd
	baseURL string
	paidLog string
}

// startMockLLM starts `batchgen mock-llm` with args on a free port, its
// paid calls logged to a file that survives a kill.
func startMockLLM(t *testing.T, dir, name string, args ...string) *mockLLM {
	t.Helper()
	m := &mockLLM{paidLog: filepath.Join(dir, name+".paid")}
	m.cmd = exec.Command(binary, append([]string{"mock-llm", "--addr", "127.0.0.1:0", "--paid-log", m.paidLog}, args...)...)
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.cmd.Process.Kill(); _ = m.cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("mock-llm %s did not start: %v", name, err)
	}
	f := strings.Fields(line) // mock-llm listening on http://ADDR/v1 (Anthropic's root: ...)
	if len(f) < 4 || !strings.HasSuffix(f[3], "/v1") {
		t.Fatalf("mock-llm %s said %q", name, line)
	}
	m.baseURL = f[3]
	return m
}

// stats reads the server's counters over HTTP.
func (m *mockLLM) stats(t *testing.T) mockserver.Stats {
	t.Helper()
	resp, err := http.Get(strings.TrimSuffix(m.baseURL, "/v1") + "/stats?summary=1")
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	defer resp.Body.Close()
	var st mockserver.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("stats: %v", err)
	}
	return st
}

// paid counts the completions each prompt was paid for, from the paid logs
// of all servers (killed ones included).
func paid(t *testing.T, servers ...*mockLLM) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, m := range servers {
		b, err := os.ReadFile(m.paidLog)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		calls, err := mockserver.ParsePaidLog(b)
		if err != nil {
			t.Fatalf("paid log %s: %v", m.paidLog, err)
		}
		for prompt, p := range calls {
			n[prompt] += p.Calls()
		}
	}
	return n
}

// checkRouted checks a routed job's result: every row succeeded, answered
// by one of names (the provider column), and paid exactly once across all
// servers. It returns the rows each provider answered.
//
// killed, when non-nil, is one of servers killed mid-job with at most
// inFlight calls in flight: a call it billed (its paid log is written
// before the answer) whose answer died with it is rightly called again on
// another endpoint, as a provider that dies mid-answer bills a call nobody
// receives. So up to inFlight prompts may be paid twice, once by killed.
func checkRouted(t *testing.T, dir string, rows int, names []string, killed *mockLLM, inFlight int, servers ...*mockLLM) map[string]int {
	t.Helper()
	out := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	header := out[0]
	col := map[string]int{}
	for i, h := range header {
		col[h] = i
	}
	by := map[string]int{}
	for i, row := range out[1:] {
		get := func(name string) string {
			if c, ok := col[name]; ok && c < len(row) {
				return row[c]
			}
			return ""
		}
		if get("status") != "succeeded" {
			t.Errorf("row %d: status %q (%s), want succeeded", i+1, get("status"), get("error"))
		}
		by[get("provider")]++
	}
	for p := range by {
		if !strings.Contains(","+strings.Join(names, ",")+",", ","+p+",") {
			t.Errorf("%d rows answered by %q, not one of %v", by[p], p, names)
		}
	}
	counts := paid(t, servers...)
	var byKilled map[string]int
	if killed != nil {
		byKilled = paid(t, killed)
	}
	total, twice := 0, 0
	for prompt, n := range counts {
		total += n
		switch {
		case n == 2 && byKilled[prompt] == 1:
			twice++ // its answer died with the killed server
		case n > 1:
			t.Errorf("prompt %q paid %d times: a row billed twice", prompt, n)
		}
	}
	if twice > inFlight {
		t.Errorf("%d prompts paid twice across the kill, want at most the %d calls in flight at the killed server", twice, inFlight)
	}
	if len(out)-1 != rows || total != rows+twice {
		t.Errorf("%d result rows, %d paid completions (%d lost with the killed server); want %d rows, each paid once", len(out)-1, total, twice, rows)
	}
	return by
}

// TestTwoEndpointsShareTheWork: two real mock-llm endpoints, each with half
// the request quota, routed by weight: the job finishes with every row
// answered once, both endpoints used, and not one 429.
func TestTwoEndpointsShareTheWork(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Each endpoint takes 15 requests a second (900 a minute, the file's
	// rpm), enforced over 1 s windows with the same small headroom as the
	// single-endpoint pacing test.
	a := startMockLLM(t, dir, "a", "--latency", "20ms", "--quota", "18", "--quota-window", "1s")
	b := startMockLLM(t, dir, "b", "--latency", "20ms", "--quota", "18", "--quota-window", "1s")
	providers := writeFile(t, filepath.Join(dir, "providers.yaml"), fmt.Sprintf(`routing: weighted
providers:
  - {name: a, kind: mock, base_url: %q, rpm: 900, concurrency: 8}
  - {name: b, kind: mock, base_url: %q, rpm: 900, concurrency: 8}
`, a.baseURL, b.baseURL))
	const rows = 150
	in := productsCSV(t, dir, rows, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--providers", providers, "--batch-size", "25", "--quiet")
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	by := checkRouted(t, dir, rows, []string{"a", "b"}, nil, 0, a, b)
	if by["a"] == 0 || by["b"] == 0 {
		t.Errorf("rows by provider %v: want both endpoints used", by)
	}
	for name, m := range map[string]*mockLLM{"a": a, "b": b} {
		if st := m.stats(t); st.RateLimited != 0 {
			t.Errorf("endpoint %s answered %d requests 429, want none", name, st.RateLimited)
		}
	}
}

// TestAnthropicBesideOpenAI: a providers file routing over an Anthropic
// Messages endpoint and an OpenAI one (two mock-llm servers, one speaking
// each protocol to batchgen), each with its own quota: every row answered
// once, by both, labelled by the route that answered it, and not one 429.
func TestAnthropicBesideOpenAI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := startMockLLM(t, dir, "claude", "--latency", "20ms", "--quota", "18", "--quota-window", "1s")
	o := startMockLLM(t, dir, "gpt", "--latency", "20ms", "--quota", "18", "--quota-window", "1s")
	providers := writeFile(t, filepath.Join(dir, "providers.yaml"), fmt.Sprintf(`routing: weighted
providers:
  - {name: claude, kind: anthropic, base_url: %q, rpm: 900, concurrency: 8}
  - {name: gpt, kind: mock, base_url: %q, rpm: 900, concurrency: 8}
`, strings.TrimSuffix(a.baseURL, "/v1"), o.baseURL))
	const rows = 150
	in := productsCSV(t, dir, rows, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--providers", providers, "--batch-size", "25", "--quiet")
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	by := checkRouted(t, dir, rows, []string{"claude", "gpt"}, nil, 0, a, o)
	if by["claude"] == 0 || by["gpt"] == 0 {
		t.Errorf("rows by provider %v: want both endpoints used", by)
	}
	for name, m := range map[string]*mockLLM{"claude": a, "gpt": o} {
		st := m.stats(t)
		if st.RateLimited != 0 {
			t.Errorf("endpoint %s answered %d requests 429, want none", name, st.RateLimited)
		}
		if want := map[string]int64{"claude": st.Requests, "gpt": 0}[name]; st.Messages != want {
			t.Errorf("endpoint %s got %d of its %d calls on the Messages API, want %d", name, st.Messages, st.Requests, want)
		}
	}
}

// TestEndpointKilledMidJob: one of two endpoints is killed (SIGKILL) while
// the job runs: the job finishes, every row is answered, and no row is paid
// twice but those whose answer died with the killed server (its paid log is
// written before each answer, so it counts what it billed up to the kill;
// seen once in many runs, on a loaded machine).
func TestEndpointKilledMidJob(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := startMockLLM(t, dir, "a", "--latency", "20ms")
	b := startMockLLM(t, dir, "b", "--latency", "20ms")
	providers := writeFile(t, filepath.Join(dir, "providers.yaml"), fmt.Sprintf(`routing: weighted
providers:
  - {name: a, kind: mock, base_url: %q, concurrency: 4, timeout: 5s}
  - {name: b, kind: mock, base_url: %q, concurrency: 4, timeout: 5s}
`, a.baseURL, b.baseURL))
	const rows = 300
	in := productsCSV(t, dir, rows, nil)
	job := exec.Command(binary, "run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--providers", providers,
		"--batch-size", "25", "--quiet")
	var stderr strings.Builder
	job.Stderr = &stderr
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill a once it has answered a fifth of the rows.
	deadline := time.After(2 * time.Minute)
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for a.stats(t).Succeeded < rows/5 {
		select {
		case <-deadline:
			_ = job.Process.Kill()
			t.Fatalf("endpoint a answered only %d rows in 2 minutes", a.stats(t).Succeeded)
		case <-poll.C:
		}
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err := job.Wait()
	if err != nil {
		t.Fatalf("job: %v; stderr:\n%s", err, stderr.String())
	}
	// a's concurrency bounds its calls in flight at the kill.
	by := checkRouted(t, dir, rows, []string{"a", "b"}, a, 4, a, b)
	if by["a"] == 0 || by["b"] < rows/2 {
		t.Errorf("rows by provider %v: want a's rows before the kill and b the rest", by)
	}
}
