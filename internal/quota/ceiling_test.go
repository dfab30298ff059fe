package quota

import (
	"math"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/quota/quotatest"
)

func TestCeilingShareAt(t *testing.T) {
	t.Parallel()
	at := quotatest.Base
	learned := Ceiling{Share: 0.5, At: at.UnixMilli()}
	stated := Ceiling{Share: 0.5, At: at.UnixMilli(), Fixed: true}
	trial := Ceiling{Share: 0.5, At: at.UnixMilli(), Quiet: at.Add(31 * time.Second).UnixMilli(), Trial: true}
	tests := []struct {
		name  string
		c     Ceiling
		after time.Duration
		want  float64
	}{
		{name: "none", c: Ceiling{}, want: 1},
		{name: "learned, at once", c: learned, want: 0.5},
		{name: "learned, one window later: first probe, 5 %", c: learned, after: time.Minute, want: 0.525},
		{name: "learned, two windows later: then 10 %", c: learned, after: 2 * time.Minute, want: 0.5775},
		{name: "learned, three windows later: then 20 %", c: learned, after: 3 * time.Minute, want: 0.693},
		{name: "learned, long after: back to the configured quota", c: learned, after: time.Hour, want: 1},
		{name: "stated: not probed", c: stated, after: 4 * time.Minute, want: 0.5},
		{name: "stated: lapses", c: stated, after: statedHold, want: 1},
		{name: "on trial: held through its quiet time", c: trial, after: 34 * time.Second, want: 0.5},
		{name: "on trial: 5 % a step after", c: trial, after: 36 * time.Second, want: 0.525},
		{name: "on trial: then 10 %, 20 %, 40 %", c: trial, after: 51 * time.Second, want: 0.5 * 1.05 * 1.1 * 1.2 * 1.4},
		{name: "on trial: whole again within a minute", c: trial, after: 56 * time.Second, want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.c.ShareAt(at.Add(tc.after)); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("ShareAt(+%v) = %v, want %v", tc.after, got, tc.want)
			}
		})
	}
}

// TestCeilingBudgetSpreads: a share that is not a whole number of
// requests a second is spread, so the seconds together start the
// ceiling's rate, not its floor; tokens keep their meaning.
func TestCeilingBudgetSpreads(t *testing.T) {
	t.Parallel()
	at := quotatest.Base.Unix()
	c := Ceiling{Share: 0.5, At: at * 1000}
	total := Amount{}
	for sec := at; sec < at+20; sec++ {
		b := c.Budget(Limit{Requests: 19, Tokens: 1000}, sec)
		if b.Requests < 9 || b.Requests > 10 {
			t.Errorf("second %d: %d requests, want 9 or 10", sec-at, b.Requests)
		}
		total.Requests += b.Requests
		total.Tokens += b.Tokens
	}
	if total.Requests != 190 || total.Tokens != 10000 {
		t.Errorf("20 seconds hand out %+v, want 190 requests (9.5 a second) and 10,000 tokens", total)
	}
	if b := c.Budget(Limit{Requests: 19}, at); b.Tokens != 0 {
		t.Errorf("tokens not counted became %d", b.Tokens)
	}
	if b := (Ceiling{}).Budget(Limit{Requests: 19, Tokens: 7}, at); b != (Amount{Requests: 19, Tokens: 7}) {
		t.Errorf("no ceiling: budget %+v, want the limit", b)
	}
}

// TestConfiguredBudgetSpreads: a configured quota whose rate a second is
// not a whole number (600 a minute, 9.84 a second after the margin and
// the 61-second rule) is spread too, instead of rounded down to 9 (a job
// paced 12 % under its bound): every 61 consecutive seconds, the most a
// 60 s window touches, hand out at most the quota, and at least 98 % of it.
func TestConfiguredBudgetSpreads(t *testing.T) {
	t.Parallel()
	for _, rpm := range []int{61, 600, 1200, 2000, 3000, 59999} {
		limit := Limit{Requests: PerSecond(rpm, DefaultSafetyMargin)}
		at := quotatest.Base.Unix()
		var budgets []int
		for sec := at; sec < at+300; sec++ {
			budgets = append(budgets, (Ceiling{}).Budget(limit, sec).Requests)
		}
		for i := 0; i+61 <= len(budgets); i++ {
			sum := 0
			for _, b := range budgets[i : i+61] {
				sum += b
			}
			if sum > rpm {
				t.Fatalf("%d rpm: seconds %d to %d hand out %d, more than the quota", rpm, i, i+60, sum)
			}
			if float64(sum) < 0.98*float64(rpm) {
				t.Fatalf("%d rpm: seconds %d to %d hand out %d, under 98 %% of the quota", rpm, i, i+60, sum)
			}
		}
	}
}

