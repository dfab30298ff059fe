package quota

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
)

// Leaser hands out request tokens of calendar seconds shared by every
// worker of a deployment. dynamoquota implements it with one conditional
// DynamoDB update per lease (two when the seconds span a minute).
type Leaser interface {
	// Lease takes up to want[i] tokens of second from+i (Unix seconds),
	// each second out of limit, and returns how many it got for each: fewer
	// when others took the rest, 0 when a second is spent. It never grants
	// beyond limit in total for a second.
	Lease(ctx context.Context, from int64, want []int, limit int) ([]int, error)
}

// Tuning of the blocks a Shared limiter leases.
const (
	// leaseTokens is the least a lease should cover at the rate the
	// process draws: one lease (one write to the store) per this many
	// model calls at steady state.
	leaseTokens = 25
	// maxLeaseSeconds bounds how far ahead a lease reaches, and so how
	// many tokens a process that stops drawing (or dies) can leave unused.
	maxLeaseSeconds = 10
)

// SharedConfig configures a Shared limiter.
type SharedConfig struct {
	// RPM is the provider's quota across every worker of the deployment.
	RPM int
	// SafetyMargin is the fraction of RPM left unused; 0 means
	// DefaultSafetyMargin. With whole-second budgets of
	// floor(RPM/60 x (1 - margin)), any 60 s window, which touches at most
	// 61 calendar seconds, stays under RPM.
	SafetyMargin float64
	// MinPenalty is the pause after a 429 without a usable Retry-After.
	// Defaults to DefaultMinPenalty.
	MinPenalty time.Duration
	// Clock tells the time and waits. Defaults to clock.Real.
	Clock clock.Clock
}

// Shared paces requests against a quota shared by many processes (Lambda
// instances): each second's budget lives in the Leaser, a process leases
// blocks of it, and spends each second's tokens evenly over that second,
// never faster than the quota's own pace. Tokens a process leased but did
// not use in their second are lost, which errs on the side of the quota.
//
// A lease is a write to the shared store, so a process makes as few as it
// can. Its goroutines share one lease in flight (single flight: whoever
// finds the block empty leases, the others wait for that lease instead of
// taking their own). The block is sized to the rate the process draws (its
// starts in the previous second plus a quarter, or the goroutines waiting
// now if more) and reaches as many seconds ahead as it takes to cover
// leaseTokens at that rate, up to maxLeaseSeconds: at steady state one
// write per leaseTokens model calls or fewer, however many goroutines wait.
// Processes racing for seconds the quota cannot cover in full are served
// first come, first served.
type Shared struct {
	leaser Leaser
	cfg    SharedConfig
	limit  int // tokens per calendar second

	mu sync.Mutex
	// grants holds the leased tokens not taken yet, by second.
	grants map[int64]int
	// Pacing within second cur: the next token starts at next, spacing
	// after the one before.
	cur        int64
	next       time.Time
	spacing    time.Duration
	pauseUntil time.Time
	// full holds the seconds the store has no tokens left for (a lease got
	// less than it asked, or this process took the whole second): nobody
	// leases for them again.
	full map[int64]bool
	// leasing is closed when the lease in flight ends; nil when none is.
	leasing chan struct{}
	// waiting counts goroutines inside Wait without a token, the demand a
	// block must cover.
	waiting int
	// started counts the starts of second startedSec; prevStarted those of
	// the second before it, the rate the next block is sized to.
	startedSec  int64
	started     int
	prevStarted int
	// changed is closed (and replaced) by Penalize, waking goroutines
	// whose slot or pause it invalidates.
	changed chan struct{}
}

// NewShared returns a Shared limiter over leaser. RPM must be positive.
func NewShared(leaser Leaser, cfg SharedConfig) (*Shared, error) {
	if cfg.RPM <= 0 {
		return nil, fmt.Errorf("shared quota: RPM must be positive, got %d", cfg.RPM)
	}
	if cfg.SafetyMargin == 0 {
		cfg.SafetyMargin = DefaultSafetyMargin
	}
	cfg.SafetyMargin = math.Min(math.Max(cfg.SafetyMargin, 0), maxSafetyMargin)
	if cfg.MinPenalty <= 0 {
		cfg.MinPenalty = DefaultMinPenalty
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	limit := int(math.Floor(float64(cfg.RPM) / 60 * (1 - cfg.SafetyMargin)))
	if limit < 1 {
		// Under 60 RPM a second's budget rounds to 0; such quotas are not
		// worth a shared limiter's round trips, and one token a second would
		// overshoot them.
		return nil, fmt.Errorf("shared quota: RPM %d is below one request a second; use a lower concurrency instead", cfg.RPM)
	}
	return &Shared{leaser: leaser, cfg: cfg, limit: limit, grants: map[int64]int{}, full: map[int64]bool{}}, nil
}

// Wait blocks until one request may start, or ctx ends.
func (s *Shared) Wait(ctx context.Context) error {
	s.mu.Lock()
	s.waiting++
	s.mu.Unlock()
	holding := false // holding a token: no longer part of the demand
	defer func() {
		if !holding {
			s.mu.Lock()
			s.waiting--
			s.mu.Unlock()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		now := s.cfg.Clock.Now()
		sec := now.Unix()
		s.mu.Lock()
		changed := s.changedLocked()
		if now.Before(s.pauseUntil) {
			wait := s.pauseUntil.Sub(now)
			s.mu.Unlock()
			if err := s.sleep(ctx, wait, changed); err != nil {
				return err
			}
			continue
		}
		if at, ok := s.takeLocked(now); ok {
			s.countStartLocked(sec)
			holding = true
			s.waiting--
			s.mu.Unlock()
			if err := s.sleep(ctx, at.Sub(now), changed); err != nil {
				return err
			}
			select {
			case <-changed:
				// A 429 arrived while this token waited for its slot: the
				// tokens leased before it are suspect, so queue again.
				s.mu.Lock()
				holding = false
				s.waiting++
				s.mu.Unlock()
				continue
			default:
				return nil
			}
		}
		if s.full[sec] || (s.startedSec == sec && s.started >= s.limit) {
			// The store has nothing left for this second.
			s.mu.Unlock()
			if err := s.sleep(ctx, time.Unix(sec+1, 0).Sub(now), changed); err != nil {
				return err
			}
			continue
		}
		if s.leasing != nil {
			// Another goroutine is leasing for all of us.
			done := s.leasing
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-done:
			}
			continue
		}
		want := s.blockLocked(sec)
		done := make(chan struct{})
		s.leasing = done
		s.mu.Unlock()

		got, err := s.leaser.Lease(ctx, sec, want, s.limit)

		s.mu.Lock()
		s.leasing = nil
		close(done)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("lease quota tokens: %w", err)
		}
		for i, w := range want {
			n := 0
			if i < len(got) {
				n = got[i]
			}
			if n > 0 {
				s.grants[sec+int64(i)] += n
			}
			if n < w {
				s.full[sec+int64(i)] = true
			}
		}
		if s.cur == sec && len(got) > 0 && got[0] > 0 {
			// Topped up mid-second: spread the rest over what is left.
			s.spacing = s.spacingLocked(s.cfg.Clock.Now(), s.grants[sec])
		}
		s.mu.Unlock()
	}
}

