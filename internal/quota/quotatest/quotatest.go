// Package quotatest is the conformance suite for the limiter port
// (pipeline.Limiter): every limiter's tests call Run, so that the generator
// can rely on one behaviour whichever limiter paces it (quota.Local on one
// machine, quota.Shared over the in-memory or the DynamoDB lease store).
//
// The suite drives the limiter on a clock.Fake and never sleeps: workers
// call Wait in goroutines, and the driver advances the fake time only when
// every live worker is parked on the clock, so each run is deterministic.
// What it asks of a limiter:
//   - Wait waits only on the Clock it was given (and on its own short
//     critical sections or store calls), so that a parked worker shows as a
//     pending After on the fake clock.
//   - RPM is at least 120 (quota.Shared needs one request a second after
//     its margin).
//   - No more than RPM starts in any 60 s window and no more than RPM/60 + 1
//     in any 1 s window, while the limiter still starts at least 80 % of
//     RPM/60 a second when workers are always waiting.
//   - Penalize(d) starts nothing before max(d, MinPenalty) has passed, and
//     invalidates slots handed out before it.
//   - A 429 lowers the rate after its pause too: the quota may be lower
//     than configured (Local learns a ceiling, Shared a deployment-wide
//     one).
//   - Wait returns the context's error when it ends before the call, while
//     pacing and during a pause.
//   - Under a TPM quota, no more than TPM tokens (as charged by Wait and
//     corrected by Settle) start in any 60 s window, while at least 80 % of
//     TPM/60 a second are used when workers are always waiting; tokens a
//     call did not use (Settle) go back to the quota.
package quotatest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
)

// Limiter is the port under test (pipeline.Limiter).
type Limiter interface {
	Wait(ctx context.Context, tokens int) error
	Settle(charged, used int)
	Observe(rl llm.RateLimits)
	Penalize(retryAfter time.Duration)
}

// Config is what a limiter under test is built with.
type Config struct {
	// RPM is the quota; at least 60.
	RPM int
	// TPM is the tokens-per-minute quota; 0 means none.
	TPM int
	// MinPenalty is the pause after a 429 without a usable Retry-After.
	MinPenalty time.Duration
	// Clock is the fake clock the limiter must tell the time and wait on.
	Clock *clock.Fake
}

// NewLimiter returns a limiter for cfg that shares no state with any other
// limiter the suite builds (a fresh lease store, table or quota name).
type NewLimiter func(t *testing.T, cfg Config) Limiter

// Base is the fake clock's starting time: on a calendar second, as a
// process usually is not, so that the second-based limiters meet their
// worst case (a fresh budget at once).
var Base = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// Run runs the suite against the limiters newLimiter builds.
func Run(t *testing.T, newLimiter NewLimiter) {
	t.Run("PacingNeverExceedsTheRate", func(t *testing.T) {
		t.Parallel()
		for _, rpm := range []int{600, 1200, 6000} {
			t.Run(fmt.Sprint(rpm), func(t *testing.T) {
				t.Parallel()
				testPacing(t, newLimiter, rpm)
			})
		}
	})
	t.Run("PenalizeHonoursRetryAfter", func(t *testing.T) {
		t.Parallel()
		testPenalize(t, newLimiter)
	})
	t.Run("PenalizeInvalidatesSlotsHandedOut", func(t *testing.T) {
		t.Parallel()
		testPenalizeMidRun(t, newLimiter)
	})
	t.Run("PenalizeLowersTheRate", func(t *testing.T) {
		t.Parallel()
		testPenalizeLowers(t, newLimiter)
	})
	t.Run("ContextEnds", func(t *testing.T) {
		t.Parallel()
		testContext(t, newLimiter)
	})
	t.Run("TokensPerMinuteBinds", func(t *testing.T) {
		t.Parallel()
		for _, used := range []int{100, 25} {
			t.Run(fmt.Sprintf("charged 100 used %d", used), func(t *testing.T) {
				t.Parallel()
				testTokens(t, newLimiter, used)
			})
		}
	})
}

