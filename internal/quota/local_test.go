package quota

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/quota/quotatest"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func TestMaxInWindow(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) []time.Time {
		var out []time.Time
		for _, x := range v {
			out = append(out, t0.Add(time.Duration(x)*time.Millisecond))
		}
		return out
	}
	tests := []struct {
		name  string
		times []time.Time
		want  int
	}{
		{"empty", nil, 0},
		{"spread", ms(0, 1000, 2000), 1},
		{"edge excluded", ms(0, 999, 1000), 2},
		{"cluster in middle", ms(0, 1500, 1600, 1700, 2400, 5000), 4},
		{"unsorted", ms(1700, 0, 1600, 1500), 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := quotatest.MaxInWindow(tc.times, time.Second); got != tc.want {
				t.Errorf("MaxInWindow = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestNewLocalRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  LocalConfig
		want float64
	}{
		{"unlimited", LocalConfig{}, 0},
		{"negative RPM is unlimited", LocalConfig{RPM: -5}, 0},
		{"default margin", LocalConfig{RPM: 6000}, 99},
		{"no margin", LocalConfig{RPM: 6000, SafetyMargin: -1}, 100},
		{"custom margin", LocalConfig{RPM: 6000, SafetyMargin: 0.1}, 90},
		{"margin clamped", LocalConfig{RPM: 6000, SafetyMargin: 10}, 50},
		{"one per minute", LocalConfig{RPM: 1, SafetyMargin: -1}, 1.0 / 60},
		{"TPM alone paces no requests", LocalConfig{TPM: 6000}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := NewLocal(tc.cfg).Rate()
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("Rate() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewLocalTokenRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  LocalConfig
		want float64
	}{
		{"no TPM", LocalConfig{RPM: 600}, 0},
		{"TPM", LocalConfig{TPM: 60000, SafetyMargin: -1}, 1000},
		{"TPM with margin", LocalConfig{RPM: 600, TPM: 60000}, 990},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := NewLocal(tc.cfg).TokenRate()
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("TokenRate() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWaitUnlimitedNeverBlocks(t *testing.T) {
	t.Parallel()
	// A fake clock that never advances: any wait would hang until the
	// test's deadline.
	l := NewLocal(LocalConfig{Clock: clock.NewFake(t0)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 10000 {
		if err := l.Wait(ctx, 500); err != nil {
			t.Fatalf("Wait #%d: %v", i, err)
		}
	}
	if got := l.Rate(); got != 0 {
		t.Errorf("Rate() = %v, want 0 (unlimited)", got)
	}
}

func TestWaitReturnsWhenContextEnds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		rpm    int
		cancel func(cancel context.CancelFunc)
	}{
		{"cancelled while pacing", 1, func(cancel context.CancelFunc) { time.AfterFunc(20*time.Millisecond, cancel) }},
		{"cancelled before the call", 1, func(cancel context.CancelFunc) { cancel() }},
		{"cancelled before the call, unlimited", 0, func(cancel context.CancelFunc) { cancel() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// One request a minute, on a clock that never advances: after
			// the first token only ctx can end Wait.
			l := NewLocal(LocalConfig{RPM: tc.rpm, Clock: clock.NewFake(t0)})
			if tc.rpm > 0 {
				if err := l.Wait(context.Background(), 0); err != nil {
					t.Fatalf("first Wait: %v", err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tc.cancel(cancel)
			if err := l.Wait(ctx, 0); !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait = %v, want context.Canceled", err)
			}
		})
	}
}

func TestWaitReturnsWhenContextEndsDuringPause(t *testing.T) {
	t.Parallel()
	l := NewLocal(LocalConfig{RPM: 600, Clock: clock.NewFake(t0)})
	l.Penalize(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := l.Wait(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want context.DeadlineExceeded", err)
	}
}

// waitAsync runs Wait(tokens) in a goroutine and reports the fake time at
// which it returned.
func waitAsync(l *Local, clk *clock.Fake, tokens int) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		if err := l.Wait(context.Background(), tokens); err != nil {
			panic(err) // background ctx: cannot happen
		}
		out <- clk.Now()
	}()
	return out
}

// advanceUntil advances clk in steps until the Wait behind ch returns, and
// returns the fake time it returned at. It advances only while the Wait is
// parked on the clock: on a busy machine the goroutine may not have reached
// its timer yet, and time moved under a Wait that has not started would make
// it return later in fake time than the limiter decided.
func advanceUntil(t *testing.T, clk *clock.Fake, step time.Duration, ch <-chan time.Time) time.Time {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case at := <-ch:
			return at
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("Wait did not return while the fake clock advanced")
		}
		if clk.Waiters() > 0 {
			clk.Advance(step)
		}
		runtime.Gosched()
	}
}

// parked waits until n goroutines wait on clk.
func parked(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for clk.Waiters() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters on the clock, want %d", clk.Waiters(), n)
		}
		runtime.Gosched()
	}
}

func TestPenalizePausesThenHoldsHalfTheRate(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{RPM: 600, SafetyMargin: -1, Clock: clk}) // 10/s
	if err := l.Wait(context.Background(), 0); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	// One start in the window is not a quota: the cut stops at half.
	l.Penalize(5 * time.Second)
	if got := l.Rate(); got != 5 {
		t.Errorf("Rate() after Penalize = %v, want 5 (never below half of what applied)", got)
	}
	at := advanceUntil(t, clk, 50*time.Millisecond, waitAsync(l, clk, 0))
	if at.Before(t0.Add(5 * time.Second)) {
		t.Fatalf("Wait returned at +%v, want no start before the 5 s Retry-After", at.Sub(t0))
	}
	// Nobody is held back, so nothing probes: the ceiling holds.
	clk.Advance(10 * time.Minute)
	if got := l.Rate(); got != 5 {
		t.Errorf("Rate() 10 min later with no demand = %v, want 5 (no probe without demand)", got)
	}
}

func TestPenalizeInvalidatesWaits(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{RPM: 60, SafetyMargin: -1, Clock: clk}) // 1/s
	if err := l.Wait(context.Background(), 0); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	ch := waitAsync(l, clk, 0)
	parked(t, clk, 1) // waiting for its slot at +1 s
	l.Penalize(10 * time.Second)
	at := advanceUntil(t, clk, 100*time.Millisecond, ch)
	if at.Before(t0.Add(10 * time.Second)) {
		t.Errorf("waiter started at +%v, want not before the 10 s pause ended", at.Sub(t0))
	}
}

func TestPenalizeBurstCutsOnce(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{RPM: 6000, SafetyMargin: -1, Clock: clk})
	// 50 workers get their 429s at once: one congestion event.
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { l.Penalize(2 * time.Second) })
	}
	wg.Wait()
	if got := l.Rate(); got != 50 {
		t.Errorf("Rate() after a burst of 429s = %v, want 50 (halved once)", got)
	}
	// A 429 after the pause is a new event and cuts again.
	clk.Advance(3 * time.Second)
	l.Penalize(0)
	if got := l.Rate(); got != 25 {
		t.Errorf("Rate() after a second 429 = %v, want 25", got)
	}
}

