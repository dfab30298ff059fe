package quota

import (
	"math"
	"time"
)

// Ceiling is what a fleet of Shared limiters learned about a shared quota
// configured too high: the share of the configured per-second budgets the
// whole deployment may lease. The lease store keeps the newest one (the
// one with the latest At) beside the budgets, and every lease honours it,
// so one process's 429 slows every process.
//
// A ceiling learned from a 429 rises again by itself: it is probed upward
// every fleetProbeEvery after At, by 5 % of itself and then doubling steps,
// as Local probes, computed from At alone so that probing costs the store
// no writes. The first cut after a quiet spell is on trial: one 429 may be
// a stray (a provider's hiccup, another client's burst) and says nothing
// of the quota, so the ceiling climbs back to the whole quota within a
// window of the 429 (trialProbeEvery steps from the end of its quiet
// time) unless another 429 confirms it; see cutAfter429. A ceiling stated by the provider's rate-limit headers (Fixed)
// holds for statedHold instead; the answers that follow state it again.
// The zero Ceiling is none: the configured budgets apply.
type Ceiling struct {
	// Share is the fraction of the configured budgets that applied at At,
	// in (0, 1].
	Share float64
	// At is when it was set, in Unix milliseconds; 0 means no ceiling.
	At int64
	// Quiet is until when (Unix milliseconds) 429s belong to the event
	// that set it: they answer calls made before every process knew of it,
	// so they do not cut again.
	Quiet int64
	// Fixed marks a ceiling the provider stated (headers): it is not
	// probed, and lapses after statedHold.
	Fixed bool
	// Trial marks a first cut on trial: from Quiet on it climbs back to 1
	// in trialProbeEvery steps, and a 429 that comes meanwhile makes it a
	// learned ceiling at Share.
	Trial bool
}

// Tuning of the fleet's ceiling.
const (
	// firstCutShare is what the first 429 after a quiet spell leaves of the
	// budget that applied: a shared 429 does not say by how much the fleet
	// is over, and half errs on the side of the quota (probing recovers it
	// within a minute or two). Local never cuts below half either.
	firstCutShare = 0.5
	// repeatCutShare is what a 429 leaves of a learned ceiling still in
	// force that was not probed yet: it was already corrected, so cutting
	// a little below it is enough (after a probe, the cut goes back to the
	// step before instead).
	repeatCutShare = 0.95
	// minShare bounds the ceiling from below, so that the fleet keeps
	// calling (and probing) whatever 429s another client causes.
	minShare = 0.01
	// statedHold is how long a ceiling stated by headers holds: the
	// provider may raise its quota, and an answer's headers state the
	// limit again within a call once it lapses.
	statedHold = 5 * time.Minute
	// fleetProbeEvery is how long each step of the ceiling holds before
	// the next: a whole window, unlike Local's DefaultProbeEvery. Local
	// keeps its own log of the window and never lets a probe overfill it;
	// the fleet has only per-second budgets, so a probe that goes too far
	// shows (as a 429) only once the window has filled at the new rate,
	// and probing again before that would overshoot further.
	fleetProbeEvery = DefaultWindow
	// cutEvery bounds the ceiling writes of one process: at most one a
	// second.
	cutEvery = time.Second
	// trialProbeEvery is how long each step of a ceiling on trial holds,
	// from the end of its quiet time: the probe steps (5 %, 10 %, 20 %,
	// 40 %, 80 %) take a halved quota back to the whole in five steps, 25 s,
	// so that the fleet is back at full rate within a minute of a single
	// 429 (its quiet time being the 429's pause and maxLeaseSeconds). A
	// quota that is real answers the climb with a 429 within a few steps,
	// which confirms the cut.
	trialProbeEvery = 5 * time.Second
)

// ShareAt is the share of the configured budgets the ceiling allows at t:
// 1 when there is none or it has probed its way back to the configured
// quota.
func (c Ceiling) ShareAt(t time.Time) float64 {
	if c.At == 0 || c.Share <= 0 {
		return 1
	}
	elapsed := time.Duration(t.UnixMilli()-c.At) * time.Millisecond
	if c.Fixed {
		if elapsed >= statedHold {
			return 1
		}
		return min(c.Share, 1)
	}
	if c.Trial {
		return c.trialShare(t)
	}
	share, _ := c.probed(elapsed)
	return share
}

// trialShare is a ceiling on trial's share at t: Share until its quiet
// time ends, then up by Local's probe steps every trialProbeEvery.
func (c Ceiling) trialShare(t time.Time) float64 {
	share, step := c.Share, firstProbeStep
	for k := time.Duration(t.UnixMilli()-c.Quiet) * time.Millisecond / trialProbeEvery; k > 0 && share < 1; k-- {
		share *= 1 + step
		step = min(2*step, maxProbeStep)
	}
	return min(share, 1)
}