func TestCutAfter429(t *testing.T) {
	t.Parallel()
	now := quotatest.Base
	ms := func(d time.Duration) int64 { return now.Add(d).UnixMilli() }
	tests := []struct {
		name      string
		c         Ceiling
		pause     time.Duration
		wantCut   bool
		wantShare float64
		wantTrial bool
	}{
		{name: "first 429: half, on trial", c: Ceiling{}, pause: 3 * time.Second, wantCut: true, wantShare: 0.5, wantTrial: true},
		{name: "a 429 while a trial climbs confirms its share", c: Ceiling{Share: 0.5, At: ms(-40 * time.Second), Quiet: ms(-9 * time.Second), Trial: true}, wantCut: true, wantShare: 0.5},
		{name: "a 429 after a trial climbed back: a new event, on trial", c: Ceiling{Share: 0.5, At: ms(-2 * time.Minute), Quiet: ms(-89 * time.Second), Trial: true}, wantCut: true, wantShare: 0.5, wantTrial: true},
		{name: "same event (quiet time)", c: Ceiling{Share: 0.5, At: ms(-5 * time.Second), Quiet: ms(time.Second)}, wantCut: false},
		{name: "learned ceiling in force, no probe yet: 5 % under it", c: Ceiling{Share: 0.5, At: ms(-30 * time.Second), Quiet: ms(-20 * time.Second)}, wantCut: true, wantShare: 0.475},
		{name: "after a probe: back to the step before", c: Ceiling{Share: 0.5, At: ms(-150 * time.Second), Quiet: ms(-140 * time.Second)}, wantCut: true, wantShare: 0.525},
		{name: "ceiling probed back to the quota: a new event, half", c: Ceiling{Share: 0.5, At: ms(-time.Hour), Quiet: ms(-time.Hour)}, wantCut: true, wantShare: 0.5, wantTrial: true},
		{name: "stated by the provider: a 429 is others' use", c: Ceiling{Share: 0.5, At: ms(-time.Minute), Quiet: ms(-time.Minute), Fixed: true}, wantCut: false},
		{name: "floor", c: Ceiling{Share: minShare, At: ms(-30 * time.Second), Quiet: ms(-20 * time.Second)}, wantCut: true, wantShare: minShare},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			next, cut := cutAfter429(tc.c, now, tc.pause)
			if cut != tc.wantCut {
				t.Fatalf("cut = %v, want %v (%+v)", cut, tc.wantCut, next)
			}
			if !cut {
				return
			}
			if math.Abs(next.Share-tc.wantShare) > 1e-9 || next.At != now.UnixMilli() || next.Trial != tc.wantTrial {
				t.Errorf("next = %+v, want share %v set now, on trial %v", next, tc.wantShare, tc.wantTrial)
			}
			if want := now.Add(tc.pause + maxLeaseSeconds*time.Second).UnixMilli(); next.Quiet != want {
				t.Errorf("quiet until +%v, want the pause and a lease's reach (+%v)", time.Duration(next.Quiet-now.UnixMilli())*time.Millisecond, tc.pause+maxLeaseSeconds*time.Second)
			}
		})
	}
}

// TestSharedCutReachesTheFleet: one process's 429 lowers the ceiling in
// the store with one write; another process learns it from its next lease
// and paces to it, with no write of its own; a second 429 of the same
// event writes nothing.
func TestSharedCutReachesTheFleet(t *testing.T) {
	t.Parallel()
	store := NewMemLeaser()
	clk := clock.NewFake(quotatest.Base)
	newShared := func() *Shared {
		s, err := NewShared(store, SharedConfig{RPM: 1200, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := newShared(), newShared()
	for _, s := range []*Shared{a, b} {
		if err := s.Wait(t.Context(), 0); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(1500 * time.Millisecond)
	a.Penalize(2 * time.Second)
	if got := store.Ceiling(); got.Share != 0.5 {
		t.Fatalf("store holds %+v after a 429, want share 0.5", got)
	}
	a.Penalize(2 * time.Second) // the same event
	if n := store.CeilingWrites(); n != 1 {
		t.Errorf("%d ceiling writes, want 1", n)
	}
	if b.Rate() != b.Limit() {
		t.Fatalf("b paces at %v before its next lease, want the configured %v (it cannot know yet)", b.Rate(), b.Limit())
	}
	d := quotatest.NewDriver(t, clk)
	d.Start(b, 4)
	d.RunUntil(quotatest.Base.Add(20 * time.Second))
	starts := d.Stop()
	if got, want := b.Rate(), b.Limit()/2; math.Abs(got-want) > 1e-9 {
		t.Errorf("b paces at %v after leasing, want %v (the fleet's ceiling)", got, want)
	}
	if got, want := quotatest.MaxInWindow(starts[len(starts)/2:], 5*time.Second), int(math.Ceil(b.Limit()/2*5))+1; got > want {
		t.Errorf("b started %d in 5 s once it knew, want at most %d (%.2f a second)", got, want, b.Limit()/2)
	}
	if n := store.CeilingWrites(); n != 1 {
		t.Errorf("%d ceiling writes after b learned, want still 1", n)
	}
}

// TestSharedObserveStatesTheCeiling: a rate-limit header stating a lower
// limit than configured lowers the fleet's ceiling to it (a higher one
// does nothing), and a 429 under it does not cut further.
func TestSharedObserveStatesTheCeiling(t *testing.T) {
	t.Parallel()
	store := NewMemLeaser()
	clk := clock.NewFake(quotatest.Base)
	s, err := NewShared(store, SharedConfig{RPM: 1200, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	s.Observe(llm.RateLimits{Requests: llm.RateWindow{Limit: 5000, Remaining: 4000}})
	if n := store.CeilingWrites(); n != 0 {
		t.Fatalf("a limit above the configured one wrote %d ceilings", n)
	}
	s.Observe(llm.RateLimits{Requests: llm.RateWindow{Limit: 600, Remaining: 500}})
	if got, want := s.Rate(), PerSecond(600, DefaultSafetyMargin); math.Abs(got-want) > 1e-9 {
		t.Errorf("rate %v after a 600/min header, want %v", got, want)
	}
	if got := store.Ceiling(); !got.Fixed || got.Share >= 1 {
		t.Errorf("store holds %+v, want the stated ceiling", got)
	}
	clk.Advance(2 * time.Second)
	s.Penalize(time.Second)
	s.Observe(llm.RateLimits{Requests: llm.RateWindow{Limit: 600, Remaining: 0}})
	if n := store.CeilingWrites(); n != 1 {
		t.Errorf("%d ceiling writes, want 1 (the header; neither the 429 nor the same limit again)", n)
	}
	if got := s.Rate(); got > 10 || got < 9 {
		t.Errorf("rate %v after the 429, want the stated 9.9", got)
	}
}
