package quota

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
)

// Leaser hands out request tokens of one calendar second shared by every
// worker of a deployment. dynamoquota implements it with one conditional
// DynamoDB update per block.
type Leaser interface {
	// Lease takes up to want tokens of second (Unix seconds) out of limit
	// and returns how many it got: fewer when others took the rest, 0 when
	// the second is spent. It never grants beyond limit in total.
	Lease(ctx context.Context, second int64, want, limit int) (int, error)
}

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
// instances): each second's budget lives in the Leaser, and a process leases
// a block of it and spends the block evenly over the rest of the second.
// Tokens a process leased but did not use in their second are lost, which
// errs on the side of the quota.
//
// A lease is a write to the shared store, so a process makes as few as it
// can: its goroutines share one lease in flight (single flight: whoever
// finds the block empty leases, the others wait for that lease instead of
// taking their own), and the block is sized to the rate the process draws,
// namely the starts of its previous second with a quarter of headroom, or
// the goroutines waiting now if more. At steady state that is one lease per
// process per second however many goroutines wait. The price of large
// blocks is that processes racing for a second the quota cannot cover in
// full are served first come, first served within that second.
type Shared struct {
	leaser Leaser
	cfg    SharedConfig
	limit  int // tokens per calendar second

	mu         sync.Mutex
	second     int64     // the second the block belongs to
	left       int       // tokens left in the block
	next       time.Time // when the next token of the block may start
	spacing    time.Duration
	pauseUntil time.Time
	// spent is a second the store has no tokens left for: nobody leases
	// for it again.
	spent int64
	// leasing is closed when the lease in flight ends; nil when none is.
	leasing chan struct{}
	// waiting counts goroutines inside Wait, the demand a block must cover.
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
	return &Shared{leaser: leaser, cfg: cfg, limit: limit}, nil
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
		switch {
		case now.Before(s.pauseUntil):
			wait := s.pauseUntil.Sub(now)
			s.mu.Unlock()
			if err := s.sleep(ctx, wait, changed); err != nil {
				return err
			}
			continue
		case s.second == sec && s.left > 0:
			at := s.next
			if at.Before(now) {
				at = now
			}
			if at.Unix() != sec {
				// The block's pace leaves its last tokens beyond their
				// second: they are lost, as unused ones are.
				s.left = 0
				s.mu.Unlock()
				continue
			}
			s.left--
			s.next = at.Add(s.spacing)
			s.countStartLocked(sec)
			if !holding {
				holding = true
				s.waiting--
			}
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
		case s.spent >= sec:
			// The store has nothing left for this second.
			s.mu.Unlock()
			if err := s.sleep(ctx, time.Unix(sec+1, 0).Sub(now), changed); err != nil {
				return err
			}
			continue
		case s.leasing != nil:
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
		if got == 0 {
			s.spent = max(s.spent, sec)
			s.mu.Unlock()
			continue
		}
		now = s.cfg.Clock.Now()
		if s.second == sec {
			s.left += got
		} else {
			s.second, s.left, s.next = sec, got, now
		}
		// Spread the block over the rest of the second, but never faster
		// than the quota's pace, so that a block topped up late in a second
		// does not burst into the first tokens of the next.
		end := time.Unix(sec+1, 0)
		s.spacing = max(end.Sub(now)/time.Duration(s.left+1), time.Second/time.Duration(s.limit))
		s.mu.Unlock()
	}
}

// changedLocked returns the channel the next Penalize closes.
func (s *Shared) changedLocked() chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// blockLocked is how many tokens to lease for sec: what the process
// started in its last full second plus a quarter, less what it started in
// sec already, or the goroutines waiting now if they are more.
func (s *Shared) blockLocked(sec int64) int {
	rate, already := 0, 0
	switch s.startedSec {
	case sec:
		rate, already = s.prevStarted, s.started // the block ran out mid-second
	case sec - 1:
		rate = s.started
	}
	want := max(rate+(rate+3)/4-already, s.waiting)
	return min(max(want, 1), s.limit)
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
	s.left = 0 // tokens leased before the 429 are suspect
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