// takeLocked takes a token of now's second, if the block holds one, and
// returns when it may start.
func (s *Shared) takeLocked(now time.Time) (time.Time, bool) {
	sec := now.Unix()
	left := s.grants[sec]
	if left <= 0 {
		return time.Time{}, false
	}
	if s.cur != sec {
		for k := range s.grants {
			if k < sec {
				delete(s.grants, k) // unused tokens of past seconds
			}
		}
		for k := range s.full {
			if k < sec {
				delete(s.full, k)
			}
		}
		s.cur, s.next = sec, now
		s.spacing = s.spacingLocked(now, left)
	}
	at := s.next
	if at.Before(now) {
		at = now
	}
	if at.Unix() != sec {
		// The quota's pace leaves the block's last tokens beyond their
		// second: they are lost, as unused ones are.
		delete(s.grants, sec)
		return time.Time{}, false
	}
	s.grants[sec]--
	s.next = at.Add(s.spacing)
	return at, true
}

// spacingLocked spreads left tokens over the rest of now's second, but
// never faster than the quota's pace, so that a block topped up late in a
// second does not burst into the first tokens of the next.
func (s *Shared) spacingLocked(now time.Time, left int) time.Duration {
	end := time.Unix(now.Unix()+1, 0)
	return max(end.Sub(now)/time.Duration(left+1), time.Second/time.Duration(s.limit))
}

// changedLocked returns the channel the next Penalize closes.
func (s *Shared) changedLocked() chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// blockLocked is what to lease from sec on: per second what the process
// started in its last full second plus a quarter (less what it started in
// sec already, for sec), or the goroutines waiting now if they are more;
// over enough seconds to cover leaseTokens.
func (s *Shared) blockLocked(sec int64) []int {
	rate, already := 0, 0
	switch s.startedSec {
	case sec:
		rate, already = s.prevStarted, s.started // the block ran out mid-second
	case sec - 1:
		rate = s.started
	}
	perSecond := min(max(rate+(rate+3)/4, s.waiting, 1), s.limit)
	first := min(max(perSecond-already, s.waiting, 1), s.limit)
	seconds := 1
	if rate > 0 {
		// Only a measured rate reaches ahead: a burst of waiting
		// goroutines may be gone next second.
		seconds = min(max((leaseTokens+perSecond-1)/perSecond, 1), maxLeaseSeconds)
	}
	want := make([]int, seconds)
	want[0] = first
	for i := 1; i < seconds; i++ {
		want[i] = perSecond
	}
	return want
}

// countStartLocked records a start in sec for sizing the next block.
func (s *Shared) countStartLocked(sec int64) {
	switch s.startedSec {
	case sec:
	case sec - 1:
		s.prevStarted, s.started = s.started, 0
	default:
		s.prevStarted, s.started = 0, 0
	}
	s.startedSec = sec
	s.started++
}

// Penalize reports a 429: this process starts nothing before retryAfter
// (at least MinPenalty) has passed.
func (s *Shared) Penalize(retryAfter time.Duration) {
	retryAfter = min(max(retryAfter, s.cfg.MinPenalty), maxPenalty)
	until := s.cfg.Clock.Now().Add(retryAfter)
	s.mu.Lock()
	if until.After(s.pauseUntil) {
		s.pauseUntil = until
	}
	clear(s.grants) // tokens leased before the 429 are suspect
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	s.mu.Unlock()
}

// Limit is the number of requests a calendar second may start.
func (s *Shared) Limit() int { return s.limit }

// sleep waits d, or until ctx ends (its error) or changed is closed (nil).
func (s *Shared) sleep(ctx context.Context, d time.Duration, changed <-chan struct{}) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-changed:
		return nil
	case <-s.cfg.Clock.After(d):
		return nil
	}
}
