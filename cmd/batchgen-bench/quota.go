package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// The quota figures of issue 10, against `batchgen mock-llm`'s strict
// sliding-window quotas at 290 ms latency.

// measureTokenQuota: a job whose token quota binds before its request
// quota, both given (--rpm, --tpm): wall over the token bound (tokens the
// provider counted / TPM rate), and no 429.
func measureTokenQuota(ctx context.Context, r *run) ([]Figure, error) {
	const rpm, latency = 60000, 290 * time.Millisecond
	rows, tpm := 500, 16000 // about 15 tokens a row: a 30 s job
	if r.quick {
		rows, tpm = 250, 16000
	}
	res, st, err := r.jobOnMock(ctx, "tpm", rows,
		[]string{"--latency", latency.String(), "--quota", strconv.Itoa(rpm), "--token-quota", strconv.Itoa(tpm), "--quota-window", "60s"},
		[]string{"--rpm", strconv.Itoa(rpm), "--tpm", strconv.Itoa(tpm), "--concurrency", "16"})
	if err != nil {
		return nil, err
	}
	bound := float64(st.Tokens) / (float64(tpm) / 60)
	return []Figure{
		{ID: "quota-tpm-ratio", Name: "quota: request + token limits, TPM binds (wall / token bound)", Value: res.wall.Seconds() / bound,
			Better: AtMost, Bound: 1.10, Detail: fmt.Sprintf("%d rows, --rpm %d --tpm %d, %d tokens used; token bound %.1f s, wall %.1f s", rows, rpm, tpm, st.Tokens, bound, res.wall.Seconds())},
		{ID: "quota-tpm-429", Name: "quota: 429s where TPM binds (share of requests)", Value: share(st.RateLimited, st.Requests),
			Better: AtMost, Bound: 0, Detail: fmt.Sprintf("%d of %d requests", st.RateLimited, st.Requests)},
	}, nil
}

// jobOnMock runs rows through `batchgen run` (with runFlags) against a
// fresh `batchgen mock-llm` started with mockFlags, and returns the run and
// what the server counted.
func (r *run) jobOnMock(ctx context.Context, id string, rows int, mockFlags, runFlags []string) (result, mockStats, error) {
	m, err := r.mock(ctx, mockFlags...)
	if err != nil {
		return result{}, mockStats{}, err
	}
	defer m.Stop()
	in, err := r.csv(rows, id)
	if err != nil {
		return result{}, mockStats{}, err
	}
	res, err := r.runJob(ctx, in, m, runFlags...)
	if err != nil {
		return result{}, mockStats{}, err
	}
	st, err := m.Stats()
	return res, st, err
}

// measureQuotaLearning: a one-minute job (600 rows at 600 requests a
// minute) with no --rpm, the quota learned from the mock's rate-limit
// headers, then from its 429s alone (--no-ratelimit-headers). The quota is
// enforced over 10 s windows so that it binds from the first seconds: a
// fresh 60 s window would let a one-minute job through unpaced.
func measureQuotaLearning(ctx context.Context, r *run) ([]Figure, error) {
	const rpm, rows, latency, window = 600, 600, 290 * time.Millisecond, 10 * time.Second
	perWindow := int(float64(rpm) * window.Seconds() / 60)
	bound := float64(rows) / (rpm / 60.0)
	var figs []Figure
	for _, c := range []struct {
		id, name string
		flags    []string
		target   float64
	}{
		{"quota-learned-headers", "quota learned from headers", nil, 1.10},
		{"quota-learned-429s", "quota learned from 429s alone", []string{"--no-ratelimit-headers"}, 1.15},
	} {
		res, st, err := r.jobOnMock(ctx, c.id, rows,
			append([]string{"--latency", latency.String(), "--quota", strconv.Itoa(perWindow), "--quota-window", window.String()}, c.flags...),
			[]string{"--concurrency", "16"})
		if err != nil {
			return nil, err
		}
		detail := fmt.Sprintf("no --rpm; %d rows at %d rpm (%d per %v sliding window); bound %.0f s, wall %.1f s; %d of %d requests answered 429",
			rows, rpm, perWindow, window, bound, res.wall.Seconds(), st.RateLimited, st.Requests)
		figs = append(figs, Figure{ID: c.id + "-ratio", Name: c.name + " (wall / bound)", Value: res.wall.Seconds() / bound,
			Better: AtMost, Bound: c.target, Detail: detail})
		if c.flags == nil {
			figs = append(figs, Figure{ID: c.id + "-429", Name: c.name + " (share of requests answered 429)", Value: share(st.RateLimited, st.Requests),
				Better: AtMost, Bound: 0.01, Detail: fmt.Sprintf("%d of %d requests", st.RateLimited, st.Requests)})
		}
	}
	more, err := measureQuotaLearningElsewhere(ctx, r)
	return append(figs, more...), err
}

