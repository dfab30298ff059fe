// Package quota paces calls to a model provider so that a request-per-minute
// quota holds across all the workers that share it.
//
// Local is the in-process limiter for one machine. It spreads requests evenly
// (a token bucket of burst 1) instead of letting a minute's quota go out in the
// first second, because providers enforce quotas over sliding windows shorter
// than a minute and a burst draws 429s that cost more time than they save.
// When a 429 arrives anyway, Penalize pauses everybody and then finds the
// real quota by multiplicative decrease and additive increase (AIMD), so a
// quota shared with other clients, or an unknown one, is found instead of
// hammered.
package quota

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/batchgen/batchgen/internal/clock"
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
	// DefaultRecovery is how long the rate takes to climb back to the
	// configured RPM after one halving.
	DefaultRecovery = time.Minute

	// maxSafetyMargin bounds a mistyped margin (e.g. 10 meaning 10 %).
	maxSafetyMargin = 0.5
	// minRate is the floor of repeated halvings: one request a minute, so
	// the limiter keeps probing instead of stopping for good.
	minRate = 1.0 / 60
	// minProbeSlope is the slowest additive increase (requests/s gained per
	// Recovery) when the quota is unknown, so a cut from a tiny observed
	// rate does not take hours to recover.
	minProbeSlope = 1.0
	// maxPenalty bounds a nonsensical Retry-After (a date years ahead).
	maxPenalty = time.Hour
	// observeWindow is how far back Penalize looks to estimate the rate
	// that drew a 429 when no RPM is configured.
	observeWindow = 10
)

// LocalConfig configures a Local limiter.
type LocalConfig struct {
	// RPM is the provider's requests-per-minute quota for this process.
	// 0 (or less) means no configured limit: Wait does not pace until a
	// 429 arrives, after which Penalize discovers a rate.
	RPM int
	// SafetyMargin is the fraction of RPM left unused. 0 means
	// DefaultSafetyMargin (1 %); a negative value means no margin; values
	// above 0.5 are treated as 0.5.
	SafetyMargin float64
	// MinPenalty is the shortest pause Penalize imposes, used when a 429 has
	// no or a shorter Retry-After. Defaults to DefaultMinPenalty (1 s).
	MinPenalty time.Duration
	// Recovery is how long the rate takes to climb back from a halving to
	// RPM (the increase is linear). Defaults to DefaultRecovery (60 s).
	Recovery time.Duration
	// Clock tells the time and waits. Defaults to clock.Real.
	Clock clock.Clock
}

// Local paces requests so that no more than RPM requests start in any 60 s
// window, spread evenly (no 1 s window gets more than about RPM/60), shared by
// all workers of the process. It is safe for concurrent use.
type Local struct {
	clk        clock.Clock
	minPenalty time.Duration
	recovery   time.Duration
	// ceiling is the configured rate in requests/s, +Inf when unlimited.
	ceiling float64

	// unlimited is true until a limit applies (no RPM configured and no
	// 429 seen); Wait then only counts starts.
	unlimited atomic.Bool

	mu sync.Mutex
	// lim paces starts at limit requests/s. Penalize replaces it, so that
	// reservations made before a 429 do not survive it.
	lim   *rate.Limiter
	limit float64
	// pausedUntil: nobody starts before it.
	pausedUntil time.Time
	// lastStart is the latest start granted (possibly a slot in the near
	// future), for spacing actual starts at 1/limit.
	lastStart time.Time
	// After a cut the rate is base + slope*(t - recoverFrom), capped at
	// ceiling; recovering is false once it reached the ceiling.
	recovering  bool
	base, slope float64
	recoverFrom time.Time
	cutAt       time.Time
	// changed is closed (and replaced) by every Penalize to wake waiters,
	// whose pause or reservation it invalidates.
	changed chan struct{}
	// starts counts Wait returns per second over the last observeWindow
	// seconds, while unlimited, to estimate the rate that drew a 429.
	starts    [observeWindow]secondCount
	firstSeen time.Time
}

type secondCount struct {
	sec int64
	n   int
}

// NewLocal returns a limiter for cfg. Out-of-range values are clamped as
// documented on LocalConfig, never rejected.
func NewLocal(cfg LocalConfig) *Local {
	l := &Local{
		clk:        cfg.Clock,
		minPenalty: cfg.MinPenalty,
		recovery:   cfg.Recovery,
		ceiling:    math.Inf(1),
		changed:    make(chan struct{}),
	}
	if l.clk == nil {
		l.clk = clock.Real{}
	}
	if l.minPenalty <= 0 {
		l.minPenalty = DefaultMinPenalty
	}
	if l.recovery <= 0 {
		l.recovery = DefaultRecovery
	}
	if cfg.RPM <= 0 {
		l.unlimited.Store(true)
		return l
	}
	margin := cfg.SafetyMargin
	switch {
	case margin == 0:
		margin = DefaultSafetyMargin
	case margin < 0:
		margin = 0
	case margin > maxSafetyMargin:
		margin = maxSafetyMargin
	}
	l.ceiling = float64(cfg.RPM) / 60 * (1 - margin)
	l.limit = l.ceiling
	l.lim = rate.NewLimiter(rate.Limit(l.limit), 1)
	return l
}

