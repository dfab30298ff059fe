package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// The routing figures of issue 10, against two `batchgen mock-llm`
// processes behind one providers file.

// measureRouting: two endpoints, each with half the request quota, routed
// by weight: wall over the bound of the whole quota, and no 429; then one
// of two endpoints killed (SIGKILL) mid-job: rows lost and rows paid twice,
// counted from the servers' paid logs (written before each answer, so the
// killed one's survive it).
func measureRouting(ctx context.Context, r *run) ([]Figure, error) {
	const rpm, latency = 2000, 290 * time.Millisecond
	rows, window := 3000, time.Minute
	if r.quick {
		rows, window = 600, 6*time.Second
	}
	half := int(float64(rpm) / 2 * window.Seconds() / 60)
	var ms []*mockLLM
	defer func() {
		for _, m := range ms {
			m.Stop()
		}
	}()
	for range 2 {
		m, err := r.mock(ctx, "--latency", latency.String(), "--quota", strconv.Itoa(half), "--quota-window", window.String())
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	providers := filepath.Join(r.dir("providers"), "providers.yaml")
	if err := os.WriteFile(providers, fmt.Appendf(nil, `routing: weighted
providers:
  - {name: a, kind: mock, base_url: %q, rpm: %d, concurrency: 16}
  - {name: b, kind: mock, base_url: %q, rpm: %d, concurrency: 16}
`, ms[0].URL, rpm/2, ms[1].URL, rpm/2), 0o644); err != nil {
		return nil, err
	}
	in, err := r.csv(rows, "route")
	if err != nil {
		return nil, err
	}
	res, err := r.runRouted(ctx, in, providers)
	if err != nil {
		return nil, err
	}
	var limited, requests int64
	for _, m := range ms {
		st, err := m.Stats()
		if err != nil {
			return nil, err
		}
		limited += st.RateLimited
		requests += st.Requests
	}
	bound := float64(rows) / (rpm / 60.0)
	figs := []Figure{
		{ID: "route-split-ratio", Name: "routing: two endpoints, half the quota each (wall / bound)", Value: res.wall.Seconds() / bound,
			Better: AtMost, Bound: 1.10, Detail: fmt.Sprintf("%d rows, 2 x %d rpm (%d per %v window each), %v latency; bound %.0f s, wall %.1f s", rows, rpm/2, half, window, latency, bound, res.wall.Seconds())},
		{ID: "route-split-429", Name: "routing: 429s with two endpoints (share of requests)", Value: share(limited, requests),
			Better: AtMost, Bound: 0, Detail: fmt.Sprintf("%d of %d requests", limited, requests)},
	}
	kill, err := r.killedEndpoint(ctx)
	if err != nil {
		return figs, err
	}
	return append(figs, kill...), nil
}

// runRouted runs `batchgen run` on in with a providers file.
func (r *run) runRouted(ctx context.Context, in, providers string) (result, error) {
	return r.timed(ctx, r.bin, "run", "--in", in, "--data", r.dir("data"), "--out", filepath.Join(r.dir("out"), "out.xlsx"),
		"--prompt", "{{sku}} {{name}}", "--quiet", "--providers", providers)
}

// killedEndpoint kills one of two endpoints once it has answered a fifth
// of the rows, and counts the rows no server was paid for (lost) and the
// rows paid more than once.
func (r *run) killedEndpoint(ctx context.Context) ([]Figure, error) {
	rows := 1000
	if r.quick {
		rows = 400
	}
	dir := r.dir("kill")
	logs := []string{filepath.Join(dir, "a.paid"), filepath.Join(dir, "b.paid")}
	var ms []*mockLLM
	defer func() {
		for _, m := range ms {
			m.Stop()
		}
	}()
	for _, l := range logs {
		m, err := r.mock(ctx, "--latency", "50ms", "--paid-log", l)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	providers := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(providers, fmt.Appendf(nil, `routing: weighted
providers:
  - {name: a, kind: mock, base_url: %q, concurrency: 8, timeout: 10s}
  - {name: b, kind: mock, base_url: %q, concurrency: 8, timeout: 10s}
`, ms[0].URL, ms[1].URL), 0o644); err != nil {
		return nil, err
	}
	in, err := r.csv(rows, "kill")
	if err != nil {
		return nil, err
	}
	job := exec.CommandContext(ctx, r.bin, "run", "--in", in, "--data", r.dir("data"), "--out", filepath.Join(r.dir("out"), "out.xlsx"),
		"--prompt", "{{sku}} {{name}}", "--quiet", "--providers", providers)
	var stderr strings.Builder
	job.Stderr = &stderr
	if err := job.Start(); err != nil {
		return nil, err
	}
	deadline := time.After(5 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := ms[0].Stats()
		if err == nil && st.Succeeded >= int64(rows/5) {
			break
		}
		select {
		case <-deadline:
			_ = job.Process.Kill()
			return nil, fmt.Errorf("endpoint a did not answer %d rows in 5 minutes", rows/5)
		case <-tick.C:
		}
	}
	ms[0].Stop()
	if err := job.Wait(); err != nil {
		return nil, fmt.Errorf("job with a killed endpoint: %w\n%s", err, tail(stderr.String()))
	}
	paid := map[string]int{}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			return nil, err
		}
		calls, err := mockserver.ParsePaidLog(b)
		if err != nil {
			return nil, err
		}
		for prompt, p := range calls {
			paid[prompt] += p.Calls()
		}
	}
	twice := 0
	for _, n := range paid {
		if n > 1 {
			twice++
		}
	}
	lost := rows - len(paid)
	detail := fmt.Sprintf("%d rows over 2 endpoints, a killed (SIGKILL) after %d answers; paid per row from the servers' paid logs", rows, rows/5)
	return []Figure{
		{ID: "route-kill-lost", Name: "routing: rows lost when an endpoint is killed", Value: float64(lost), Better: AtMost, Bound: 0, Detail: detail},
		{ID: "route-kill-paid-twice", Name: "routing: rows paid twice when an endpoint is killed", Value: float64(twice), Better: AtMost, Bound: 0, Detail: detail},
	}, nil
}
