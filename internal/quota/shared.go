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
	// Block is how many tokens one lease asks for. Defaults to a quarter of
	// a second's budget (at least 1): fewer round trips, yet room for four
	// workers a second.
	Block int
	// MinPenalty is the pause after a 429 without a usable Retry-After.
	// Defaults to DefaultMinPenalty.
	MinPenalty time.Duration
	Clock      clock.Clock
}

// Shared paces requests against a quota shared by many processes (Lambda
// instances): each second's budget lives in the Leaser, and a process leases
// a block of it at a time and spends the block evenly over the rest of the
// second. Tokens a process leased but did not use in their second are lost,
// which errs on the side of the quota.
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
	if cfg.Block <= 0 {
		cfg.Block = max(1, limit/4)
	}
	return &Shared{leaser: leaser, cfg: cfg, limit: limit}, nil
}

// Wait blocks until one request may start, or ctx ends.
func (s *Shared) Wait(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		now := s.cfg.Clock.Now()
		s.mu.Lock()
		if now.Before(s.pauseUntil) {
			wait := s.pauseUntil.Sub(now)
			s.mu.Unlock()
			if err := s.sleep(ctx, wait); err != nil {
				return err
			}
			continue
		}
		sec := now.Unix()
		if s.second == sec && s.left > 0 {
			at := s.next
			if at.Before(now) {
				at = now
			}
			s.left--
			s.next = at.Add(s.spacing)
			s.mu.Unlock()
			return s.sleep(ctx, at.Sub(now))
		}
		s.mu.Unlock()

		got, err := s.leaser.Lease(ctx, sec, s.cfg.Block, s.limit)
		if err != nil {
			return fmt.Errorf("lease quota tokens: %w", err)
		}
		if got == 0 {
			// This second is spent: wait for the next one.
			next := time.Unix(sec+1, 0)
			if err := s.sleep(ctx, next.Sub(s.cfg.Clock.Now())); err != nil {
				return err
			}
			continue
		}
		now = s.cfg.Clock.Now()
		end := time.Unix(sec+1, 0)
		s.mu.Lock()
		if s.second == sec {
			s.left += got // another goroutine leased for the same second too
		} else {
			s.second, s.left, s.next = sec, got, now
		}
		s.spacing = max(end.Sub(now)/time.Duration(s.left+1), 0)
		s.mu.Unlock()
	}
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
	s.mu.Unlock()
}

// Limit is the number of requests a calendar second may start.
func (s *Shared) Limit() int { return s.limit }

func (s *Shared) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.cfg.Clock.After(d):
		return nil
	}
}
