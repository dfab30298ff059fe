package quota

import (
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/quota/quotatest"
)

func TestSharedConformance(t *testing.T) {
	t.Parallel()
	quotatest.Run(t, func(t *testing.T, cfg quotatest.Config) quotatest.Limiter {
		s, err := NewShared(NewMemLeaser(), SharedConfig{RPM: cfg.RPM, TPM: cfg.TPM, MinPenalty: cfg.MinPenalty, Clock: cfg.Clock})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestSharedHoldsTheQuotaAcrossProcesses: three limiters (three Lambda
// instances) sharing one budget never start more than a second's share in
// any calendar second, and together use most of it once warmed up.
func TestSharedHoldsTheQuotaAcrossProcesses(t *testing.T) {
	t.Parallel()
	leaser := NewMemLeaser()
	clk := clock.NewFake(quotatest.Base)
	const rpm = 1200 // 20 a second, 19 after the margin
	d := quotatest.NewDriver(t, clk)
	for range 3 {
		s, err := NewShared(leaser, SharedConfig{RPM: rpm, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		d.Start(s, 6)
	}
	const seconds = 10
	d.RunUntil(quotatest.Base.Add(seconds * time.Second))
	perSecond := map[int64]int{}
	for _, s := range d.Stop() {
		perSecond[s.Unix()]++
	}
	used := 0
	for sec := range int64(seconds) {
		n := perSecond[quotatest.Base.Unix()+sec]
		if n > 19 {
			t.Errorf("second %d started %d requests, more than the 19 the quota allows", sec, n)
		}
		if sec > 0 { // the first second sizes the blocks
			used += n
		}
	}
	// Tokens a process leased but could not pace into their second are
	// lost; together they stay under 5 %.
	if want := 19 * (seconds - 1) * 95 / 100; used < want {
		t.Errorf("seconds 1 to %d started %d requests, want >= %d (95%% of the quota): %v", seconds-1, used, want, perSecond)
	}
}

// TestSharedLeaseCost: at steady state the goroutines of a process share
// one lease a second, a block sized to the rate they draw, so the shared
// store sees at most one write per 20 model calls, whether the process is
// held back by the quota or by its own concurrency (model latency).
func TestSharedLeaseCost(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		rpm     int
		workers int
		latency time.Duration // of a model call, between a start and the next Wait
		rate    int           // calls a second the process can make
		// tpm, when set, adds a token quota; each call is charged tokens
		// and uses used.
		tpm, tokens, used int
	}{
		{name: "held by the quota", rpm: 6000, workers: 32, rate: 99},
		{name: "held by the quota, low", rpm: 600, workers: 32, rate: 9},
		{name: "held by concurrency", rpm: 60000, workers: 16, latency: 400 * time.Millisecond, rate: 40},
		{name: "a slow Lambda", rpm: 60000, workers: 8, latency: time.Second, rate: 8},
		{name: "one worker", rpm: 60000, workers: 1, latency: 40 * time.Millisecond, rate: 25},
		{name: "tokens counted, requests bind", rpm: 6000, workers: 32, rate: 99, tpm: 6_000_000, tokens: 100, used: 50},
		{name: "tokens bind", rpm: 60000, workers: 32, latency: 200 * time.Millisecond, rate: 9, tpm: 60000, tokens: 100, used: 100},
		{name: "tokens bind, half used", rpm: 60000, workers: 32, latency: 200 * time.Millisecond, rate: 18, tpm: 60000, tokens: 100, used: 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			leaser := NewMemLeaser()
			clk := clock.NewFake(quotatest.Base)
			s, err := NewShared(leaser, SharedConfig{RPM: tc.rpm, TPM: tc.tpm, Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			d := quotatest.NewDriver(t, clk)
			d.Tokens, d.Used = tc.tokens, tc.used
			d.StartCalling(s, tc.workers, tc.latency)
			// Warm up for 5 s (the first seconds size the block), then
			// count 30 s of steady state.
			d.RunUntil(quotatest.Base.Add(5 * time.Second))
			warm, leases := len(d.Starts()), leaser.Writes()
			d.RunUntil(quotatest.Base.Add(35 * time.Second))
			calls := len(d.Stop()) - warm
			writes := leaser.Writes() - leases
			if calls < tc.rate*30*9/10 {
				t.Fatalf("only %d calls in 30 s, want about %d a second", calls, tc.rate)
			}
			if float64(writes) > float64(calls)/20 {
				t.Errorf("%d lease writes for %d calls (%.3f a call), want at most 1 per 20", writes, calls, float64(writes)/float64(calls))
			}
		})
	}
}

func TestNewSharedRejectsTinyQuota(t *testing.T) {
	t.Parallel()
	if _, err := NewShared(NewMemLeaser(), SharedConfig{RPM: 30}); err == nil {
		t.Error("a 30 RPM quota (under one request a second) was accepted")
	}
	if _, err := NewShared(NewMemLeaser(), SharedConfig{RPM: 0}); err == nil {
		t.Error("RPM 0 was accepted")
	}
}
