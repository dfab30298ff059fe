// Package quota paces calls to a model provider so that its request-per-minute
// and token-per-minute quotas hold across all the workers that share them.
//
// Local is the in-process limiter for one machine. It spreads requests and
// tokens evenly (virtual-time scheduling, a burst of one request) instead of
// letting a minute's quota go out in the first second, because providers
// enforce quotas over sliding windows and a burst draws 429s that cost more
// time than they save. It also keeps its own sliding window of what it
// started, so that it never puts more than the quota into any window even
// after a burst (the first seconds of a job whose quota it did not know yet).
//
// When the quota is not configured, or configured too high, Local learns
// it: from the provider's rate-limit headers when they are sent (the limit
// itself, and the remaining count to see other clients' use), and otherwise
// from 429s. A 429 means the window is full, so what Local itself started in
// the trailing window is the quota: it becomes a ceiling, remembered, that is
// probed upward in proportion to itself only while the limiter holds work
// back and no 429 came for a while. (The AIMD this replaces halved the rate
// on each 429 and climbed back linearly, and averaged 82 % of the quota on a
// one-minute job.)
package quota

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
)

// Defaults for LocalConfig.
const (
	// DefaultSafetyMargin keeps the paced rate 1 % under the quota, so that
	// scheduling jitter (a request leaving a few ms late, the next on time)
	// cannot push a sliding 60 s window over it.
	DefaultSafetyMargin = 0.01
	// DefaultMinPenalty is the pause after a 429 that carried no usable
	// Retry-After.
	DefaultMinPenalty = time.Second
	// DefaultWindow is the provider's quota window: quotas are per minute.
	DefaultWindow = time.Minute
	// DefaultProbeEvery is how long a ceiling learned from a 429 holds
	// before the limiter tries a little more.
	DefaultProbeEvery = 20 * time.Second

	// maxSafetyMargin bounds a mistyped margin (e.g. 10 meaning 10 %).
	maxSafetyMargin = 0.5
	// minRPM is the floor of a learned request ceiling: one request a
	// minute, so the limiter keeps probing instead of stopping for good.
	minRPM = 1.0
	// maxPenalty bounds a nonsensical Retry-After (a date years ahead).
	maxPenalty = time.Hour
	// firstProbeStep is the first upward probe of a learned ceiling, as a
	// fraction of it; each probe that draws no 429 doubles the next step,
	// up to maxProbeStep, so a ceiling learned far too low (from a 429 that
	// another client caused) is left quickly.
	firstProbeStep = 0.05
	maxProbeStep   = 1.0
	// maxProbeBackoff bounds how many times a probe's wait doubles: each
	// probe that draws a 429 within ProbeEvery doubles the wait before the
	// next, up to 2^maxProbeBackoff x ProbeEvery (about 5 minutes at the
	// default): a ceiling whose step up was refused is the quota within a
	// step, and probing it again every ProbeEvery costs a 429 and its pause
	// each time (the cost of probing on a provider whose quota binds all
	// job long). A probe that holds resets the wait.
	maxProbeBackoff = 4
	// repeatCut scales the window count when a 429 arrives within two
	// windows of the previous one: the quota is contested (other clients),
	// and counting alone would sit right at the edge. The first 429 after a
	// quiet spell trusts the count (cut less after the first correction).
	repeatCut = 0.95
	// buckets is how many parts the window log has: a start is counted
	// until its part's end leaves the window, so the log errs toward the
	// quota by at most Window/buckets.
	buckets = 600
)

// LocalConfig configures a Local limiter.
type LocalConfig struct {
	// RPM is the provider's requests-per-minute quota for this process.
	// 0 (or less) means not configured: the limiter learns it.
	RPM int
	// TPM is the tokens-per-minute quota (prompt plus completion tokens, as
	// the provider counts them). 0 (or less) means not configured.
	TPM int
	// SafetyMargin is the fraction of each quota left unused. 0 means
	// DefaultSafetyMargin (1 %); a negative value means no margin; values
	// above 0.5 are treated as 0.5.
	SafetyMargin float64
	// MinPenalty is the shortest pause Penalize imposes, used when a 429 has
	// no or a shorter Retry-After. Defaults to DefaultMinPenalty (1 s).
	MinPenalty time.Duration
	// Window is the span the provider counts its quota over; RPM and TPM
	// are scaled to it. Defaults to DefaultWindow (60 s).
	Window time.Duration
	// ProbeEvery is how long a ceiling learned from 429s holds, while the
	// limiter holds work back, before it is raised. Defaults to
	// DefaultProbeEvery (20 s).
	ProbeEvery time.Duration
	// Clock tells the time and waits. Defaults to clock.Real.
	Clock clock.Clock
}