// Wait blocks until a request may start, or until ctx is done (returning
// ctx.Err()). Every nil return is one request started: callers must not
// call Wait for requests they then do not send, or the quota is wasted.
func (l *Local) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if l.unlimited.Load() {
		l.mu.Lock()
		if l.unlimited.Load() {
			l.recordStartLocked(l.clk.Now())
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
	}
	for {
		l.mu.Lock()
		now := l.clk.Now()
		changed := l.changed
		if now.Before(l.pausedUntil) {
			d := l.pausedUntil.Sub(now)
			l.mu.Unlock()
			select {
			case <-l.clk.After(d):
			case <-changed:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		l.refreshLocked(now)
		r := l.lim.ReserveN(now, 1)
		l.mu.Unlock()
		if d := r.DelayFrom(now); d > 0 {
			select {
			case <-l.clk.After(d):
			case <-changed:
				// A 429 arrived while we waited: our slot was scheduled
				// by a limiter that no longer applies.
				continue
			case <-ctx.Done():
				r.CancelAt(l.clk.Now())
				return ctx.Err()
			}
		}

		// The limiter spaced the scheduled times; a stall (GC, CPU
		// contention) can still wake many waiters late and together. Space
		// the actual starts too, so a stall never becomes a burst at the
		// provider. Without stalls this adds no delay.
		l.mu.Lock()
		select {
		case <-changed:
			l.mu.Unlock()
			continue
		default:
		}
		now = l.clk.Now()
		slot := l.lastStart.Add(time.Duration(float64(time.Second) / l.limit))
		if !slot.After(now) {
			l.lastStart = now
			l.mu.Unlock()
			return nil
		}
		l.lastStart = slot
		l.mu.Unlock()
		select {
		case <-l.clk.After(slot.Sub(now)):
			return nil
		case <-changed:
			continue
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Penalize reports a 429 from the provider: nobody starts before now +
// retryAfter (at least MinPenalty, at most an hour), and the rate is halved, then climbs
// linearly back toward the configured RPM over Recovery. 429s that arrive
// while a pause is already running extend it but do not cut again: they
// answer requests sent before the first cut, so counting each would collapse
// the rate on one burst. Penalize never raises the rate. With no RPM
// configured, the first Penalize starts pacing at half the rate observed over
// the last 10 s.
func (l *Local) Penalize(retryAfter time.Duration) {
	d := min(max(retryAfter, l.minPenalty), maxPenalty)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	alreadyPaused := now.Before(l.pausedUntil)
	if end := now.Add(d); end.After(l.pausedUntil) {
		l.pausedUntil = end
	}
	if l.unlimited.Load() {
		observed := l.observedRateLocked(now)
		l.unlimited.Store(false)
		l.cutLocked(now, observed)
	} else if !alreadyPaused && now.Sub(l.cutAt) >= l.minPenalty {
		l.refreshLocked(now)
		l.cutLocked(now, l.limit)
	}
	if l.recoverFrom.Before(l.pausedUntil) {
		l.recoverFrom = l.pausedUntil
	}
	// A fresh limiter holds one token: the first request after the pause
	// starts at once, the rest are spaced at the new rate.
	l.lim = rate.NewLimiter(rate.Limit(l.limit), 1)
	close(l.changed)
	l.changed = make(chan struct{})
}

// cutLocked halves from, the rate that drew the 429.
func (l *Local) cutLocked(now time.Time, from float64) {
	l.base = max(min(from/2, l.ceiling), min(minRate, l.ceiling))
	l.limit = l.base
	if math.IsInf(l.ceiling, 1) {
		l.slope = max(l.base, minProbeSlope) / l.recovery.Seconds()
	} else {
		l.slope = l.ceiling / 2 / l.recovery.Seconds()
	}
	l.recovering = true
	l.cutAt = now
}

// refreshLocked applies the additive increase due at now.
func (l *Local) refreshLocked(now time.Time) {
	if !l.recovering {
		return
	}
	r := l.base
	if since := now.Sub(l.recoverFrom); since > 0 {
		r += l.slope * since.Seconds()
	}
	if r >= l.ceiling {
		r = l.ceiling
		l.recovering = false
	}
	if r != l.limit {
		l.limit = r
		l.lim.SetLimitAt(now, rate.Limit(r))
	}
}

// Rate returns the current pace in requests/s, as it applies after any pause
// in progress. 0 means unlimited (no RPM configured and no 429 seen).
func (l *Local) Rate() float64 {
	if l.unlimited.Load() {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refreshLocked(l.clk.Now())
	return l.limit
}

func (l *Local) recordStartLocked(now time.Time) {
	if l.firstSeen.IsZero() {
		l.firstSeen = now
	}
	sec := now.Unix()
	b := &l.starts[sec%observeWindow]
	if b.sec != sec {
		*b = secondCount{sec: sec}
	}
	b.n++
}

// observedRateLocked is the start rate over the trailing observeWindow
// seconds (or since the first start, if that is more recent).
func (l *Local) observedRateLocked(now time.Time) float64 {
	sec := now.Unix()
	n := 0
	for _, b := range l.starts {
		if b.sec > sec-observeWindow && b.sec <= sec {
			n += b.n
		}
	}
	if n == 0 {
		return 0
	}
	span := min(now.Sub(l.firstSeen).Seconds(), observeWindow)
	return float64(n) / max(span, 1)
}
