package quota

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
)

// Amount is a share of one calendar second's budget: requests, and model
// tokens (prompt plus completion) when a tokens-per-minute quota applies.
type Amount struct {
	Requests int
	Tokens   int
}

// Leaser hands out the budgets of calendar seconds shared by every worker
// of a deployment, and keeps the deployment's Ceiling beside them.
// dynamoquota implements it with one conditional DynamoDB update per lease
// (two when the seconds span a minute), requests, tokens and ceiling
// together.
type Leaser interface {
	// Lease takes up to want[i] of second from+i (Unix seconds), each
	// second out of the newest ceiling's Budget of limit, and returns how
	// much it got for each (less when others took the rest, 0 when a
	// second is spent) and that ceiling. The newest ceiling is known, or
	// the store's when it is newer; the store keeps known when known is
	// newer, so that a ceiling a process learned reaches the others even
	// if its own write of it failed. It never grants beyond the budget in
	// total for a second; a limit of 0 Tokens means tokens are not counted
	// (and none are granted).
	Lease(ctx context.Context, from int64, want []Amount, limit Limit, known Ceiling) (Lease, error)
	// Lower stores next as the deployment's ceiling unless the store holds
	// one newer than seen (another process cut first: its cut stands, and
	// this one, based on the same knowledge, would cut twice), and returns
	// the ceiling the store holds afterwards.
	Lower(ctx context.Context, seen, next Ceiling) (Ceiling, error)
	// Release gives back give[i] of second from+i, leased before and not
	// used, so that other processes can lease it.
	Release(ctx context.Context, from int64, give []Amount) error
	// Room reads, without writing, what is left of the n seconds from on
	// under the store's ceiling (the whole budget of a second nobody
	// leased), and how many releases were made into their minutes. A
	// process whose share was fixed by contention looks with it whether
	// others gave seconds back (Release) before it leases again.
	Room(ctx context.Context, from int64, n int, limit Limit) (Room, error)
}

// Room is what a Leaser's Room read.
type Room struct {
	// Left is what is left of each second read.
	Left []Amount
	// Releases counts the releases made into the minutes read, so far.
	Releases int64
}

// Lease is what a Leaser's Lease got.
type Lease struct {
	// Got is what each second asked for got.
	Got []Amount
	// Ceiling is the newest ceiling, the one the budgets were cut by.
	Ceiling Ceiling
	// Left is what the store had left, after the lease, of each second
	// from the first one asked for, as far as it read them: up to the end
	// of the last minute the lease touched where the store keeps a minute
	// together (dynamoquota reads it back from the same write), fewer or
	// none when it read less. It lets the process ask next no more than
	// there is, and skip the seconds that have nothing left.
	Left []Amount
}

// Tuning of the blocks a Shared limiter leases.
const (
	// leaseTokens is the least a lease should cover at the rate the
	// process draws: one lease (one write to the store) per this many
	// model calls at steady state, and about what a process that stops
	// drawing (or dies) leaves unused. A fleet of many processes sharing
	// a quota they could exceed loses some leases to contention, and
	// blocks that cross a minute cost two writes, so this is well above
	// the 20 calls a write the store's cost is held to. Measured over the
	// orders in which a fleet's processes may wake (TestSharedFleetLeaseCost's
	// median of 9; of 25 the same): fleets of 4, 8 and 16 processes (slow
	// calls) write once per 27, 24 and 23.6 calls, each order at 20.5 or
	// more. 50 made larger blocks but let a fleet that learns its quota
	// from 429s alone end up to 1.13 of its bound
	// (TestSharedFleetLearnsTheQuota), where 35 ends within 1.05.
	leaseTokens = 35
	// maxLeaseSeconds bounds how many seconds a lease covers. N processes
	// sharing R requests a second draw R/N each, and cover leaseTokens in
	// leaseTokens x N/R seconds: 30 s is about what 16 processes sharing
	// 19 a second need (longer did not help them, see above). It also bounds how long a
	// process that has not heard of a lowered ceiling uses the budget it
	// leased before (see cutAfter429's quiet time).
	maxLeaseSeconds = 30
	// maxBackoff bounds how long a process whose leases got nothing waits
	// before it asks again (1 s, then doubling): the fleet is using the
	// whole quota meanwhile, so waiting costs the deployment nothing.
	maxBackoff = 8 * time.Second
)