// dim is one quota: requests or tokens. Limits are per minute; 0 means
// unknown. The one that applies is the least of the known ones.
type dim struct {
	configured float64
	header     float64
	learned    float64
	// external is the provider's count, in the window, of use this
	// limiter did not start (other clients), from the remaining header at
	// externalAt; it is taken to leave the window evenly.
	external   float64
	externalAt time.Time
	// next is the virtual time at which the pace allows the next start.
	next time.Time
	// credit is pace given back (Settle) while next was already past:
	// spent by the next starts instead of being lost, up to maxCredit.
	credit time.Duration
}

// maxCredit bounds the pace a limiter banks from unused tokens.
const maxCredit = time.Second

// maxLate is the most lateness of a wake-up the pace makes up for.
const maxLate = 20 * time.Millisecond

// paceFrom is where the next step of the pace starts after a start at now
// whose slot was next: the slot itself when the start came a little late
// (a waiter wakes after its time on a busy machine, and every late wake-up
// would otherwise lower the rate for good), now when the limiter was idle
// (no burst after a pause in demand).
func paceFrom(next, now time.Time, step time.Duration) time.Time {
	if !next.IsZero() && !now.After(next.Add(min(step, maxLate))) {
		return next
	}
	return now
}

func (d *dim) limit() float64 {
	l := 0.0
	for _, v := range []float64{d.configured, d.header, d.learned} {
		if v > 0 && (l == 0 || v < l) {
			l = v
		}
	}
	return l
}

// bucket counts the starts of one part of the window.
type bucket struct {
	at  time.Time
	n   float64
	tok float64
}

// Local paces requests so that no more than RPM requests and TPM tokens
// start in any window, spread evenly, shared by all workers of the process.
// It is safe for concurrent use.
type Local struct {
	clk        clock.Clock
	minPenalty time.Duration
	probeEvery time.Duration
	keep       float64 // 1 - margin

	mu sync.Mutex
	// window is the span the provider counts over: configured, or learned
	// from its headers or its first 429 (windowKnown), else 60 s. part is
	// the log's granularity.
	window      time.Duration
	windowKnown bool
	part        time.Duration
	// firstStart is the first start ever, to tell the window from the
	// first 429's Retry-After.
	firstStart time.Time
	req        dim
	tok        dim
	// log holds the starts of the trailing window, oldest first.
	log []bucket
	// pausedUntil: nobody starts before it.
	pausedUntil time.Time
	// lastCut is when a 429 last lowered a ceiling; held when the limiter
	// last made a worker wait (so a probe is worth making); probeStep the
	// next probe's size; lastProbe when the last probe (or cut) happened.
	lastCut time.Time
	held    time.Time
	// cutFloor is the least each ceiling may drop to in the current
	// congestion event (half of what applied when it began), cutRecent
	// whether it came soon after the one before.
	cutFloor  [2]float64
	cutRecent bool
	probeStep float64
	lastProbe time.Time
	// probeFails counts the probes in a row that drew a 429 within
	// probeEvery: the next probe waits probeEvery << probeFails.
	probeFails int
	// changed is closed (and replaced) by every Penalize or new limit, to
	// wake waiters whose wait it changes.
	changed chan struct{}
	// usedRatio is a moving average of the share of its charge a call
	// uses (Settle): the token pace spreads what calls use, while the
	// window holds their charges until corrected, as the provider does.
	// settled counts the calls it averages, up to ratioCalls.
	usedRatio float64
	settled   int
}

// ratioCalls is the span of usedRatio's moving average.
const ratioCalls = 8

// NewLocal returns a limiter for cfg. Out-of-range values are clamped as
// documented on LocalConfig, never rejected.
func NewLocal(cfg LocalConfig) *Local {
	l := &Local{
		clk:        cfg.Clock,
		minPenalty: cfg.MinPenalty,
		window:     cfg.Window,
		probeEvery: cfg.ProbeEvery,
		probeStep:  firstProbeStep,
		changed:    make(chan struct{}),
		usedRatio:  1,
	}
	if l.clk == nil {
		l.clk = clock.Real{}
	}
	if l.minPenalty <= 0 {
		l.minPenalty = DefaultMinPenalty
	}
	if l.window <= 0 {
		l.window = DefaultWindow
	} else {
		l.windowKnown = true
	}
	if l.probeEvery <= 0 {
		l.probeEvery = DefaultProbeEvery
	}
	l.part = max(l.window/buckets, time.Microsecond)
	margin := cfg.SafetyMargin
	switch {
	case margin == 0:
		margin = DefaultSafetyMargin
	case margin < 0:
		margin = 0
	case margin > maxSafetyMargin:
		margin = maxSafetyMargin
	}
	l.keep = 1 - margin
	if cfg.RPM > 0 {
		l.req.configured = float64(cfg.RPM)
	}
	if cfg.TPM > 0 {
		l.tok.configured = float64(cfg.TPM)
	}
	return l
}

