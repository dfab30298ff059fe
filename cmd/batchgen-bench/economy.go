package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// measureEconomy: issue 19's economy mode. The same sheet run online and in
// economy, each against its own mock-llm standing in for OpenAI at
// gpt-4o-mini's list price; the economy server answers its batches
// shuffled, with a twentieth of the lines failed (sent again by the run).
// Economy's cost as a ratio of online's, and the rows lost and paid twice
// in economy, read from the result and the server's paid log.
func measureEconomy(ctx context.Context, r *run) ([]Figure, error) {
	rows := 5000
	if r.quick {
		rows = 1000
	}
	in, err := r.csv(rows, "economy")
	if err != nil {
		return nil, err
	}
	online, err := r.mock(ctx, "--latency", "0")
	if err != nil {
		return nil, err
	}
	defer online.Stop()
	paidLog := filepath.Join(r.dir("paid-economy"), "paid.log")
	eco, err := r.mock(ctx, "--latency", "0", "--batch-delay", "5s", "--batch-error-rate", "0.05", "--paid-log", paidLog)
	if err != nil {
		return nil, err
	}
	defer eco.Stop()
	job := func(m *mockLLM, tag string, extra ...string) (result, string, error) {
		out := filepath.Join(r.dir("out-"+tag), "result.csv")
		args := append([]string{"run", "--in", in, "--data", r.dir("data-" + tag), "--out", out, "--prompt", "{{sku}} {{name}}",
			"--provider", "openai", "--base-url", m.URL, "--model", "gpt-4o-mini", "--rpm", "60000", "--quiet"}, extra...)
		res, err := r.timed(ctx, r.bin, args...)
		if err != nil {
			return res, "", fmt.Errorf("%s run: %w", tag, err)
		}
		return res, out, nil
	}
	on, _, err := job(online, "online")
	if err != nil {
		return nil, err
	}
	ec, out, err := job(eco, "economy", "--mode", "economy", "--batch-poll", "1s")
	if err != nil {
		return nil, err
	}
	onCost, err1 := money(`estimated cost \$([0-9.]+)`, on.stdout)
	ecCost, err2 := money(`estimated cost \$([0-9.]+)`, ec.stdout)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("economy: no cost in the summaries:\n%s\n%s", on.stdout, ec.stdout)
	}
	byStatus, byProvider, err := resultCounts(out)
	if err != nil {
		return nil, err
	}
	twice, paid, err := paidTwice(paidLog)
	if err != nil {
		return nil, err
	}
	detail := fmt.Sprintf("%d rows; online $%.6f in %.1f s, economy $%.6f in %.1f s (a 5 s mock batch, 5%% of lines failed and sent again, answers shuffled); gpt-4o-mini's list price",
		rows, onCost, on.wall.Seconds(), ecCost, ec.wall.Seconds())
	return []Figure{
		{ID: "economy-cost", Name: fmt.Sprintf("economy: cost of %d rows vs online (economy / online)", rows), Value: ecCost / onCost, Better: AtMost, Bound: 0.52, Detail: detail},
		{ID: "economy-lost", Name: "economy: rows without an answer", Value: float64(rows - byStatus["succeeded"]), Better: AtMost, Bound: 0,
			Detail: fmt.Sprintf("result rows by status %v, by provider %v", byStatus, byProvider)},
		{ID: "economy-paid-twice", Name: "economy: prompts paid more than once (paid log)", Value: float64(twice), Better: AtMost, Bound: 0,
			Detail: fmt.Sprintf("%d prompts paid", paid)},
	}, nil
}

// measureAuto: issue 19's auto mode. 1,000 rows whose provider batch would
// take 10 minutes, with a 90-second deadline: the run must end within it,
// keep every answer the batch returned before its cancel, and pay no
// prompt twice.
func measureAuto(ctx context.Context, r *run) ([]Figure, error) {
	const rows = 1000
	const deadline = 90 * time.Second
	in, err := r.csv(rows, "auto")
	if err != nil {
		return nil, err
	}
	paidLog := filepath.Join(r.dir("paid-auto"), "paid.log")
	m, err := r.mock(ctx, "--latency", "50ms", "--batch-delay", "10m", "--paid-log", paidLog)
	if err != nil {
		return nil, err
	}
	defer m.Stop()
	out := filepath.Join(r.dir("out-auto"), "result.csv")
	res, err := r.timed(ctx, r.bin, "run", "--in", in, "--data", r.dir("data-auto"), "--out", out, "--prompt", "{{sku}} {{name}}",
		"--provider", "openai", "--base-url", m.URL, "--model", "gpt-4o-mini", "--concurrency", "64", "--rpm", "60000", "--quiet",
		"--mode", "auto", "--deadline", deadline.String(), "--batch-poll", "1s")
	if err != nil {
		return nil, fmt.Errorf("auto run: %w", err)
	}
	byStatus, byProvider, err := resultCounts(out)
	if err != nil {
		return nil, err
	}
	log, err := os.ReadFile(paidLog)
	if err != nil {
		return nil, err
	}
	paid, err := mockserver.ParsePaidLog(log)
	if err != nil {
		return nil, err
	}
	twice, batchPaid := 0, 0
	for _, p := range paid {
		if p.Calls() > 1 {
			twice++
		}
		batchPaid += p.Batch
	}
	keptBatch := 0
	for label, n := range byProvider {
		if strings.HasSuffix(label, " (batch)") {
			keptBatch += n
		}
	}
	kept := 1.0
	if batchPaid > 0 {
		kept = float64(keptBatch) / float64(batchPaid)
	}
	detail := fmt.Sprintf("%d rows, a 10-minute mock batch, deadline %v: done in %.1f s; %d answers from the cancelled batch kept of %d it billed; rows by status %v",
		rows, deadline, res.wall.Seconds(), keptBatch, batchPaid, byStatus)
	return []Figure{
		{ID: "auto-deadline", Name: "auto: time to finish vs the deadline (wall / deadline)", Value: res.wall.Seconds() / deadline.Seconds(), Better: AtMost, Bound: 1, Detail: detail},
		{ID: "auto-kept", Name: "auto: batch answers kept (kept / billed)", Value: kept, Better: AtLeast, Bound: 1, Detail: detail},
		{ID: "auto-paid-twice", Name: "auto: prompts paid more than once, or rows without an answer", Value: float64(twice + rows - byStatus["succeeded"]), Better: AtMost, Bound: 0, Detail: detail},
	}, nil
}

// resultCounts counts a CSV result's rows by status and by provider.
func resultCounts(path string) (byStatus, byProvider map[string]int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(recs) == 0 {
		return nil, nil, fmt.Errorf("%s is empty", path)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[strings.TrimPrefix(h, "\ufeff")] = i
	}
	byStatus, byProvider = map[string]int{}, map[string]int{}
	for _, rec := range recs[1:] {
		byStatus[rec[col["status"]]]++
		byProvider[rec[col["provider"]]]++
	}
	return byStatus, byProvider, nil
}

// paidTwice counts the prompts a paid log bills more than once, and all it
// bills.
func paidTwice(path string) (twice, paid int, err error) {
	log, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	p, err := mockserver.ParsePaidLog(log)
	if err != nil {
		return 0, 0, err
	}
	for _, n := range p {
		if n.Calls() > 1 {
			twice++
		}
	}
	return twice, len(p), nil
}