// SharedConfig configures a Shared limiter.
type SharedConfig struct {
	// RPM is the provider's quota across every worker of the deployment.
	RPM int
	// TPM is the tokens-per-minute quota across every worker; 0 means
	// none. Its per-second budget is PerSecond(TPM, margin), rounded down.
	TPM int
	// SafetyMargin is the fraction of RPM left unused; 0 means
	// DefaultSafetyMargin. Each second's budget is PerSecond(RPM, margin),
	// spread over the seconds where it is not whole (Ceiling.Budget), so
	// that any 60 s window, which touches at most 61 calendar seconds,
	// stays under RPM.
	SafetyMargin float64
	// MinPenalty is the pause after a 429 without a usable Retry-After.
	// Defaults to DefaultMinPenalty.
	MinPenalty time.Duration
	// Clock tells the time and waits. Defaults to clock.Real.
	Clock clock.Clock
	// Logger hears of the deployment's ceiling: when this process lowers
	// it, and when a write of it fails. Defaults to discarding.
	Logger *slog.Logger
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
// taking their own). The block is sized to the rate the process draws and
// reaches as many seconds ahead as it takes to cover leaseTokens at that
// rate, up to maxLeaseSeconds; each lease reads back what the store has
// left, and the next asks no more than that. While the fleet leaves room,
// the rate is the starts of the last second plus a quarter (or the
// goroutines waiting, if more), so a process grows into what it can use.
// Once a lease gets less than it asked (the fleet could draw more than the
// quota), the seconds it leased are final for the process and the rate is
// its share: what it drew over the last seconds, with no headroom, since
// asking more would only be refused. A process whose lease got nothing
// leases next where the store said there was room, or backs off (1 s,
// doubling to maxBackoff) when there was none. So at steady state a write
// covers about leaseTokens model calls, whether the process is held back
// by its own concurrency or the fleet by the quota (TestSharedLeaseCost,
// TestSharedFleetLeaseCost).
//
// A quota configured too high is learned for the whole fleet: a 429 lowers
// the deployment's Ceiling in the store (one conditional write; none for
// the 429s of the same event), every lease honours the newest ceiling and
// returns it, so the other processes learn it with their next lease at no
// extra cost, and it probes back up with time computed from when it was
// set. A rate-limit header with a lower limit than configured sets a
// ceiling too.
type Shared struct {
	leaser Leaser
	cfg    SharedConfig
	// limit is the requests a calendar second may start under no
	// ceiling (Ceiling.Budget spreads a fraction over the seconds).
	limit float64
	// tokLimit is the model tokens per calendar second; 0 when no TPM.
	tokLimit int

	mu sync.Mutex
	// grants holds the leased budget not taken yet, by second.
	grants map[int64]Amount
	// tokFull holds the seconds the store has no model tokens left for.
	tokFull map[int64]bool
	// avgTok is a moving average of the tokens a request is charged, and
	// usedRatio of the share of its charge it used (Settle), to size and
	// pace the token part of a block.
	avgTok    float64
	usedRatio float64
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
	// room holds what the store had left of each second when a lease last
	// saw it, so that the next block asks where there is room.
	room map[int64]Amount
	// zeroLeases counts the leases in a row that got nothing; no lease is
	// made before backoffUntil unless the process holds the second.
	zeroLeases   int
	backoffUntil time.Time
	// rechecked is when the process last looked again at a second it
	// knew to be spent (recheckLocked), and lastStart when it last
	// started a request.
	rechecked, lastStart time.Time
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
	// hist holds the starts of the last histSeconds seconds, by second.
	hist [histSeconds]secondStarts
	// contended is set when the last lease got less than it asked for a
	// second: the fleet uses the rest.
	contended bool
	// looked is when the process last read the store's room (lookLocked),
	// lookReleases the releases that read counted.
	looked       time.Time
	lookReleases int64
	// changed is closed (and replaced) by Penalize, waking goroutines
	// whose slot or pause it invalidates.
	changed chan struct{}
	// ceil is the newest deployment ceiling this process knows; wrote is
	// when it last wrote one (at most one a cutEvery).
	ceil  Ceiling
	wrote time.Time
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	limit := PerSecond(cfg.RPM, cfg.SafetyMargin)
	if limit < 1 {
		// Under 61 RPM some seconds' budgets are 0; such quotas are not
		// worth a shared limiter's round trips.
		return nil, fmt.Errorf("shared quota: RPM %d is below one request a second; use a lower concurrency instead", cfg.RPM)
	}
	tokLimit := 0
	if cfg.TPM > 0 {
		tokLimit = int(math.Floor(PerSecond(cfg.TPM, cfg.SafetyMargin)))
		if tokLimit < 1 {
			return nil, fmt.Errorf("shared quota: TPM %d is below one token a second", cfg.TPM)
		}
	}
	return &Shared{leaser: leaser, cfg: cfg, limit: limit, tokLimit: tokLimit,
		grants: map[int64]Amount{}, full: map[int64]bool{}, tokFull: map[int64]bool{}, room: map[int64]Amount{}}, nil
}

// Wait blocks until one request estimated at tokens may start, or ctx
// ends. A request estimated above a second's token budget is charged the
// whole second.
func (s *Shared) Wait(ctx context.Context, tokens int) error {
	tok := 0
	s.mu.Lock()
	if s.tokLimit > 0 {
		tok = min(max(tokens, 0), s.tokLimit)
		if s.avgTok == 0 {
			s.avgTok = float64(tok)
		} else {
			s.avgTok += (float64(tok) - s.avgTok) / 8
		}
	}
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
		if at, ok := s.takeLocked(now, tok); ok {
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
		spent := s.spentLocked(sec, tok)
		if spent && s.recheckLocked(now) {
			// Goroutines wait and the next second this process holds is
			// far: others may have given back the seconds between (a
			// process that stopped drawing releases what it held), which
			// this process's knowledge cannot show. Look once.
			s.full[sec], s.tokFull[sec] = false, false
			delete(s.room, sec)
			s.rechecked = now
			spent = false
		}
		if now.Before(s.backoffUntil) && s.grants[sec].Requests == 0 || spent && (s.zeroLeases == 0 || s.holdsAheadLocked(sec)) {
			// Backing off (the last lease found no room at all), or
			// nothing is left of this second for this process and it
			// holds a later one or was not refused: wait for the next
			// second rather than write for nothing. A refused process
			// with nothing ahead leases now, where the store said there
			// was room.
			if s.lookLocked(ctx, now) {
				// Others gave seconds back: lease them now.
				s.mu.Unlock()
				continue
			}
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
		from, want := s.blockLocked(now, tok, spent)
		if len(want) == 0 {
			// Every second within reach is spent, as far as the store
			// said: wait for the next one rather than write for nothing.
			s.mu.Unlock()
			if err := s.sleep(ctx, time.Unix(sec+1, 0).Sub(now), changed); err != nil {
				return err
			}
			continue
		}
		known := s.ceil
		done := make(chan struct{})
		s.leasing = done
		s.mu.Unlock()

		lease, err := s.leaser.Lease(ctx, from, want, s.limitValue(), known)

		s.mu.Lock()
		s.leasing = nil
		close(done)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("lease quota tokens: %w", err)
		}
		s.adoptLocked(lease.Ceiling, sec)
		got := lease.Got
		contended := false
		for i, w := range want {
			var n Amount
			if i < len(got) {
				n = got[i]
			}
			k := from + int64(i)
			g := s.grants[k]
			g.Requests += n.Requests
			g.Tokens += n.Tokens
			s.grants[k] = g
			if n.Requests < w.Requests {
				s.full[k] = true
				contended = true
			}
			// Less than asked, or the whole second's tokens: the store
			// has none left for it.
			if n.Tokens < w.Tokens || (s.tokLimit > 0 && n.Tokens >= s.budgetLocked(k).Tokens) {
				s.tokFull[k] = true
			}
		}
		s.contended = contended
		if contended {
			// The fleet uses every second the block reached: what this
			// process got of each is its share, and topping a second up
			// later would be refused (a write for nothing each second).
			for i := range want {
				s.full[from+int64(i)] = true
			}
		}
		if slices.ContainsFunc(got, func(a Amount) bool { return a.Requests > 0 }) {
			s.zeroLeases = 0
		} else {
			// The fleet uses every second this lease asked for. The next
			// lease goes where the store said there is room; with none,
			// asking again each second would cost a write each for
			// nothing while the others use the quota.
			s.zeroLeases++
			room := false
			for i, l := range lease.Left {
				if from+int64(i) > sec && l.Requests > 0 {
					room = true
				}
			}
			if !room {
				s.backoffUntil = now.Add(min(time.Second<<(s.zeroLeases-1), maxBackoff))
			}
		}
		for i, l := range lease.Left {
			k := from + int64(i)
			s.room[k] = l
			if l.Requests <= 0 {
				s.full[k] = true
			}
			if s.tokLimit > 0 && l.Tokens <= 0 {
				s.tokFull[k] = true
			}
		}
		if from == sec && s.cur == sec && len(got) > 0 && got[0].Requests > 0 {
			// Topped up mid-second: spread the rest over what is left
			// of it after the starts already placed.
			s.spacing = s.spacingLocked(later(s.cfg.Clock.Now(), s.next), s.grants[sec].Requests)
		}
		s.mu.Unlock()
	}
}

// takeLocked takes a request and tok model tokens of now's second, if the
// block holds them, and returns when the request may start.
func (s *Shared) takeLocked(now time.Time, tok int) (time.Time, bool) {
	sec := now.Unix()
	g := s.grants[sec]
	left := g.Requests
	if left <= 0 || g.Tokens < tok {
		return time.Time{}, false
	}
	if s.cur != sec {
		for k := range s.grants {
			if k < sec {
				delete(s.grants, k) // unused budget of past seconds
			}
		}
		for k := range s.full {
			if k < sec {
				delete(s.full, k)
			}
		}
		for k := range s.tokFull {
			if k < sec {
				delete(s.tokFull, k)
			}
		}
		for k := range s.room {
			if k < sec {
				delete(s.room, k)
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
		// second: they are lost, as unused ones are, and leasing more of
		// the second would only lose those too.
		delete(s.grants, sec)
		s.full[sec] = true
		return time.Time{}, false
	}
	g.Requests--
	g.Tokens -= tok
	s.grants[sec] = g
	spacing := s.spacing
	if s.tokLimit > 0 {
		// Never spend tokens faster than the quota's pace either.
		// Unused tokens come back (Settle), so pace at what calls use.
		spacing = max(spacing, time.Duration(float64(tok)*s.ratioLocked()/float64(s.budgetLocked(sec).Tokens)*float64(time.Second)))
	}
	s.next = at.Add(spacing)
	return at, true
}

// spacingLocked spreads left tokens over the rest of now's second, but
// never faster than the quota's pace, so that a block topped up late in a
// second does not burst into the first tokens of the next.
func (s *Shared) spacingLocked(now time.Time, left int) time.Duration {
	end := time.Unix(now.Unix()+1, 0)
	rate := max(s.limit*s.ceil.ShareAt(now), minShare)
	return max(end.Sub(now)/time.Duration(left+1), time.Duration(float64(time.Second)/rate))
}

// budgetLocked is what second sec may start under the newest ceiling known.
func (s *Shared) budgetLocked(sec int64) Amount {
	return s.ceil.Budget(s.limitValue(), sec)
}

// limitValue is the configured limit, as the store's budgets take it.
func (s *Shared) limitValue() Limit {
	return Limit{Requests: s.limit, Tokens: float64(s.tokLimit)}
}

// adoptLocked takes in a ceiling the store returned at second sec: when it
// is newer than the one known, it replaces it (setCeilingLocked).
func (s *Shared) adoptLocked(c Ceiling, sec int64) {
	if c.Newer(s.ceil) {
		s.setCeilingLocked(c, sec)
	}
}

// setCeilingLocked makes c the ceiling known at second sec. The budget
// this process leased for later seconds under the old one shrinks in
// proportion: every process does the same when it learns of c, so each
// second's leases together fit its new budget, and none of it is wasted
// (dropping them would leave those seconds unused, as the store counts
// them as taken).
func (s *Shared) setCeilingLocked(c Ceiling, sec int64) {
	at := time.Unix(sec, 0)
	ratio := c.ShareAt(at) / s.ceil.ShareAt(at)
	s.ceil = c
	if ratio >= 1 {
		return
	}
	for k, g := range s.grants {
		if k > sec {
			g.Requests = int(float64(g.Requests) * ratio)
			g.Tokens = int(float64(g.Tokens) * ratio)
			s.grants[k] = g
		}
	}
}

// changedLocked returns the channel the next Penalize closes.
func (s *Shared) changedLocked() chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// blockLocked is what to lease: from which second (now's, unless spent
// says nothing is left of it for this process, or the store said so), and
// how much of each second from there; nothing when no second within
// maxLeaseSeconds has room.
//
// Per second it asks for the rate the process draws (see Shared): while
// the fleet leaves room, the starts of its last full second plus a
// quarter, or what its starts so far in this second project when they
// outrun that (the block ran out mid-second: demand grew), or the
// goroutines waiting if more; once the fleet is contended, its average
// over the last seconds. Capped at the ceiling's rate. Now's second asks
// for what is left of that after the starts made in it, and no more than
// still fits in the second after the slots already placed; the later
// seconds for what the process does not hold yet: a top-up must not lease
// again the seconds an earlier block covers (it used to, and one process
// held budget it could not use while others starved). Seconds known to be
// spent are skipped, and none is asked for more than the store had left
// when a lease last saw it. Only a rate measured over a whole second
// reaches ahead, over enough seconds for leaseTokens.
func (s *Shared) blockLocked(now time.Time, tok int, spent bool) (int64, []Amount) {
	sec := now.Unix()
	already := 0
	if s.startedSec == sec {
		already = s.started
	}
	// The block is capped at the ceiling's rate: the store holds each
	// second to its own budget.
	ceilingRate := max(s.limit*s.ceil.ShareAt(now), 1)
	var perSecond float64
	measured := false
	if s.contended {
		// The fleet uses every second the last block reached: what this
		// process drew over the last seconds is its share of them (one
		// second's starts swing with calls that start together and take
		// several seconds), and asking more would only be refused.
		avg := s.averageLocked(sec)
		perSecond, measured = max(avg, 1), avg > 0
	} else {
		rate, full := 0, 0
		switch s.startedSec {
		case sec:
			full = s.prevStarted
			// The block ran out mid-second: the starts so far project
			// the second's demand (as if a quarter of it had passed, at
			// least: a block spent sooner than that is no reason to ask
			// for one request at a time).
			f := max(now.Sub(time.Unix(sec, 0)).Seconds(), minProjection)
			rate = max(s.prevStarted, int(math.Ceil(float64(already)/f)))
		case sec - 1:
			rate, full = s.started, s.started
		}
		// Only a whole second's starts reach ahead: a projection from a
		// part of one, or a burst of waiting goroutines, may be gone next
		// second, and a block reaching ahead fixes those seconds' grants.
		perSecond, measured = float64(max(rate+(rate+3)/4, s.waiting, 1)), full > 0
	}
	perSecond = min(perSecond, ceilingRate)
	if s.tokLimit > 0 && s.avgTok > 0 {
		// No more requests than a second's tokens can start: the rest
		// would be held from other processes for nothing.
		perSecond = min(perSecond, max(float64(s.tokLimit)/(s.avgTok*s.ratioLocked()), 1))
	}
	seconds := 1
	if measured {
		seconds = min(max(int(math.Ceil(leaseTokens/perSecond)), 1), maxLeaseSeconds)
	}
	tokensFor := func(requests int) int {
		return min(int(math.Ceil(float64(requests)*s.avgTok*s.ratioLocked())), s.tokLimit)
	}
	var want []Amount
	for k, covered := sec, 0; k < sec+maxLeaseSeconds && covered < seconds; k++ {
		if k%60 == 0 && k > sec && 2*covered >= seconds {
			// The next minute is another item, another write: a block
			// that covers half its reach already ends here.
			break
		}
		var w Amount
		switch {
		case k == sec && spent:
		case k == sec:
			w.Requests = min(max(int(math.Ceil(perSecond))-already, s.waiting, 1), int(math.Ceil(ceilingRate)))
			if s.cur == sec {
				// The block's slots are placed to s.next: no more than the
				// quota's pace fits in what is left of the second after
				// them (a top-up beyond it would be lost).
				fit := max(int(time.Unix(sec+1, 0).Sub(later(now, s.next)).Seconds()*ceilingRate), 0)
				if fit == 0 {
					s.full[sec] = true // for this process: nothing more fits
				}
				w.Requests = min(w.Requests, fit)
			}
			if s.tokLimit > 0 {
				// At least what the caller needs beyond what is left.
				w.Tokens = min(max(tokensFor(w.Requests), tok-s.grants[sec].Tokens), s.tokLimit)
				if s.tokFull[sec] {
					w.Tokens = 0
				}
			}
		case s.full[k] || s.tokLimit > 0 && s.tokFull[k]:
		default:
			// The rate spread over the block's seconds, whole requests
			// adding up to it (1.2 a second asks 1, 1, 1, 1, 2, ...), not
			// rounded up in each: a fleet whose shares are fractions of
			// a request, each asking the next whole one every second,
			// asked 60 % more than the seconds hold, and its refused and
			// part-granted leases cost a write each (16 processes sharing
			// 19.7 a second wrote once per 17.6 calls; now 23.6).
			j := float64(k - sec)
			w.Requests = max(int(math.Floor((j+1)*perSecond))-int(math.Floor(j*perSecond))-s.grants[k].Requests, 0)
			if s.tokLimit > 0 {
				w.Tokens = tokensFor(w.Requests)
			}
		}
		if r, ok := s.room[k]; ok {
			w.Requests = min(w.Requests, r.Requests)
			if s.tokLimit > 0 {
				w.Tokens = min(w.Tokens, r.Tokens)
			}
		}
		if k > sec && (w.Requests > 0 || s.grants[k].Requests > 0) || k == sec && !spent {
			covered++
		}
		want = append(want, w)
	}
	// Seconds at either end with nothing to ask need no place in the
	// write.
	from := sec
	for len(want) > 0 && want[0] == (Amount{}) {
		want, from = want[1:], from+1
	}
	for len(want) > 0 && want[len(want)-1] == (Amount{}) {
		want = want[:len(want)-1]
	}
	return from, want
}

// spentLocked reports whether the store, as far as this process knows,
// has nothing left for second sec that a request of tok tokens could use:
// it said so, the ceiling leaves the second nothing, this process started
// the whole second's budget itself, or its tokens are gone.
func (s *Shared) spentLocked(sec int64, tok int) bool {
	budget := s.budgetLocked(sec).Requests
	return s.full[sec] || budget == 0 || (s.startedSec == sec && s.started >= budget) ||
		(tok > 0 && s.tokFull[sec] && s.grants[sec].Tokens < tok)
}

// secondStarts is how many requests a process started in second sec.
type secondStarts struct {
	sec int64
	n   int
}

// histSeconds is how many seconds of starts a process keeps to know the
// rate it draws.
const histSeconds = 8

// recheckLocked reports whether the process should look again at a second
// it knows to be spent: it has started nothing for recheckGap, holds
// nothing before a second recheckGap or more ahead, has not looked for
// recheckGap, and is not backing off.
func (s *Shared) recheckLocked(now time.Time) bool {
	sec := now.Unix()
	if now.Sub(s.rechecked) < recheckGap || now.Sub(s.lastStart) < recheckGap || now.Before(s.backoffUntil) {
		return false
	}
	for k, g := range s.grants {
		if k > sec && k < sec+int64(recheckGap/time.Second) && g.Requests > 0 {
			return false
		}
	}
	return s.holdsAheadLocked(sec)
}

// recheckGap is how far the next second a process holds must be, and how
// long since it last looked, before it looks again at a spent second.
const recheckGap = 3 * time.Second

// lookSeconds is how many seconds from now lookLocked reads: the seconds
// a process is about to need, where a fleet at its quota leaves nothing.
const lookSeconds = 3

// lookLocked reads the store's room in the next seconds, at most once per
// recheckGap, when goroutines wait and the process's share was fixed by
// contention or refused (it asks no more than it drew, or backs off): the
// fleet that held the seconds may have given them back since (a process
// whose work ended releases what it leased ahead), which the process
// cannot know otherwise. Without it the last process still drawing ran
// the end of a job at the share it had among many, up to a block's length
// (TestSharedFleetLearnsTheQuota's one-minute job ended at 1.155 of its
// bound one run in eight, 9 s spent by one process at a quarter of the
// quota). A read costs no write; room found makes the next lease ask for
// the process's demand. It unlocks s.mu while it reads and reports whether
// it found room.
func (s *Shared) lookLocked(ctx context.Context, now time.Time) bool {
	if s.waiting == 0 || !s.contended && s.zeroLeases == 0 || now.Sub(s.looked) < recheckGap {
		return false
	}
	s.looked = now
	sec := now.Unix()
	limit := s.limitValue()
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, lowerTimeout)
	read, err := s.leaser.Room(ctx, sec, lookSeconds, limit)
	cancel()
	s.mu.Lock()
	if err != nil {
		s.cfg.Logger.Warn("shared quota: could not read the store's room; leasing as before", "error", err)
		return false
	}
	// Room counts only when another process gave some back since the last
	// look: without a release, what looks free is seconds the fleet's
	// blocks have not reached yet (a minute's first seconds, say), which
	// it leases as it gets there.
	released := read.Releases > 0 && read.Releases != s.lookReleases
	s.lookReleases = read.Releases
	if !released {
		return false
	}
	room := read.Left
	// Room worth a lease: half of this second's budget or more still free,
	// and nobody else holding any of the seconds after it. A fleet at its
	// quota has leased the second it is in, and leaves the seconds after
	// unleased only until its blocks reach them, so either alone is found
	// at steady state too, and leasing on it would cost a write each for
	// little (TestSharedFleetLeaseCost); a fleet that stopped drawing
	// leaves both.
	found := len(room) == lookSeconds
	for i, r := range room {
		k := sec + int64(i)
		s.room[k] = r
		b, g := s.budgetLocked(k), s.grants[k]
		switch {
		case i == 0 && (2*r.Requests < max(b.Requests, 2) || s.tokLimit > 0 && 2*r.Tokens < b.Tokens):
			found = false
		case i > 0 && (r.Requests+g.Requests < b.Requests || s.tokLimit > 0 && r.Tokens+g.Tokens < b.Tokens):
			found = false
		}
	}
	if found {
		for i := range room {
			k := sec + int64(i)
			s.full[k], s.tokFull[k] = false, false
		}
	}
	if found {
		s.contended, s.zeroLeases, s.backoffUntil = false, 0, time.Time{}
	}
	return found
}

// holdsAheadLocked reports whether the process holds a lease of a second
// after sec.
func (s *Shared) holdsAheadLocked(sec int64) bool {
	for k, g := range s.grants {
		if k > sec && g.Requests > 0 {
			return true
		}
	}
	return false
}

// minProjection is the least part of a second whose starts project the
// rate of the whole second: earlier, a few goroutines starting together
// would project a burst.
const minProjection = 0.25

// averageLocked is the starts a second over the last histSeconds
// seconds before sec, or over the seconds since the first start when
// fewer.
func (s *Shared) averageLocked(sec int64) float64 {
	n, span := 0, 0
	for k := sec - histSeconds; k < sec; k++ {
		h := s.hist[k%histSeconds]
		if h.sec == k {
			n += h.n
			if span == 0 {
				span = int(sec - k)
			}
		}
	}
	if span == 0 {
		return 0
	}
	return float64(n) / float64(span)
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
	s.lastStart = s.cfg.Clock.Now()
	h := &s.hist[sec%histSeconds]
	if h.sec != sec {
		*h = secondStarts{sec: sec}
	}
	h.n++
}

// Penalize reports a 429: this process starts nothing before retryAfter
// (at least MinPenalty) has passed, and, unless the 429 belongs to an event
// that already cut it (see cutAfter429), the deployment's ceiling is cut
// for every process: at once here, and in the store with one conditional
// write. A failed write is logged; the cut still holds here, and this
// process's next lease carries it to the store.
func (s *Shared) Penalize(retryAfter time.Duration) {
	retryAfter = min(max(retryAfter, s.cfg.MinPenalty), maxPenalty)
	now := s.cfg.Clock.Now()
	until := now.Add(retryAfter)
	s.mu.Lock()
	if until.After(s.pauseUntil) {
		s.pauseUntil = until
	}
	// The budget leased for the pause is lost; the seconds after it keep
	// theirs, cut in proportion when the ceiling is.
	for k := range s.grants {
		if k <= s.pauseUntil.Unix() {
			delete(s.grants, k)
		}
	}
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	next, cut := cutAfter429(s.ceil, now, retryAfter)
	s.lowerAndUnlock(now, next, cut, "429")
}

// lowerAndUnlock makes next the ceiling when lower says so and this
// process wrote none for cutEvery, unlocks s.mu, and then writes it to the
// store: Penalize's and Observe's one rule for a new ceiling.
func (s *Shared) lowerAndUnlock(now time.Time, next Ceiling, lower bool, why string) {
	seen := s.ceil
	lower = lower && now.Sub(s.wrote) >= cutEvery
	if lower {
		s.setCeilingLocked(next, now.Unix())
		s.wrote = now
	}
	s.mu.Unlock()
	if lower {
		s.lower(seen, next, why)
	}
}

// lower writes next to the store, in place of seen, and adopts what the
// store holds afterwards. Penalize and Observe have no context: the write
// gets its own, bounded, so that a store that hangs cannot hold the caller.
func (s *Shared) lower(seen, next Ceiling, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), lowerTimeout)
	defer cancel()
	stored, err := s.leaser.Lower(ctx, seen, next)
	if err != nil {
		s.cfg.Logger.Warn("shared quota: could not store the lowered ceiling; this instance keeps it and its next lease stores it",
			"share", next.Share, "reason", why, "error", err)
		return
	}
	if stored.At == next.At {
		s.cfg.Logger.Info("shared quota: lowered the deployment's ceiling", "share", next.Share,
			"requests_per_second", s.limit*next.Share, "reason", why)
	}
	s.mu.Lock()
	if stored.Newer(s.ceil) || stored.At != next.At && s.ceil.At == next.At {
		// Another process cut first: its ceiling replaces this one.
		s.setCeilingLocked(stored, s.cfg.Clock.Now().Unix())
	}
	s.mu.Unlock()
}