// capacityLocked is what the window may hold of d at now: its limit scaled
// to the window, less the margin and others' use.
func (l *Local) capacityLocked(d *dim, now time.Time) float64 {
	c := d.limit() * l.window.Minutes() * l.keep
	if d.external > 0 {
		left := 1 - now.Sub(d.externalAt).Seconds()/l.window.Seconds()
		c -= d.external * max(left, 0)
	}
	return max(c, 1)
}

// Wait blocks until a request estimated at tokens may start, or until ctx
// is done (returning ctx.Err()). Every nil return is one request started
// and tokens charged: callers must not call Wait for requests they then do
// not send, and should Settle the charge with the provider's usage.
func (l *Local) Wait(ctx context.Context, tokens int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tok := float64(max(tokens, 0))
	for {
		l.mu.Lock()
		now := l.clk.Now()
		changed := l.changed
		at := l.earliestLocked(now, tok)
		if !at.After(now) {
			l.grantLocked(now, tok)
			l.mu.Unlock()
			return nil
		}
		if now.After(l.pausedUntil) {
			l.held = now
		}
		l.mu.Unlock()
		if err := clock.Sleep(ctx, l.clk, at.Sub(now), changed); err != nil {
			return err
		}
	}
}

// earliestLocked is the earliest time a request of tok tokens may start:
// after any pause, at the pace of each known quota, and when the trailing
// window has room for it.
func (l *Local) earliestLocked(now time.Time, tok float64) time.Time {
	l.pruneLocked(now)
	l.probeLocked(now)
	at := now
	if l.pausedUntil.After(at) {
		at = l.pausedUntil
	}
	if l.req.limit() > 0 {
		at = later(at, l.req.next)
		at = later(at, l.recheck(now, &l.req, l.roomLocked(l.capacityLocked(&l.req, now), 1, func(b bucket) float64 { return b.n })))
	}
	if l.tok.limit() > 0 {
		at = later(at, l.tok.next)
		capacity := l.capacityLocked(&l.tok, now)
		at = later(at, l.recheck(now, &l.tok, l.roomLocked(capacity, min(tok, capacity), func(b bucket) float64 { return b.tok })))
	}
	return at
}

// recheck bounds a wait for room in the window while others' use, which
// leaves the window gradually, takes part of it: the room it leaves comes
// sooner than this limiter's own starts leave.
func (l *Local) recheck(now time.Time, d *dim, room time.Time) time.Time {
	if d.external > 0 {
		if soon := now.Add(max(l.window/100, 10*time.Millisecond)); room.After(soon) {
			return soon
		}
	}
	return room
}

// roomLocked is when the window has room for need more of what f counts,
// under capacity.
func (l *Local) roomLocked(capacity, need float64, f func(bucket) float64) time.Time {
	total := 0.0
	for _, b := range l.log {
		total += f(b)
	}
	var at time.Time
	for _, b := range l.log {
		if total+need <= capacity+1e-9 {
			break
		}
		total -= f(b)
		at = b.at.Add(l.part + l.window)
	}
	return at
}

func (l *Local) grantLocked(now time.Time, tok float64) {
	if l.firstStart.IsZero() {
		l.firstStart = now
	}
	if lim := l.req.limit(); lim > 0 {
		step := l.interval(1, lim)
		l.req.next = paceFrom(l.req.next, now, step).Add(step)
	}
	if lim := l.tok.limit(); lim > 0 {
		step := l.interval(min(tok, lim*l.keep)*l.usedRatio, lim)
		use := min(l.tok.credit, step)
		l.tok.credit -= use
		l.tok.next = paceFrom(l.tok.next, now, step).Add(step - use)
	}
	if n := len(l.log); n > 0 && now.Before(l.log[n-1].at.Add(l.part)) {
		l.log[n-1].n++
		l.log[n-1].tok += tok
		return
	}
	l.log = append(l.log, bucket{at: now, n: 1, tok: tok})
}

// interval is the pace's spacing after a start of amount, for a quota of
// limit per minute.
func (l *Local) interval(amount, limit float64) time.Duration {
	return time.Duration(amount / (limit * l.keep) * float64(time.Minute))
}

