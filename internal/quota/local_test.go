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

func TestWaitUnlimitedNeverBlocks(t *testing.T) {
	t.Parallel()
	// A fake clock that never advances: any wait would hang until the
	// test's deadline.
	l := NewLocal(LocalConfig{Clock: clock.NewFake(t0)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 10000 {
		if err := l.Wait(ctx); err != nil {
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
				if err := l.Wait(context.Background()); err != nil {
					t.Fatalf("first Wait: %v", err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tc.cancel(cancel)
			if err := l.Wait(ctx); !errors.Is(err, context.Canceled) {
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
	if err := l.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want context.DeadlineExceeded", err)
	}
}

// waitAsync runs Wait in a goroutine and reports the fake time at which it
// returned.
func waitAsync(l *Local, clk *clock.Fake) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		if err := l.Wait(context.Background()); err != nil {
			panic(err) // background ctx: cannot happen
		}
		out <- clk.Now()
	}()
	return out
}

// advanceUntil advances clk in steps until the Wait behind ch returns, and
// returns the fake time it returned at.
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
		clk.Advance(step)
		runtime.Gosched()
	}
}

func TestPenalizeBlocksThenRecovers(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{RPM: 600, SafetyMargin: -1, Clock: clk}) // 10/s
	if err := l.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	l.Penalize(5 * time.Second)
	if got := l.Rate(); got != 5 {
		t.Errorf("Rate() after Penalize = %v, want 5 (halved)", got)
	}
	at := advanceUntil(t, clk, 50*time.Millisecond, waitAsync(l, clk))
	if at.Before(t0.Add(5 * time.Second)) {
		t.Fatalf("Wait returned at +%v, want no start before the 5 s Retry-After", at.Sub(t0))
	}

	// From the end of the pause the rate climbs linearly: +5/s over the
	// default 60 s Recovery, then stays at the configured 10/s.
	pauseEnd := t0.Add(5 * time.Second)
	type point struct {
		After time.Duration
		Rate  float64
	}
	var got []point
	for _, after := range []time.Duration{0, 30 * time.Second, 60 * time.Second, 120 * time.Second} {
		if target := pauseEnd.Add(after); clk.Now().Before(target) {
			clk.Advance(target.Sub(clk.Now()))
		}
		got = append(got, point{after, l.Rate()})
	}
	want := []point{{0, 5}, {30 * time.Second, 7.5}, {60 * time.Second, 10}, {120 * time.Second, 10}}
	// The first point is read a little after the pause ended, when Wait
	// returned, so allow a sliver of increase.
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 0.1)); diff != "" {
		t.Errorf("rate after the pause (-want +got):\n%s", diff)
	}
}

func TestPenalizeInvalidatesReservations(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{RPM: 60, SafetyMargin: -1, Clock: clk}) // 1/s
	if err := l.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	ch := waitAsync(l, clk)
	// The waiter holds a reservation for +1 s once the limiter's tokens go
	// negative; only then can the 429 land "in the middle" of its wait.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		tokens := l.lim.TokensAt(clk.Now())
		l.mu.Unlock()
		if tokens < 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("waiter never reserved a slot")
		}
		runtime.Gosched()
	}
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
	if got := l.Rate(); got >= 50 || got < 25 {
		t.Errorf("Rate() after a second 429 = %v, want in [25, 50)", got)
	}
}

func TestPenalizeNeverExceedsConfiguredRate(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{RPM: 120, Clock: clk})
	configured := l.Rate()
	steps := []time.Duration{0, time.Millisecond, 500 * time.Millisecond, 2 * time.Second, time.Minute, 10 * time.Minute}
	for i := range 200 {
		switch i % 3 {
		case 0:
			l.Penalize(steps[i%len(steps)])
		default:
			clk.Advance(steps[(i*7)%len(steps)])
		}
		if got := l.Rate(); got > configured+1e-9 || got <= 0 {
			t.Fatalf("step %d: Rate() = %v, want in (0, %v]", i, got, configured)
		}
	}
	clk.Advance(time.Hour)
	if got := l.Rate(); math.Abs(got-configured) > 1e-9 {
		t.Errorf("Rate() an hour after the last 429 = %v, want back at %v", got, configured)
	}
}

func TestPenalizeHugeRetryAfterIsBounded(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{RPM: 600, Clock: clk})
	l.Penalize(math.MaxInt64)
	at := advanceUntil(t, clk, 10*time.Minute, waitAsync(l, clk))
	if at.Sub(t0) > 2*time.Hour {
		t.Errorf("Wait returned at +%v, want the pause capped near an hour", at.Sub(t0))
	}
}

func TestPenalizeFindsUnknownQuota(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	l := NewLocal(LocalConfig{Clock: clk})
	// 20 requests/s for 10 s, unpaced.
	for range 200 {
		if err := l.Wait(context.Background()); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		clk.Advance(50 * time.Millisecond)
	}
	l.Penalize(time.Second)
	if got := l.Rate(); math.Abs(got-10) > 1 {
		t.Fatalf("Rate() after the first 429 = %v, want about 10 (half the observed 20/s)", got)
	}
	// After the pause, starts are paced: 10 Waits take about 1 s.
	clk.Advance(time.Second)
	start := clk.Now()
	var last time.Time
	for range 10 {
		last = advanceUntil(t, clk, 10*time.Millisecond, waitAsync(l, clk))
	}
	if spent := last.Sub(start); spent < 800*time.Millisecond {
		t.Errorf("10 starts after the cut took %v of fake time, want them paced near 10/s", spent)
	}
}

func BenchmarkWaitUnlimited(b *testing.B) {
	l := NewLocal(LocalConfig{})
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkWaitLimitedUncontended(b *testing.B) {
	// A rate far above what the loop can reach: measures the bookkeeping,
	// not the pacing.
	l := NewLocal(LocalConfig{RPM: math.MaxInt32})
	ctx := context.Background()
	for b.Loop() {
		if err := l.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func TestLocalConformance(t *testing.T) {
	t.Parallel()
	quotatest.Run(t, func(_ *testing.T, cfg quotatest.Config) quotatest.Limiter {
		return NewLocal(LocalConfig{RPM: cfg.RPM, MinPenalty: cfg.MinPenalty, Clock: cfg.Clock})
	})
}