// testTokens: calls charged 100 tokens under a quota of 60,000 tokens and
// 6,000 requests a minute are held by the tokens (10 a second when each
// uses what it was charged); when each uses only used tokens, Settle gives
// the rest back and more calls start, yet the tokens used stay under TPM.
func testTokens(t *testing.T, newLimiter NewLimiter, used int) {
	const rpm, tpm, charged = 6000, 60000, 100
	clk := clock.NewFake(Base)
	l := newLimiter(t, Config{RPM: rpm, TPM: tpm, MinPenalty: time.Second, Clock: clk})
	d := NewDriver(t, clk)
	d.Tokens, d.Used = charged, used
	d.StartCalling(l, 16, 200*time.Millisecond)
	const run = 90 * time.Second
	d.RunUntil(Base.Add(run))
	starts := d.Stop()
	// Every start used `used` tokens: the window's token count is that
	// times its starts.
	if got := MaxInWindow(starts, time.Minute) * used; got > tpm {
		t.Errorf("%d tokens used in one 60 s window, want <= %d (TPM)", got, tpm)
	}
	if got, limit := MaxInWindow(starts, time.Second)*used, tpm/60+charged; got > limit {
		t.Errorf("%d tokens in one 1 s window, want <= %d (a second's share and one call)", got, limit)
	}
	least := int(0.8 * float64(tpm) / 60 * run.Seconds())
	if got := len(starts) * used; got < least {
		t.Errorf("%d tokens used in %v with workers always waiting (%d calls), want >= %d (80%% of TPM)", got, run, len(starts), least)
	}
}

func testPacing(t *testing.T, newLimiter NewLimiter, rpm int) {
	clk := clock.NewFake(Base)
	l := newLimiter(t, Config{RPM: rpm, MinPenalty: time.Second, Clock: clk})
	d := NewDriver(t, clk)
	d.Start(l, 16)
	const run = 90 * time.Second
	d.RunUntil(Base.Add(run))
	starts := d.Stop()

	if got, limit := MaxInWindow(starts, time.Second), rpm/60+1; got > limit {
		t.Errorf("%d starts in one 1 s window, want <= %d", got, limit)
	}
	if got := MaxInWindow(starts, time.Minute); got > rpm {
		t.Errorf("%d starts in one 60 s window, want <= %d (RPM)", got, rpm)
	}
	if got, least := len(starts), int(0.8*float64(rpm)/60*run.Seconds()); got < least {
		t.Errorf("%d starts in %v with workers always waiting, want >= %d (80%% of the quota)", got, run, least)
	}
}

func testPenalize(t *testing.T, newLimiter NewLimiter) {
	tests := []struct {
		name       string
		retryAfter time.Duration
		minPenalty time.Duration
		wantPause  time.Duration
	}{
		{name: "Retry-After", retryAfter: 7 * time.Second, minPenalty: time.Second, wantPause: 7 * time.Second},
		{name: "no Retry-After: MinPenalty", retryAfter: 0, minPenalty: 3 * time.Second, wantPause: 3 * time.Second},
		{name: "short Retry-After: MinPenalty", retryAfter: 100 * time.Millisecond, minPenalty: 2 * time.Second, wantPause: 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(Base)
			l := newLimiter(t, Config{RPM: 600, MinPenalty: tc.minPenalty, Clock: clk})
			if err := l.Wait(t.Context(), 0); err != nil {
				t.Fatalf("first Wait: %v", err)
			}
			clk.Advance(250 * time.Millisecond)
			penalized := clk.Now()
			l.Penalize(tc.retryAfter)
			d := NewDriver(t, clk)
			d.Start(l, 4)
			d.RunUntil(penalized.Add(tc.wantPause + 2*time.Second))
			starts := d.Stop()
			if len(starts) == 0 {
				t.Fatalf("nothing started in the 2 s after a %v pause", tc.wantPause)
			}
			if first := slices.MinFunc(starts, time.Time.Compare); first.Before(penalized.Add(tc.wantPause)) {
				t.Errorf("a request started %v after Penalize(%v), want none before %v", first.Sub(penalized), tc.retryAfter, tc.wantPause)
			}
		})
	}
}