// pruneLocked drops the parts of the log that left the window.
func (l *Local) pruneLocked(now time.Time) {
	i := 0
	for i < len(l.log) && !now.Before(l.log[i].at.Add(l.part+l.window)) {
		i++
	}
	if i > 0 {
		l.log = append(l.log[:0], l.log[i:]...)
	}
}

// Settle corrects the charge of a request that Wait let start with the
// tokens the provider reported it used (prompt plus completion). Tokens not
// used go back to the pace and the window; more than charged are taken from
// them. used < 0 (no usage reported) keeps the charge.
func (l *Local) Settle(charged, used int) {
	if used < 0 || used == charged {
		return
	}
	diff := float64(charged - used)
	l.mu.Lock()
	defer l.mu.Unlock()
	if lim := l.tok.limit(); lim > 0 {
		// The pace took charged x usedRatio; correct it to used.
		now := l.clk.Now()
		paced := min(float64(charged), lim*l.keep) * l.usedRatio
		d := l.interval(math.Abs(paced-float64(used)), lim)
		if paced > float64(used) {
			// Pull the pace forward, down to now; bank the rest.
			back := min(d, max(l.tok.next.Sub(now), 0))
			l.tok.next = l.tok.next.Add(-back)
			l.tok.credit = min(l.tok.credit+d-back, maxCredit)
		} else {
			l.tok.next = later(l.tok.next, now).Add(d)
		}
	}
	if charged > 0 {
		// A running mean over the first calls, then a moving average: the
		// first answers set the pace instead of decaying toward it.
		l.settled = min(l.settled+1, ratioCalls)
		l.usedRatio += (min(float64(used)/float64(charged), 1) - l.usedRatio) / float64(l.settled)
		l.usedRatio = max(l.usedRatio, 0.01)
	}
	// The request started in one of the latest parts: correct the newest
	// one that holds the charge (calls of one job are charged alike).
	for i := len(l.log) - 1; i >= 0; i-- {
		if l.log[i].tok >= diff {
			l.log[i].tok -= diff
			break
		}
	}
	if diff > 0 {
		l.wakeLocked()
	}
}

// Observe takes in what a provider's answer said about its quotas: a limit
// below the configured one replaces it (the quota was configured too high
// or not at all); the reset time of a quota in use tells the window it is
// counted over (a sliding window is whole again one window after its newest
// request); and the remaining count tells how much of the window others use.
func (l *Local) Observe(rl llm.RateLimits) {
	if !rl.Known() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	before := [2]float64{l.req.limit(), l.tok.limit()}
	if !l.windowKnown {
		for _, w := range []llm.RateWindow{rl.Requests, rl.Tokens} {
			if w.Limit > 0 && w.Remaining >= 0 && w.Remaining < w.Limit && w.Reset > 0 {
				l.setWindowLocked(w.Reset)
				break
			}
		}
	}
	l.pruneLocked(now)
	for _, x := range []struct {
		d     *dim
		w     llm.RateWindow
		count func(bucket) float64
	}{
		{&l.req, rl.Requests, func(b bucket) float64 { return b.n }},
		{&l.tok, rl.Tokens, func(b bucket) float64 { return b.tok }},
	} {
		if x.w.Limit <= 0 {
			continue
		}
		x.d.header = float64(x.w.Limit)
		if x.d.learned >= x.d.header {
			x.d.learned = 0 // the header says it more exactly
		}
		if x.w.Remaining >= 0 {
			// The provider's use = ours + others'. Ours counts starts
			// after this answer was admitted too, so others' is at
			// least this.
			ours := 0.0
			for _, b := range l.log {
				ours += x.count(b)
			}
			used := float64(x.w.Limit-x.w.Remaining) * l.window.Minutes()
			x.d.external, x.d.externalAt = max(used-ours, 0), now
		}
	}
	if before != [2]float64{l.req.limit(), l.tok.limit()} {
		l.wakeLocked()
	}
}

// setWindowLocked adopts the provider's window, within 1 s to 60 s.
func (l *Local) setWindowLocked(w time.Duration) {
	l.window = min(max(w, time.Second), time.Minute)
	l.windowKnown = true
	l.part = max(l.window/buckets, time.Microsecond)
}