// probed is a learned ceiling's share elapsed after it was set, and the
// share of the step before (0 while no probe was made).
func (c Ceiling) probed(elapsed time.Duration) (share, before float64) {
	share, step := c.Share, firstProbeStep
	for k := elapsed / fleetProbeEvery; k > 0 && share < 1; k-- {
		before = share
		share *= 1 + step
		step = min(2*step, maxProbeStep)
	}
	return min(share, 1), before
}

// Limit is a shared quota's configured budget a second: requests and
// model tokens, not necessarily whole numbers (Budget spreads them over
// the seconds). Tokens of 0 means tokens are not counted.
type Limit struct {
	Requests, Tokens float64
}

// PerSecond is the budget a second of a quota of perMinute (requests or
// tokens a minute) less margin: perMinute/60 x (1 - margin), and never
// more than perMinute/61, since a 60 s window touches 61 calendar seconds
// and the seconds' budgets over any 61 of them must stay within the quota.
func PerSecond(perMinute int, margin float64) float64 {
	return min(float64(perMinute)/60*(1-margin), float64(perMinute)/61)
}

// Budget is what calendar second sec (Unix seconds) may hand out under the
// ceiling, out of the configured limit. A rate that is not a whole number
// a second is spread over the seconds (some get one more than others, and
// any n consecutive seconds together get at most the rate times n, rounded
// up), so that the fleet's rate is the quota's or the ceiling's, not its
// floor: 600 requests a minute paces at 9.8 a second, not 9. A token limit
// of 0 (not counted) stays 0, and a counted one never drops to 0 (a call
// charged more than a second's tokens takes the whole second).
func (c Ceiling) Budget(limit Limit, sec int64) Amount {
	share := c.ShareAt(time.Unix(sec, 0))
	r := limit.Requests * share
	b := Amount{Requests: int(math.Floor(r*float64(sec+1)) - math.Floor(r*float64(sec)))}
	if limit.Tokens > 0 {
		b.Tokens = max(int(limit.Tokens*share), 1)
	}
	return b
}

// Newer reports whether c was set after o, and so replaces it.
func (c Ceiling) Newer(o Ceiling) bool { return c.At > o.At }

// cutAfter429 is the ceiling a 429 at now leads to when c is the newest
// one known, and whether there is one to write: none while the 429 belongs
// to the event that set c (before c.Quiet), nor under a ceiling the
// provider stated. The budget that applied is cut to half when no learned
// ceiling is in force, on trial (see Ceiling.Trial); a 429 while a trial
// climbs confirms it: the fleet goes back to the trial's share, learned
// and probed from then on; and a 429 under a learned ceiling cuts less
// (see repeatCutShare). Its quiet time covers the pause the 429 asked for
// and the blocks other processes leased before they learn of it (they
// lease again within maxLeaseSeconds).
func cutAfter429(c Ceiling, now time.Time, pause time.Duration) (Ceiling, bool) {
	ms := now.UnixMilli()
	if c.At != 0 && ms < c.Quiet {
		return c, false
	}
	if c.Fixed && c.ShareAt(now) < 1 {
		// The provider stated its limit: a 429 under it is others' use
		// or a burst, not a sign that the quota is lower (Local's rule).
		return c, false
	}
	quiet := pause + maxLeaseSeconds*time.Second
	if c.Trial && c.ShareAt(now) < 1 {
		return Ceiling{Share: c.Share, At: ms, Quiet: ms + quiet.Milliseconds()}, true
	}
	share := c.ShareAt(now) * firstCutShare
	trial := true
	if c.At != 0 && !c.Fixed && c.ShareAt(now) < 1 {
		trial = false
		// A learned ceiling still in force: the quota is near it, and a
		// probe went a step too far. Back to the step before, which held
		// for a whole window, or a little under the ceiling before any
		// probe.
		applied, before := c.probed(time.Duration(ms-c.At) * time.Millisecond)
		share = applied * repeatCutShare
		if before > 0 {
			share = before
		}
	}
	return Ceiling{
		Share: max(share, minShare),
		At:    ms,
		Quiet: ms + quiet.Milliseconds(),
		Trial: trial,
	}, true
}

// stated is the Fixed ceiling a provider's limit of perMinute (requests or
// tokens, a rate-limit header) makes of a configured per-second limit, and
// whether it lowers c by more than the safety margin (else it is no news
// worth a write). A limit at or above the configured one states nothing.
func stated(c Ceiling, now time.Time, perMinute int, configured, margin float64) (Ceiling, bool) {
	if perMinute <= 0 || configured <= 0 {
		return c, false
	}
	share := PerSecond(perMinute, margin) / configured
	if share >= 1 || share >= c.ShareAt(now)*(1-DefaultSafetyMargin) {
		return c, false
	}
	ms := now.UnixMilli()
	return Ceiling{Share: max(share, minShare), At: ms, Quiet: ms, Fixed: true}, true
}