// lowerTimeout bounds a ceiling write.
const lowerTimeout = 5 * time.Second

// Settle corrects a started request's charge with the tokens the provider
// reported it used: unused tokens go back to the current second's block (the
// store keeps the charge: returning them would cost a write each), extra
// ones are taken from it. Either way the error is confined to the seconds
// a call takes.
func (s *Shared) Settle(charged, used int) {
	if s.tokLimit == 0 || used < 0 || used == charged {
		return
	}
	sec := s.cfg.Clock.Now().Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	if charged > 0 {
		r := min(float64(used)/float64(charged), 1)
		if s.usedRatio == 0 {
			s.usedRatio = r
		} else {
			s.usedRatio += (r - s.usedRatio) / 8
		}
	}
	g, ok := s.grants[sec]
	if !ok {
		return
	}
	g.Tokens = max(g.Tokens+min(charged, s.tokLimit)-used, 0)
	s.grants[sec] = g
}

// ratioLocked is the share of a charge calls use, 1 until known.
func (s *Shared) ratioLocked() float64 {
	if s.usedRatio <= 0 {
		return 1
	}
	return max(s.usedRatio, 0.05)
}

// Observe takes in a provider's rate-limit headers: a request or token
// limit below the configured quota becomes the deployment's ceiling (Fixed,
// see stated), at most one write a cutEvery. The remaining counts are not
// used: one process's headers count the others' use too, which the store's
// budgets already account for.
func (s *Shared) Observe(rl llm.RateLimits) {
	if !rl.Known() {
		return
	}
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	seen := s.ceil
	next, lower := stated(seen, now, rl.Requests.Limit, s.limit, s.cfg.SafetyMargin)
	if c, ok := stated(seen, now, rl.Tokens.Limit, float64(s.tokLimit), s.cfg.SafetyMargin); ok && (!lower || c.Share < next.Share) {
		next, lower = c, true
	}
	s.lowerAndUnlock(now, next, lower, "rate-limit header")
}