// Penalize reports a 429 from the provider: nobody starts before now +
// retryAfter (at least MinPenalty, at most an hour), and the request that
// drew it is taken off the window (the provider did not count it).
//
// A 429 that comes while no pause runs lowers the ceiling of each quota the
// headers did not state to what this limiter started in the trailing
// window: the quota the provider just enforced. The first such 429 also
// tells the window, when a job's first window is still open: its oldest
// request, the job's first, leaves it after Retry-After. A ceiling never
// drops below half the limit that applied (one 429 may be others' doing),
// and a 429 within two windows of the previous one cuts 5 % more (the quota
// is contested; counting alone would sit on the edge). 429s that arrive
// while a pause runs extend it but do not cut again: they answer requests
// sent before the first cut.
func (l *Local) Penalize(retryAfter time.Duration) {
	d := min(max(retryAfter, l.minPenalty), maxPenalty)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	alreadyPaused := now.Before(l.pausedUntil)
	if end := now.Add(d); end.After(l.pausedUntil) {
		l.pausedUntil = end
	}
	if !alreadyPaused && !l.windowKnown && retryAfter > 0 && !l.firstStart.IsZero() {
		if w := now.Add(retryAfter).Sub(l.firstStart); w <= DefaultWindow {
			l.setWindowLocked(w)
		}
	}
	l.pruneLocked(now)
	// Take the refused request off the newest part that holds one.
	refused := 0.0
	for i := len(l.log) - 1; i >= 0; i-- {
		if l.log[i].n >= 1 {
			refused = l.log[i].tok / l.log[i].n
			l.log[i].n--
			l.log[i].tok -= refused
			break
		}
	}
	if !alreadyPaused {
		// A new congestion event: the ceilings may drop to half of what
		// applied at most, 5 % more when the last event was recent. One
		// that answers a probe (the last change was a probe, not long ago)
		// says the step before was the quota: the next probe waits longer.
		if l.lastProbe.After(l.lastCut) && now.Sub(l.lastProbe) < l.probeEvery {
			l.probeFails = min(l.probeFails+1, maxProbeBackoff)
		}
		l.cutRecent = !l.lastCut.IsZero() && now.Sub(l.lastCut) < 2*l.window
		l.cutFloor = [2]float64{l.req.limit() / 2, l.tok.limit() / 2}
		l.lastCut, l.lastProbe, l.probeStep = now, now, firstProbeStep
		l.cutLocked(refused)
	} else if now.Sub(l.lastCut) < l.window {
		// More 429s of the same event answer calls that were in flight
		// when the first came: each took its call off the window, so
		// the count is now nearer what the provider accepted.
		l.cutLocked(refused)
	}
	l.wakeLocked()
}

// cutLocked lowers the ceiling of each quota the headers did not state to
// what the window holds, within the current event's floor.
func (l *Local) cutLocked(refused float64) {
	var n, tok float64
	for _, b := range l.log {
		n += b.n
		tok += b.tok
	}
	perMinute := 1 / l.window.Minutes()
	cut := func(d *dim, count, floor float64) {
		if d.header > 0 {
			return // the provider stated it: this 429 is others' use or a burst
		}
		learned := count * perMinute
		if l.cutRecent {
			learned *= repeatCut
		}
		lim := d.limit()
		learned = max(learned, floor)
		if lim == 0 || learned < lim {
			d.learned = learned
		}
	}
	cut(&l.req, n, max(l.cutFloor[0], minRPM))
	if tok > 0 && l.tok.limit() > 0 {
		cut(&l.tok, tok, max(l.cutFloor[1], max(refused, 1)*perMinute))
	}
}

// probeLocked raises a learned ceiling that held for ProbeEvery while the
// limiter held work back, by a step that doubles with each probe that drew
// no 429.
func (l *Local) probeLocked(now time.Time) {
	if l.req.learned == 0 && l.tok.learned == 0 {
		return
	}
	if now.Sub(l.lastProbe) < l.probeEvery<<l.probeFails || now.Before(l.pausedUntil) {
		return
	}
	if l.held.Before(l.lastProbe) {
		return // nobody was held back: more would not be used
	}
	if l.lastProbe.After(l.lastCut) {
		l.probeFails = 0 // the last probe held
	}
	for _, d := range []*dim{&l.req, &l.tok} {
		if d.learned == 0 {
			continue
		}
		d.learned *= 1 + l.probeStep
		for _, other := range []float64{d.configured, d.header} {
			if other > 0 && d.learned >= other {
				d.learned = 0
			}
		}
	}
	l.probeStep = min(2*l.probeStep, maxProbeStep)
	l.lastProbe = now
}

func (l *Local) wakeLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Rate returns the current request pace in requests/s. 0 means unlimited
// (no quota configured, sent or learned yet).
func (l *Local) Rate() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probeLocked(l.clk.Now())
	return l.req.limit() * l.keep / 60
}

// TokenRate returns the current token pace in tokens/s; 0 means unlimited.
func (l *Local) TokenRate() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probeLocked(l.clk.Now())
	return l.tok.limit() * l.keep / 60
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