// measureQuotaLearningElsewhere: the learner on a provider of another
// shape than the figures above, so that it is not tuned to one: 200
// requests in a strict 10 s sliding window (1,200 a minute), Retry-After
// alone (no rate-limit headers), 290 ms ±50 % latency, 1,200 rows. Once
// with --rpm twice too high, once with no --rpm.
func measureQuotaLearningElsewhere(ctx context.Context, r *run) ([]Figure, error) {
	const rpm, rows, latency, jitter, window = 1200, 1200, 290 * time.Millisecond, 145 * time.Millisecond, 10 * time.Second
	perWindow := int(float64(rpm) * window.Seconds() / 60)
	bound := float64(rows) / (rpm / 60.0)
	var figs []Figure
	for _, c := range []struct {
		id, name string
		flags    []string
		target   float64
	}{
		{"quota-elsewhere-2x", "quota set 2x too high, another provider shape", []string{"--rpm", strconv.Itoa(2 * rpm)}, 1.05},
		{"quota-elsewhere-unknown", "quota unknown, another provider shape", nil, 1.10},
	} {
		res, st, err := r.jobOnMock(ctx, c.id, rows,
			[]string{"--latency", latency.String(), "--jitter", jitter.String(), "--quota", strconv.Itoa(perWindow), "--quota-window", window.String(), "--no-ratelimit-headers"},
			append([]string{"--concurrency", "16"}, c.flags...))
		if err != nil {
			return nil, err
		}
		detail := fmt.Sprintf("%d rows; provider: %d per %v strict sliding window, Retry-After only, latency %v ±%v; bound %.0f s, wall %.1f s; %d of %d requests answered 429",
			rows, perWindow, window, latency, jitter, bound, res.wall.Seconds(), st.RateLimited, st.Requests)
		figs = append(figs, Figure{ID: c.id + "-ratio", Name: c.name + " (wall / bound)", Value: res.wall.Seconds() / bound,
			Better: AtMost, Bound: c.target, Detail: detail})
	}
	return figs, nil
}

// measureSharedLearning: the AWS generator fleet's limiter (quota.Shared,
// four instances over one lease store) whose QuotaRpm is twice the
// provider's, on a one-minute job whose provider window is already full:
// wall over the bound, and the share of requests answered 429. It runs
// TestSharedFleetLearnsTheQuota, which drives the mock provider's handler
// (strict 60 s sliding window, 429s alone) on a fake clock, as the
// emulator figures run their tests: a fleet of Lambda instances is not
// something `batchgen run` can start.
func measureSharedLearning(ctx context.Context, _ *run) ([]Figure, error) {
	const name = "429s alone, one minute, window full"
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "^TestSharedFleetLearnsTheQuota$", "-v", "./internal/quota/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("TestSharedFleetLearnsTheQuota: %w\n%s", err, tail(string(out)))
	}
	m := regexp.MustCompile(`shared fleet \[` + regexp.QuoteMeta(name) + `\]: wall/bound ([0-9.]+), (\d+) of (\d+) calls answered 429`).FindStringSubmatch(string(out))
	if m == nil {
		return nil, fmt.Errorf("TestSharedFleetLearnsTheQuota printed no figures for %q:\n%s", name, tail(string(out)))
	}
	ratio, _ := strconv.ParseFloat(m[1], 64)
	limited, _ := strconv.ParseInt(m[2], 10, 64)
	calls, _ := strconv.ParseInt(m[3], 10, 64)
	detail := fmt.Sprintf("4 instances, QuotaRpm 1200 against a 600 rpm provider (60 s window, full when the job starts), 600 rows; %d of %d requests answered 429; simulated on a fake clock", limited, calls)
	return []Figure{
		// 1.15: learned from 429s alone, the bound for that case.
		{ID: "quota-shared-2x-ratio", Name: "shared limiter, quota configured 2x too high (wall / bound)", Value: ratio,
			Better: AtMost, Bound: 1.15, Detail: detail},
		{ID: "quota-shared-2x-429", Name: "shared limiter, quota configured 2x too high (share of requests answered 429)", Value: share(limited, calls),
			Better: AtMost, Bound: 0.01, Detail: detail},
	}, nil
}

// measureSharedWrites is the issue's "at most 1 DynamoDB write per 20 model
// calls" for fleets of generator instances sharing one quota: model calls
// per lease-store write over a minute of steady state, for a fleet drawing
// less than the quota and for fleets that could draw more; each figure is
// the median of the orders in which the fleet's processes may wake. It runs
// TestSharedFleetLeaseCost (quota.Shared over the in-memory store that
// follows dynamoquota's rules, on a fake clock; TestSharedWritesPerCall
// counts the same on moto through the SDK).
func measureSharedWrites(ctx context.Context, _ *run) ([]Figure, error) {
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "^TestSharedFleetLeaseCost$", "-v", "./internal/quota/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("TestSharedFleetLeaseCost: %w\n%s", err, tail(string(out)))
	}
	cases := []struct{ name, id, detail string }{
		{"under the quota", "quota-shared-writes-under", "2 instances x 8 calls in flight drawing 32/s of a 49/s quota"},
		{"held by the quota, 4 processes", "quota-shared-writes-held-4", "4 instances x 8 calls in flight sharing 9/s"},
		{"held by the quota, 8 processes", "quota-shared-writes-held-8", "8 instances x 8 calls in flight sharing 49/s"},
		{"held by the quota, 16 processes, slow calls", "quota-shared-writes-held-16-slow", "16 instances x 8 calls of 2 s in flight sharing 19/s"},
	}
	var figs []Figure
	for _, c := range cases {
		m := regexp.MustCompile(`shared fleet writes \[` + regexp.QuoteMeta(c.name) + `\]: (\d+) calls in 60 s \(([0-9.]+) a second\), (\d+) writes .*; (median of \d+ wake orders), fewest calls a write ([0-9.]+)`).FindStringSubmatch(string(out))
		if m == nil {
			return nil, fmt.Errorf("TestSharedFleetLeaseCost printed no figures for %q:\n%s", c.name, tail(string(out)))
		}
		calls, _ := strconv.ParseFloat(m[1], 64)
		writes, _ := strconv.ParseFloat(m[3], 64)
		figs = append(figs, Figure{ID: c.id, Name: "shared limiter, model calls per DynamoDB write (" + c.name + ")", Value: calls / max(writes, 1),
			Better: AtLeast, Bound: 20, Detail: fmt.Sprintf("%s; %s calls a second over 60 s; %s (the fewest calls a write of one order: %s); simulated on a fake clock", c.detail, m[2], m[4], m[5])})
	}
	return figs, nil
}
