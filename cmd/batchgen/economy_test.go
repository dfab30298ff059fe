package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestEconomyQuoteAndRun: the quote offers economy at half the online
// price; the economy run sends every row left to the mock's Batch API
// (lines answered shuffled, a tenth failed and sent again), pays each
// prompt once, lands within 15% of the quote, and says what the batch API
// saved.
func TestEconomyQuoteAndRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := startMockLLM(t, dir, "m", "--latency", "5ms", "--batch-delay", "1s", "--batch-error-rate", "0.1")
	prices := writeFile(t, filepath.Join(dir, "prices.yaml"), "models:\n  mock-1: {input_per_mtok: 1000, output_per_mtok: 1000}\n")
	const rows = 300
	in := productsCSV(t, dir, rows, nil)
	args := []string{"--in", in, "--prompt", "{{sku}} {{商品名称}}", "--prices", prices, "--provider", "mock", "--base-url", m.baseURL,
		"--mode", "economy", "--batch-poll", "1s"}

	q := runBinary(t, context.Background(), append([]string{"quote"}, args...)...)
	if q.code != 0 {
		t.Fatalf("quote: exit %d; stderr:\n%s", q.code, q.stderr)
	}
	t.Logf("quote:\n%s", q.stdout)
	online, economy := moneyIn(t, `online +\$([0-9.]+)`, q.stdout), moneyIn(t, `economy +\$([0-9.]+)`, q.stdout)
	if math.Abs(economy-online/2) > 0.01*online {
		t.Errorf("economy quoted at $%.4f, online at $%.4f: want half", economy, online)
	}
	if !strings.Contains(q.stdout, "auto      give --deadline") {
		t.Errorf("the quote without --deadline should say auto needs one:\n%s", q.stdout)
	}
	quoted := moneyIn(t, `they cost \$([0-9.]+)`, q.stdout) + economy

	r := runBinary(t, context.Background(), append([]string{"run", "--progress-interval", "500ms"}, args...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	t.Logf("run:\n%s", r.stdout)
	if !strings.Contains(r.stderr, "waiting on 1 provider batch") {
		t.Errorf("the progress line never said it waits on a provider batch:\n%s", r.stderr)
	}
	if !strings.Contains(r.stdout, "less than online through the batch API") || !regexp.MustCompile(`(?m)^batches +\d+ lines in \d+ provider batch(es)? this run  \(at the batch price`).MatchString(r.stdout) {
		t.Errorf("the summary does not show the economy run and its saving:\n%s", r.stdout)
	}
	for prompt, n := range paid(t, m) {
		if n != 1 {
			t.Errorf("prompt %q paid %d times", prompt, n)
		}
	}
	st := m.stats(t)
	if st.BatchFailed == 0 || st.BatchLines-st.BatchFailed != rows-20 {
		t.Errorf("the mock answered %d batch lines and failed %d: want the %d rows after the sample answered in batches, some after a failure", st.BatchLines-st.BatchFailed, st.BatchFailed, rows-20)
	}
	out := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	col := map[string]int{}
	for i, h := range out[0] {
		col[h] = i
	}
	batch := 0
	for _, row := range out[1:] {
		if row[col["status"]] != "succeeded" || row[col["output"]] != "Copy for: "+row[col["sku"]]+" "+row[col["商品名称"]] {
			t.Errorf("row %q: want succeeded with its own answer", row)
		}
		if strings.HasSuffix(row[col["provider"]], " (batch)") {
			batch++
		}
	}
	if batch != rows-20 {
		t.Errorf("%d rows answered through the batch API, want %d", batch, rows-20)
	}
	st2 := runBinary(t, context.Background(), "status", taskIDFrom(t, r.stdout), "--data", filepath.Join(dir, ".batchgen"), "--prices", prices)
	if st2.code != 0 || !strings.Contains(st2.stdout, "mode      economy") || !strings.Contains(st2.stdout, "less than online through the batch API") {
		t.Errorf("status: exit %d, want the mode and the saving:\n%s%s", st2.code, st2.stdout, st2.stderr)
	}
	actual := moneyIn(t, `estimated cost \$([0-9.]+)`, r.stdout)
	t.Logf("quoted $%.4f, the run reports $%.4f", quoted, actual)
	if math.Abs(quoted-actual) > 0.15*actual {
		t.Errorf("quoted $%.4f, the run cost $%.4f: more than 15%% apart", quoted, actual)
	}
}

// TestEconomyKilledRunFindsItsBatches: a run killed (SIGKILL) while its
// rows wait for their provider batches, run again, finds the batches by
// the ids it recorded: the mock runs each row's line once, and each prompt
// is paid once.
func TestEconomyKilledRunFindsItsBatches(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := startMockLLM(t, dir, "m", "--latency", "5ms", "--batch-delay", "10s")
	const rows = 150
	in := productsCSV(t, dir, rows, nil)
	args := []string{"run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--provider", "mock", "--base-url", m.baseURL,
		"--mode", "economy", "--batch-poll", "1s", "--batch-size", "50", "--progress-interval", "200ms"}

	cmd, taskID := startEconomyRun(t, args)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if st := m.stats(t); st.BatchLines >= rows {
		t.Fatalf("the mock answered all %d lines before the kill; the test wants the run killed midway", st.BatchLines)
	}
	// Another process, with no lanes, reads what the task waits on from
	// its journal.
	if st := runBinary(t, context.Background(), "status", taskID, "--data", filepath.Join(dir, ".batchgen")); st.code != 0 || !regexp.MustCompile(`provider\s+waiting on \d+ provider batch(es)? \(`).MatchString(st.stdout) {
		t.Errorf("status of the killed task: exit %d, want the provider batch it waits on:\n%s%s", st.code, st.stdout, st.stderr)
	}

	r := runBinary(t, context.Background(), args...)
	if r.code != 0 {
		t.Fatalf("the run after the kill: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if st := m.stats(t); st.BatchLines != rows {
		t.Errorf("the mock ran %d batch lines for %d rows: the second run sent rows again", st.BatchLines, rows)
	}
	n := paid(t, m)
	if len(n) != rows {
		t.Errorf("%d prompts paid, want %d", len(n), rows)
	}
	for prompt, c := range n {
		if c != 1 {
			t.Errorf("prompt %q paid %d times", prompt, c)
		}
	}
	for _, row := range readResult(t, filepath.Join(dir, "skus.result.xlsx"))[1:] {
		if !strings.Contains(strings.Join(row, "|"), "succeeded") {
			t.Errorf("row %q did not succeed", row)
		}
	}
}

// startEconomyRun starts `batchgen ARGS` (an economy run with a progress
// line) and returns once every row of its task is in a recorded provider
// batch (the progress line waits on one and gathers nothing), with the
// task's id.
func startEconomyRun(t *testing.T, args []string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var seen bytes.Buffer
	var mu sync.Mutex
	waiting := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			mu.Lock()
			seen.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.Contains(sc.Text(), "waiting on") && !strings.Contains(sc.Text(), "gathering") {
				once.Do(func() { close(waiting) })
			}
		}
	}()
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the run never waited on its provider batches:\n%s", seen.String())
	}
	mu.Lock()
	defer mu.Unlock()
	m := regexp.MustCompile(`task ([0-9a-f]{20})`).FindStringSubmatch(seen.String())
	if m == nil {
		t.Fatalf("no task id in:\n%s", seen.String())
	}
	return cmd, m[1]
}

// TestEconomyCancelCancelsProviderBatches: cancelling an economy task
// while it waits for its provider batch stops the run and cancels the
// batch at the provider, whose unanswered lines would be paid for nothing:
// before the run exits, well before its next look at the batch (20 s).
func TestEconomyCancelCancelsProviderBatches(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := startMockLLM(t, dir, "m", "--latency", "5ms", "--batch-delay", "60s")
	in := productsCSV(t, dir, 60, nil)
	cmd, id := startEconomyRun(t, []string{"run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--provider", "mock", "--base-url", m.baseURL,
		"--mode", "economy", "--batch-poll", "20s", "--progress-interval", "200ms"})
	if r := runBinary(t, context.Background(), "cancel", id, "--data", filepath.Join(dir, ".batchgen")); r.code != 0 {
		t.Fatalf("cancel: exit %d\n%s", r.code, r.stderr)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the run did not stop within 30 s of the cancel")
	}
	resp, err := http.Get(m.baseURL + "/batches")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if len(list.Data) == 0 {
		t.Fatal("the mock has no batch")
	}
	for _, b := range list.Data {
		if b.Status != "cancelled" {
			t.Errorf("provider batch %s is %s after the task's cancel, want cancelled", b.ID, b.Status)
		}
	}
}