func TestPenalizeHugeRetryAfterIsBounded(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{RPM: 600, Clock: clk})
	l.Penalize(math.MaxInt64)
	at := advanceUntil(t, clk, 10*time.Minute, waitAsync(l, clk, 0))
	if at.Sub(t0) > 2*time.Hour {
		t.Errorf("Wait returned at +%v, want the pause capped near an hour", at.Sub(t0))
	}
}

// TestPenalizeLearnsTheQuota: with no quota configured, the first 429 sets
// the ceiling to what the limiter started in the window, and learns the
// window from Retry-After while the job's first window is still open.
func TestPenalizeLearnsTheQuota(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		retryAfter time.Duration
		wantRate   float64 // requests/s after the cut, before the margin
	}{
		// 200 starts in 10 s; the oldest leaves after 50 s more: a 60 s
		// window holding 200.
		{"60 s window", 50 * time.Second, 200.0 / 60},
		// The oldest leaves after 5 s: a 15 s window holding 200.
		{"15 s window", 5 * time.Second, 200.0 / 15},
		// No Retry-After: a per-minute quota.
		{"no Retry-After", 0, 200.0 / 60},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(t0)
			l := NewLocal(LocalConfig{Clock: clk})
			for range 201 { // 20 a second for 10 s, unpaced; the last is refused
				if err := l.Wait(context.Background(), 0); err != nil {
					t.Fatalf("Wait: %v", err)
				}
				clk.Advance(50 * time.Millisecond)
			}
			l.Penalize(tc.retryAfter)
			if diff := cmp.Diff(tc.wantRate*0.99, l.Rate(), cmpopts.EquateApprox(0.01, 0)); diff != "" {
				t.Errorf("Rate() after the first 429 (-want +got):\n%s", diff)
			}
		})
	}
}

// TestObserveHeaders: a limit in the headers below the configured one
// replaces it; above it, the configured one stays.
func TestObserveHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		rpm, tpm       int
		headers        llm.RateLimits
		wantReq, wantT float64
	}{
		{"unknown quota learned", 0, 0, limits(600, 60000, -1, -1, 0), 10, 1000},
		{"configured too high", 1200, 0, limits(600, 0, -1, -1, 0), 10, 0},
		{"configured lower stays", 300, 30000, limits(600, 60000, -1, -1, 0), 5, 500},
		{"no limits sent", 600, 0, llm.RateLimits{}, 10, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := NewLocal(LocalConfig{RPM: tc.rpm, TPM: tc.tpm, SafetyMargin: -1, Clock: clock.NewFake(t0)})
			l.Observe(tc.headers)
			got := []float64{l.Rate(), l.TokenRate()}
			if diff := cmp.Diff([]float64{tc.wantReq, tc.wantT}, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("[Rate, TokenRate] (-want +got):\n%s", diff)
			}
		})
	}
}