// testPenalizeMidRun: a 429 while workers hold slots in the near future
// stops them all.
func testPenalizeMidRun(t *testing.T, newLimiter NewLimiter) {
	clk := clock.NewFake(Base)
	l := newLimiter(t, Config{RPM: 1200, MinPenalty: time.Second, Clock: clk})
	d := NewDriver(t, clk)
	d.Start(l, 8)
	d.RunUntil(Base.Add(2*time.Second + 300*time.Millisecond))
	penalized := clk.Now()
	l.Penalize(5 * time.Second)
	d.RunUntil(penalized.Add(8 * time.Second))
	starts := d.Stop()
	var inPause []time.Duration
	after := 0
	for _, s := range starts {
		switch {
		case !s.Before(penalized) && s.Before(penalized.Add(5*time.Second)):
			inPause = append(inPause, s.Sub(penalized))
		case !s.Before(penalized.Add(5 * time.Second)):
			after++
		}
	}
	if len(inPause) > 0 {
		t.Errorf("%d requests started during the 5 s pause, at %v after Penalize", len(inPause), inPause)
	}
	if after == 0 {
		t.Error("nothing started after the pause ended")
	}
}

// testPenalizeLowers: a 429 after a few seconds at the configured rate
// (the quota was configured too high) does more than pause: once the pause
// is over, the limiter starts at most three quarters of the configured
// rate for the next 15 s (both limiters cut to about half), and still
// starts work.
func testPenalizeLowers(t *testing.T, newLimiter NewLimiter) {
	const rpm = 1200 // 20 a second
	clk := clock.NewFake(Base)
	l := newLimiter(t, Config{RPM: rpm, MinPenalty: time.Second, Clock: clk})
	d := NewDriver(t, clk)
	d.Start(l, 16)
	d.RunUntil(Base.Add(5 * time.Second))
	l.Penalize(2 * time.Second)
	resume := clk.Now().Add(2 * time.Second)
	d.RunUntil(resume.Add(15 * time.Second))
	n := 0
	for _, s := range d.Stop() {
		if !s.Before(resume) {
			n++
		}
	}
	if most := rpm / 60 * 15 * 3 / 4; n > most {
		t.Errorf("%d starts in the 15 s after a 429's pause, want at most %d (three quarters of the configured rate)", n, most)
	}
	if least := rpm / 60 * 15 / 4; n < least {
		t.Errorf("%d starts in the 15 s after a 429's pause, want at least %d (a quarter of the configured rate)", n, least)
	}
}

func testContext(t *testing.T, newLimiter NewLimiter) {
	tests := []struct {
		name string
		// prepare brings the limiter to where the next Wait blocks.
		prepare func(t *testing.T, l Limiter)
		// cancelFirst cancels before Wait is called.
		cancelFirst bool
	}{
		{name: "cancelled before the call", cancelFirst: true},
		{name: "cancelled while pacing", prepare: func(t *testing.T, l Limiter) {
			if err := l.Wait(t.Context(), 0); err != nil {
				t.Fatalf("first Wait: %v", err)
			}
		}},
		{name: "cancelled during a pause", prepare: func(_ *testing.T, l Limiter) { l.Penalize(time.Hour) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// RPM 120: after one start the next is half a second or more
			// away on a clock that does not move, so only the context can
			// end Wait.
			clk := clock.NewFake(Base)
			l := newLimiter(t, Config{RPM: 120, MinPenalty: time.Second, Clock: clk})
			if tc.prepare != nil {
				tc.prepare(t, l)
			}
			ctx, cancel := context.WithCancel(t.Context())
			if tc.cancelFirst {
				cancel()
				if err := l.Wait(ctx, 0); !errors.Is(err, context.Canceled) {
					t.Fatalf("Wait = %v, want context.Canceled", err)
				}
				return
			}
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- l.Wait(ctx, 0) }()
			waitFor(t, "Wait to park on the clock", func() bool { return clk.Waiters() > 0 })
			select {
			case err := <-done:
				t.Fatalf("Wait returned %v before the clock moved", err)
			default:
			}
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Wait = %v, want context.Canceled", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Wait did not return after its context was cancelled")
			}
		})
	}
}