// Release gives back to the store what this process leased of the seconds
// after the current one: one write for each minute they fall in, none when
// it holds none. Call it when the process stops drawing for a while (a
// Lambda invocation's records are all settled, and the instance may be
// frozen until the next one): what it holds ahead would otherwise be lost
// to the fleet, which at the end of a job is seconds the other instances
// wait for. A lease in flight is left alone (the process is not idle).
func (s *Shared) Release(ctx context.Context) error {
	s.mu.Lock()
	if s.leasing != nil {
		s.mu.Unlock()
		return nil
	}
	sec := s.cfg.Clock.Now().Unix()
	from, to := int64(math.MaxInt64), int64(0)
	for k, g := range s.grants {
		if k > sec && (g.Requests > 0 || g.Tokens > 0) {
			from, to = min(from, k), max(to, k)
		}
	}
	if to == 0 {
		s.mu.Unlock()
		return nil
	}
	give := make([]Amount, to-from+1)
	for k := from; k <= to; k++ {
		give[k-from] = s.grants[k]
		delete(s.grants, k)
		delete(s.full, k)
		delete(s.tokFull, k)
		delete(s.room, k)
	}
	s.mu.Unlock()
	if err := s.leaser.Release(ctx, from, give); err != nil {
		return fmt.Errorf("release quota seconds %d to %d: %w", from, to, err)
	}
	return nil
}

// Limit is the number of requests a calendar second may start under the
// configured quota.
func (s *Shared) Limit() float64 { return s.limit }

// Ceiling is the newest deployment ceiling this process knows.
func (s *Shared) Ceiling() Ceiling {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ceil
}

// Rate is the requests a second the deployment may start now, under the
// newest ceiling this process knows.
func (s *Shared) Rate() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit * s.ceil.ShareAt(s.cfg.Clock.Now())
}

// sleep waits d, or until ctx ends (its error) or changed is closed (nil).
func (s *Shared) sleep(ctx context.Context, d time.Duration, changed <-chan struct{}) error {
	return clock.Sleep(ctx, s.cfg.Clock, d, changed)
}