func limits(rpm, tpm, remReq, remTok int, reset time.Duration) llm.RateLimits {
	return llm.RateLimits{
		Requests: llm.RateWindow{Limit: rpm, Remaining: remReq, Reset: reset},
		Tokens:   llm.RateWindow{Limit: tpm, Remaining: remTok, Reset: reset},
	}
}

// TestSettleReturnsUnusedTokens: a call charged 100 tokens at 100 tokens/s
// holds the next start for a second; settled at 10 used, the next starts
// after a tenth of that.
func TestSettleReturnsUnusedTokens(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		used int
		want time.Duration
	}{
		{"no usage reported", -1, time.Second},
		{"used all", 100, time.Second},
		{"used a tenth", 10, 100 * time.Millisecond},
		{"used more", 150, 1500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(t0)
			l := NewLocal(LocalConfig{TPM: 6000, SafetyMargin: -1, Clock: clk})
			if err := l.Wait(context.Background(), 100); err != nil {
				t.Fatal(err)
			}
			l.Settle(100, tc.used)
			at := advanceUntil(t, clk, 10*time.Millisecond, waitAsync(l, clk, 1))
			if got := at.Sub(t0); got < tc.want || got > tc.want+20*time.Millisecond {
				t.Errorf("next start at +%v, want +%v", at.Sub(t0), tc.want)
			}
		})
	}
}

// TestProbeRaisesLearnedCeiling: a ceiling learned from a 429 holds while
// workers wait, then is raised in growing steps until it is back at the
// configured quota.
func TestProbeRaisesLearnedCeiling(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(quotatest.Base)
	l := NewLocal(LocalConfig{RPM: 1200, SafetyMargin: -1, Clock: clk})
	l.Penalize(time.Second)
	if got := l.Rate(); got != 10 {
		t.Fatalf("Rate() after the 429 = %v, want 10", got)
	}
	d := quotatest.NewDriver(t, clk)
	d.Start(l, 4)
	d.RunUntil(quotatest.Base.Add(10 * time.Second))
	if got := l.Rate(); got != 10 {
		t.Errorf("Rate() 10 s after the 429 = %v, want 10 (held for ProbeEvery)", got)
	}
	d.RunUntil(quotatest.Base.Add(30 * time.Second))
	if got := l.Rate(); got <= 10 || got > 20 {
		t.Errorf("Rate() after one probe = %v, want in (10, 20]", got)
	}
	d.RunUntil(quotatest.Base.Add(4 * time.Minute))
	d.Stop()
	if got := l.Rate(); got != 20 {
		t.Errorf("Rate() after minutes of demand = %v, want 20 (the configured quota)", got)
	}
}

func BenchmarkWaitUnlimited(b *testing.B) {
	l := NewLocal(LocalConfig{})
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.Wait(ctx, 100); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkWaitLimitedUncontended(b *testing.B) {
	// A rate far above what the loop can reach: measures the bookkeeping,
	// not the pacing.
	l := NewLocal(LocalConfig{RPM: math.MaxInt32, TPM: math.MaxInt32})
	ctx := context.Background()
	for b.Loop() {
		if err := l.Wait(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
}

func TestLocalConformance(t *testing.T) {
	t.Parallel()
	quotatest.Run(t, func(_ *testing.T, cfg quotatest.Config) quotatest.Limiter {
		return NewLocal(LocalConfig{RPM: cfg.RPM, TPM: cfg.TPM, MinPenalty: cfg.MinPenalty, Clock: cfg.Clock})
	})
}

// TestObserveRemainingCountsOthersUse: the remaining count in the headers
// shows use of the quota this limiter did not start (another client); the
// window holds room for it, which comes back as that use leaves the window.
func TestObserveRemainingCountsOthersUse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		remaining int
		// wantAfter is the least time the second start waits after the
		// first.
		wantAfter, wantBefore time.Duration
	}{
		// 600 a minute: paced at 0.101 s.
		{"nobody else", 600, 100 * time.Millisecond, 150 * time.Millisecond},
		// The window is full of others' use: the second start waits until
		// enough of it leaves (a 60 s window drains 10 a second).
		{"others filled the window", 0, 500 * time.Millisecond, 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(t0)
			l := NewLocal(LocalConfig{Clock: clk})
			l.Observe(limits(600, 0, tc.remaining, -1, time.Minute))
			if err := l.Wait(context.Background(), 0); err != nil {
				t.Fatal(err)
			}
			at := advanceUntil(t, clk, 10*time.Millisecond, waitAsync(l, clk, 0))
			if got := at.Sub(t0); got < tc.wantAfter || got > tc.wantBefore {
				t.Errorf("second start at +%v, want in [%v, %v]", got, tc.wantAfter, tc.wantBefore)
			}
		})
	}
}