// Driver runs workers that call Wait in a loop on a fake clock and records
// the fake time of every start. It advances the clock only while every live
// worker is parked on it.
type Driver struct {
	t      *testing.T
	clk    *clock.Fake
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	live   atomic.Int64
	mu     sync.Mutex
	starts []time.Time
	// Tokens is what each Wait is charged, and Used what each call then
	// reports to Settle (when Tokens > 0). Set them before starting.
	Tokens, Used int
	// Seed, when not 0, shuffles the order in which workers due at the
	// same instant wake (the same order for the same seed): a fleet's
	// processes interleave differently from run to run, and a figure
	// taken over several seeds is not one order's luck.
	Seed int64
	rng  *rand.Rand
}

// NewDriver returns a driver on clk.
func NewDriver(t *testing.T, clk *clock.Fake) *Driver {
	ctx, cancel := context.WithCancel(t.Context())
	return &Driver{t: t, clk: clk, ctx: ctx, cancel: cancel}
}

// Start starts n workers on l, each calling Wait again as soon as it
// returns. Workers of several limiters (processes sharing a quota) may
// share one driver, and so one clock.
func (d *Driver) Start(l Limiter, n int) { d.StartCalling(l, n, 0) }

// StartCalling starts n workers on l that each make a model call of
// latency (a wait on the clock) after every start, as a generator does:
// a process held back by its concurrency rather than by the quota.
//
// Each worker is let run until it parks on the clock before the next one
// starts, so that they queue in the limiter in one order, every run.
func (d *Driver) StartCalling(l Limiter, n int, latency time.Duration) {
	d.t.Helper()
	for range n {
		d.Settle()
		d.live.Add(1)
		d.wg.Go(func() {
			defer d.live.Add(-1)
			for {
				if err := l.Wait(d.ctx, d.Tokens); err != nil {
					if d.ctx.Err() == nil {
						d.t.Errorf("Wait: %v", err)
					}
					return
				}
				d.mu.Lock()
				d.starts = append(d.starts, d.clk.Now())
				d.mu.Unlock()
				if latency > 0 {
					select {
					case <-d.ctx.Done():
						return
					case <-d.clk.After(latency):
					}
				}
				if d.Tokens > 0 {
					l.Settle(d.Tokens, d.Used)
				}
			}
		})
	}
}

// Settle waits until every live worker is parked on the clock.
func (d *Driver) Settle() {
	d.t.Helper()
	WaitParked(d.t, d.clk, d.live.Load)
}

// WaitParked waits until as many goroutines wait on clk as live says are
// live (or none is), failing t after 20 s: the step before a test that
// drives its own workers on a fake clock advances it.
func WaitParked(t testing.TB, clk *clock.Fake, live func() int64) {
	t.Helper()
	waitFor(t, "the workers to park on the clock", func() bool {
		n := live()
		return n == 0 || int64(clk.Waiters()) >= n
	})
}

// RunUntil advances the clock from timer to timer up to end, waking one
// worker at a time (clock.Fake.Step) and letting it park again before the
// next: workers due at the same instant run in the order they parked, or
// in one Seed shuffles. Either way a run's starts, and the store writes
// behind them, are the same every time. (Woken together, they raced for
// the limiter, and a fleet's writes per call varied from run to run.)
func (d *Driver) RunUntil(end time.Time) {
	d.t.Helper()
	var pick func(int) int
	if d.Seed != 0 {
		if d.rng == nil {
			d.rng = rand.New(rand.NewPCG(uint64(d.Seed), 0))
		}
		pick = d.rng.IntN
	}
	for {
		d.Settle()
		if !d.clk.Step(end, pick) {
			return
		}
	}
}

// Starts returns how many starts the workers made so far.
func (d *Driver) Starts() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.starts)
}

// Stop ends the workers and returns the start times, in order.
func (d *Driver) Stop() []time.Time {
	d.cancel()
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.SortedFunc(slices.Values(d.starts), time.Time.Compare)
}

// MaxInWindow returns the largest number of times in any half-open window
// [t, t+w) (the worst windows start at one of the times).
func MaxInWindow(times []time.Time, w time.Duration) int {
	sorted := slices.SortedFunc(slices.Values(times), time.Time.Compare)
	best, j := 0, 0
	for i := range sorted {
		for j < len(sorted) && sorted[j].Sub(sorted[i]) < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for spins := 0; !cond(); spins++ {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		// Yield first (the workers are usually one step away), then poll
		// gently, e.g. while a worker waits on a store round trip.
		if spins < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}
