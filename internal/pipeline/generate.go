package pipeline

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/prompt"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/store"
)

// Limiter paces model calls to the provider's request and token quotas.
// quota.Local implements it for one process; quota.Shared over a DynamoDB
// lease store shares it across Lambdas. The generator calls Wait before
// every call, then Observe with the answer's rate-limit headers, then
// Settle with the usage of an answered call or Penalize for a 429.
type Limiter interface {
	// Wait blocks until one request estimated at tokens (prompt plus the
	// most the completion may use, llm.EstimateRequestTokens) may start,
	// or ctx ends.
	Wait(ctx context.Context, tokens int) error
	// Settle corrects the charge of a started call with the tokens the
	// provider reported it used (input plus output); used < 0 when it
	// reported none.
	Settle(charged, used int)
	// Observe takes in what the provider's rate-limit headers said.
	Observe(rl llm.RateLimits)
	// Penalize reports a 429: nobody should start a request before
	// retryAfter has passed, and the rate should back off.
	Penalize(retryAfter time.Duration)
}

// CacheMode says when a task reuses cached outputs instead of calling the
// model.
type CacheMode string

// Cache modes.
const (
	// CacheAuto reuses outputs unless the task asks for variety: a
	// temperature above 0 means each row should get a fresh sample. A task
	// that sets no temperature reuses (the provider's default applies, and
	// asking for variety is asking by temperature).
	CacheAuto CacheMode = "auto"
	// CacheAlways reuses outputs whatever the temperature.
	CacheAlways CacheMode = "always"
	// CacheOff never reuses outputs (they are still written, when a cache
	// is configured, for later runs in another mode).
	CacheOff CacheMode = "off"
)

// ParseCacheMode reads a --cache value.
func ParseCacheMode(s string) (CacheMode, error) {
	switch m := CacheMode(s); m {
	case CacheAuto, CacheAlways, CacheOff:
		return m, nil
	}
	return "", fmt.Errorf("cache mode %q: use auto, always or off", s)
}

// CacheScope says whose answers a task may reuse.
type CacheScope string

// Cache scopes.
const (
	// CachePerPrincipal reuses only answers to the task's own principal's
	// calls, so that no principal learns from a cache hit (cached: true, no
	// tokens) that another sent the same prompt. The default.
	CachePerPrincipal CacheScope = "principal"
	// CacheShared reuses answers across a deployment's principals: fewer
	// calls, but anyone can tell whether anyone sent a prompt within the
	// cache's lifetime. batchgen run, where there is one principal, uses it.
	CacheShared CacheScope = "deployment"
)

// ParseCacheScope reads a --cache-scope value ("" is the default).
func ParseCacheScope(s string) (CacheScope, error) {
	switch c := CacheScope(s); c {
	case "":
		return CachePerPrincipal, nil
	case CachePerPrincipal, CacheShared:
		return c, nil
	}
	return "", fmt.Errorf("cache scope %q: use principal (each principal its own answers) or deployment (shared, and revealing)", s)
}

// ParseCacheTTL reads how long a cached output is reused: whole days
// ("30d", as the CacheTtlDays template parameter gives it) or a Go duration
// ("12h"). Both entry points (run/serve's --cache-ttl and the generator
// Lambda's CACHE_TTL) read it here, so they accept the same values; "" is
// store.DefaultCacheTTL.
func ParseCacheTTL(s string) (time.Duration, error) {
	if s == "" {
		return store.DefaultCacheTTL, nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n > 100*365 {
			return 0, fmt.Errorf("cache TTL %q: want whole days such as 30d, or a duration such as 12h", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("cache TTL %q: want whole days such as 30d, or a duration such as 12h", s)
		}
	}
	if d <= 0 {
		return 0, fmt.Errorf("cache TTL %q: must be positive (to stop reusing outputs, use cache mode off)", s)
	}
	return d, nil
}

// ParseRetryDelays reads the graded delays before a released batch is tried
// again: durations separated by commas ("10s,60s,300s"), at least one.
func ParseRetryDelays(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		d, err := time.ParseDuration(part)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%q is not a duration such as 10s or 5m", part)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, errors.New("give at least one delay, e.g. 10s,60s,300s")
	}
	return out, nil
}

// Reuses reports whether a task with spec may take its outputs from the
// cache under mode m.
func (m CacheMode) Reuses(spec store.TaskSpec) bool {
	switch m {
	case CacheAlways:
		return true
	case CacheOff:
		return false
	}
	return spec.Temperature == nil || *spec.Temperature <= 0
}

// DefaultCallTimeout is GeneratorConfig.CallTimeout's default.
const DefaultCallTimeout = 60 * time.Second

// DefaultErrorDelay is GeneratorConfig.ErrorDelay's default.
const DefaultErrorDelay = 10 * time.Second

// GeneratorConfig tunes the generator and names its optional
// collaborators. Zero fields take the defaults; NewGenerator applies them
// and validates the result, once.
type GeneratorConfig struct {
	// Cache, when non-nil, short-circuits prompts answered before, as
	// CacheMode allows; answers are written to it either way.
	Cache store.Cache
	// CacheMode says when Cache's outputs are reused. Defaults to
	// CacheAuto.
	CacheMode CacheMode
	// CacheScope says whose answers are reused. Defaults to
	// CachePerPrincipal.
	CacheScope CacheScope
	// Limiter, when non-nil, paces calls to the provider's quota.
	Limiter Limiter
	// Prices price the calls of a task with a spending cap
	// (store.Task.MaxCost; see budget.go), looked up by the answering
	// route's name, then the model, then the task's provider. Without them
	// a capped task is stopped at its first call rather than spend without
	// bound.
	Prices *pricing.Table
	// Allowances, when non-nil, is the fleet's ledger of capped tasks: a
	// runtime whose task's batches run in many processes at once (the AWS
	// generators) holds each task to its cap across them (budget.go).
	// Without it the process's ledger is the task's (the embedded runtime).
	Allowances store.Allowances
	// Observer, when non-nil, receives row events.
	Observer Observer
	// Owner names this worker in claims, for operators. Defaults to
	// "generator".
	Owner string
	// Clock times leases, backoff and flushes. Defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Metrics receives the use case's metrics. Defaults to recording
	// nothing.
	Metrics metrics.Recorder

	// Concurrency bounds in-flight model calls across all batches of this
	// generator. Defaults to 8.
	Concurrency int
	// Lease is how long a claim lasts without renewal; it is renewed every
	// Lease/3 while the batch runs. Defaults to 2 minutes.
	Lease time.Duration
	// CallTimeout bounds one model call of a plain provider (a Router's
	// routes have their own). Defaults to 60 seconds.
	CallTimeout time.Duration
	// PackTokens bounds the estimated prompt of a call that packs several
	// rows (TaskSpec.RowsPerCall), so that it fits the token quota:
	// providerfile.File.PackTokens. 0 (or more than MaxPackPromptTokens)
	// means MaxPackPromptTokens.
	PackTokens int
	// CallsPerRound is how many calls a row gets within one claim of its
	// batch before the batch is released for later redelivery. Defaults to 3.
	CallsPerRound int
	// Rounds is how many claims' worth of calls a row gets in all; a row
	// still failing retryably after CallsPerRound*Rounds calls is FAILED with
	// class retry_exhausted. Defaults to 4.
	Rounds int
	// RetryDelays are the graded redelivery delays after round 1, 2, 3...;
	// the last repeats. Defaults to 10s, 60s, 300s.
	RetryDelays []time.Duration
	// BackoffBase and BackoffMax shape the in-round backoff between calls
	// (exponential with jitter). Default to 500ms and 20s.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// ErrorDelay is how soon a message whose handling failed transiently
	// (a store outage, say) is delivered again. Defaults to 10 seconds, the
	// first of the default RetryDelays.
	ErrorDelay time.Duration
	// FlushRows is how many row results are written together at most: a
	// result waits for company until FlushRows results are pending or
	// FlushInterval has passed since the first of them, whichever comes
	// first (and the batch's end flushes the rest). A crash loses the
	// pending results, whose rows are then called again, so the window is
	// kept small. Defaults to 10; at most store.MaxSaveRows.
	FlushRows int
	// FlushInterval is how long a row result may wait to be written with
	// others. Defaults to 200 milliseconds. FlushAtOnce writes each result
	// as soon as no other write of its batch is in progress.
	FlushInterval time.Duration
	// Economy tunes the provider batches of economy and auto tasks.
	Economy EconomyConfig
}

// FlushAtOnce is the GeneratorConfig.FlushInterval of a store whose writes
// cost little and nothing per call (SQLite): a result is written as soon as
// the batch's previous write has finished, together with every result that
// arrived during it (group commit). Under load the groups are as large as
// the writes are slow; at a kill only results that were being written are
// lost, as with one write per row.
const FlushAtOnce time.Duration = -1

func (c GeneratorConfig) withDefaults() GeneratorConfig {
	c.CacheMode = cmp.Or(c.CacheMode, CacheAuto)
	c.CacheScope = cmp.Or(c.CacheScope, CachePerPrincipal)
	c.Owner = cmp.Or(c.Owner, "generator")
	c.Clock = orClock(c.Clock)
	c.Logger = orLogger(c.Logger)
	c.Metrics = metrics.Or(c.Metrics)
	c.Concurrency = cmp.Or(c.Concurrency, 8)
	c.Lease = cmp.Or(c.Lease, 2*time.Minute)
	c.CallTimeout = cmp.Or(c.CallTimeout, DefaultCallTimeout)
	c.CallsPerRound = cmp.Or(c.CallsPerRound, 3)
	c.Rounds = cmp.Or(c.Rounds, 4)
	if c.RetryDelays == nil {
		c.RetryDelays = []time.Duration{10 * time.Second, 60 * time.Second, 300 * time.Second}
	}
	c.BackoffBase = cmp.Or(c.BackoffBase, 500*time.Millisecond)
	c.BackoffMax = cmp.Or(c.BackoffMax, 20*time.Second)
	c.ErrorDelay = cmp.Or(c.ErrorDelay, DefaultErrorDelay)
	c.FlushRows = min(cmp.Or(c.FlushRows, 10), store.MaxSaveRows)
	c.FlushInterval = cmp.Or(c.FlushInterval, 200*time.Millisecond)
	c.Economy = c.Economy.withDefaults(c.Concurrency)
	return c
}

func (c GeneratorConfig) validate() error {
	var errs []error
	positive := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be positive", name, d))
		}
	}
	if c.Concurrency < 1 || c.CallsPerRound < 1 || c.Rounds < 1 || c.FlushRows < 1 {
		errs = append(errs, fmt.Errorf("config: Concurrency %d, CallsPerRound %d, Rounds %d, FlushRows %d: each must be at least 1", c.Concurrency, c.CallsPerRound, c.Rounds, c.FlushRows))
	}
	if _, err := ParseCacheMode(string(c.CacheMode)); err != nil {
		errs = append(errs, err)
	}
	if _, err := ParseCacheScope(string(c.CacheScope)); err != nil {
		errs = append(errs, err)
	}
	positive("Lease", c.Lease)
	positive("CallTimeout", c.CallTimeout)
	positive("BackoffBase", c.BackoffBase)
	positive("BackoffMax", c.BackoffMax)
	positive("ErrorDelay", c.ErrorDelay)
	if c.FlushInterval != FlushAtOnce {
		positive("FlushInterval", c.FlushInterval)
	}
	for i, d := range c.RetryDelays {
		if d < 0 {
			errs = append(errs, fmt.Errorf("RetryDelays[%d] %v: must not be negative", i, d))
		}
	}
	return errors.Join(errs...)
}

// Generator processes batch messages: claim, generate, persist, finish.
// One Generator is shared by all workers of a process; its concurrency limit
// and its router's memory of providers that refused for good are
// process-wide.
type Generator struct {
	store   store.Store
	router  *Router
	exports ExportStarter
	cfg     GeneratorConfig
	// slots are the rows in flight, granted to the principals in turn.
	slots *rowSlots
	// budgets hold capped tasks to their caps.
	budgets *budgets
	// answers share one call among the rows that ask the same question.
	answers answers
	// lanes send the calls of economy tasks to provider batches.
	lanes lanes
}

// NewGenerator returns a Generator that claims batches in st, calls
// provider and starts exports through exports. It applies cfg's defaults
// and panics if a port is nil or cfg is invalid: a mistake in the wiring,
// caught at start-up.
//
// Every call goes through a Router. A *Router given as provider brings its
// routes, each paced, bounded and timed out on its own, and cfg.Limiter
// must then be nil; any other provider becomes the one route of a Router
// paced by cfg.Limiter with cfg.CallTimeout, so there is one code path.
func NewGenerator(st store.Store, provider llm.Provider, exports ExportStarter, cfg GeneratorConfig) *Generator {
	cfg = cfg.withDefaults()
	err := errors.Join(required("Store", st), required("Provider", provider), required("ExportStarter", exports), cfg.validate())
	router, ok := provider.(*Router)
	switch {
	case ok && cfg.Limiter != nil:
		err = errors.Join(err, errors.New("a Router paces each route itself; leave Limiter nil"))
	case !ok && err == nil:
		// A lone route: the provider's own answer says who answered (or
		// the task does).
		bp, _ := provider.(llm.BatchProvider)
		router = NewRouter(RouterConfig{
			Routes: []Route{{Name: singleRoute, Provider: provider, Batch: bp, Limiter: cfg.Limiter, Timeout: cfg.CallTimeout}},
			Logger: cfg.Logger,
		})
	}
	if err != nil {
		panic("pipeline.NewGenerator: " + err.Error())
	}
	return &Generator{store: st, router: router, exports: exports, cfg: cfg, slots: newRowSlots(cfg.Concurrency),
		budgets: &budgets{store: st, prices: cfg.Prices, shared: cfg.Allowances}}
}

// singleRoute names the one route of a Generator given a plain provider;
// rows answered by it record the provider's answer or the task's provider
// instead.
const singleRoute = "provider"

// Delivery is one queue message handed to the generator.
type Delivery struct {
	Body         []byte
	ReceiveCount int
	// KeepAlive, when non-nil, is called whenever the batch's lease is
	// renewed so the caller can extend the message's visibility too.
	KeepAlive func(ctx context.Context) error
	// StopStartingAt, when non-zero, is when the generator starts no new
	// row (by the generator's Clock): calls already in flight finish and
	// their results are saved, and the batch is handed back with its other
	// rows pending (Outcome.HandedBack). A runtime with a hard deadline (a
	// Lambda invocation) sets it from StopStartingAt, so that a call is never
	// started that the deadline would cut off after it was paid for. Zero
	// means no such limit: the other runtimes stop only when their context
	// ends.
	StopStartingAt time.Time
	// Stop, when non-nil, is closed to stop starting rows, as at
	// StopStartingAt: calls in flight finish and are saved, and the batch is
	// handed back. The embedded server closes it when it is told to shut
	// down, so that no call already paid for is cut off.
	Stop <-chan struct{}
	// RowLimit, when positive, starts at most that many of the batch's rows
	// that have no result yet (and no cached answer): a quote's sample
	// (Generator.Sample). The batch is handed back with its other rows
	// pending, and Outcome.Started says how many started.
	RowLimit int
	// RowLimitTried makes RowLimit count the batch's rows a model was
	// asked for already (an earlier delivery of the same sample message,
	// which the queue may deliver twice, or a second splitter's copy): a
	// held task's sample tries each batch's share once.
	RowLimitTried bool
	// Online calls the rows online whatever the task's mode: a quote's
	// sample, answered in seconds rather than in a provider batch's hours.
	Online bool
}

// InvocationEnd is how a runtime that is killed at a deadline spends the
// end of its time: the work ends (its context is cancelled) Work from now,
// settle before the deadline, which leaves time to release batches and
// settle messages; and no call starts after StopStarting
// (Delivery.StopStartingAt, on the generator's clock), the longest call
// before the work ends, so that a call started is answered and saved in
// time.
type InvocationEnd struct {
	Work         time.Duration
	StopStarting time.Time
}

// InvocationEnd plans the end of an invocation that is killed when
// remaining has passed and needs settle after its work, on the
// generator's clock. A reserve that does not fit twice in what is left
// keeps half of it instead, so that a short invocation still does some
// work. It is the one rule for both margins: the Lambda handler used to
// compute the settle margin and feed it to a second copy of the rule.
func (g *Generator) InvocationEnd(remaining, settle time.Duration) InvocationEnd {
	work := remaining - reserve(remaining, settle)
	start := work - reserve(work, g.router.MaxTimeout())
	return InvocationEnd{Work: work, StopStarting: g.cfg.Clock.Now().Add(start)}
}

// reserve is want, or half of left when want does not fit twice in it.
func reserve(left, want time.Duration) time.Duration {
	if left < 2*want {
		return left / 2
	}
	return want
}

// Outcome is what processing a message came to; Settle turns it into what
// to do with the message.
type Outcome struct {
	// Ack means delete the message: the batch is done, or someone else owns
	// it.
	Ack bool
	// RetryAfter, when Ack is false and Err is nil, is the delay after which
	// the message should be delivered again (the graded backoff).
	RetryAfter time.Duration
	// HandedBack means the batch was released because Delivery.StopStartingAt
	// came with rows still pending; Progress is how many of its rows reached
	// a final state in this delivery. A hand-back with progress is healthy
	// work that ran out of time, not a failing message (see Settle).
	HandedBack bool
	Progress   int
	// Started counts the rows this delivery started, with
	// Delivery.RowLimit.
	Started int
	// QuotaStarved, with HandedBack and no Progress, means the batch made no
	// model call in this delivery because its rows were still waiting for
	// the quota limiter when the time came: the quota was busy with other
	// work, and the batch itself did nothing that failed (see Settle).
	QuotaStarved bool
	// Parked means the batch's pending rows wait on provider batches still
	// running (EconomyConfig.Park), and nothing else held it back: it is
	// to be delivered again after RetryAfter (a poll's wait), as a fresh
	// message, for waiting is not failing.
	Parked bool
	// Err is a failure to handle the message at all. A *PoisonError will
	// never succeed; other errors are transient. Either way the message is
	// left for the queue to redeliver and, eventually, dead-letter.
	Err error
}

// Process handles one batch message.
func (g *Generator) Process(ctx context.Context, d Delivery) Outcome {
	msg, err := DecodeBatchMessage(d.Body)
	if err != nil {
		return Outcome{Err: &PoisonError{Err: err}}
	}
	task, err := g.store.GetTask(ctx, msg.TaskID)
	if errors.Is(err, store.ErrNotFound) {
		return Outcome{Err: &PoisonError{Err: fmt.Errorf("task %s does not exist", msg.TaskID)}}
	}
	if err != nil {
		return Outcome{Err: fmt.Errorf("batch %s/%d: load task: %w", msg.TaskID, msg.BatchNo, err)}
	}
	// A held task's sample (BatchMessage.Sample) runs its rows online; once
	// the task is started its sample messages are batch messages as any.
	held := task.Held()
	sample := msg.Sample > 0 && held
	if !sample && (held || !task.State.Generating()) {
		return Outcome{Ack: true} // held, exporting, finished or cancelled: no row starts
	}
	if msg.BatchNo > task.BatchesTotal {
		return Outcome{Err: &PoisonError{Err: fmt.Errorf("task %s has %d batches, not %d", task.ID, task.BatchesTotal, msg.BatchNo)}}
	}
	if err := ctx.Err(); err != nil {
		return Outcome{Err: fmt.Errorf("batch %s/%d: no time left to claim it: %w", task.ID, msg.BatchNo, err)}
	}
	now := g.cfg.Clock.Now()
	// A claim is seen through even if the work's time ends meanwhile (a
	// slow store near an invocation's deadline): one applied whose answer
	// came too late would leave the batch leased to an attempt that never
	// ran, every delivery until the lease ran out dropping its message as
	// another owner's. Answered, it is handed back like any other.
	cctx, cancelClaim := context.WithTimeout(context.WithoutCancel(ctx), detachedWriteTimeout)
	b, err := g.store.ClaimBatch(cctx, store.ClaimBatchParams{
		TaskID: task.ID, BatchNo: msg.BatchNo, Owner: g.cfg.Owner, Now: now, LeaseUntil: now.Add(g.cfg.Lease),
	})
	cancelClaim()
	switch {
	case isConflict(err):
		g.cfg.Metrics.Add(metrics.ClaimsLost, 1)
		g.cfg.Logger.DebugContext(ctx, "batch not claimable; message dropped", logging.TaskID, task.ID, logging.BatchNo, msg.BatchNo, "error", err)
		// Someone else owns the batch or it is done. If it is done, make
		// sure its task's export was started: the worker that finished the
		// last batch may have died between finishing and starting it.
		if err := g.ensureExport(ctx, task.ID, msg.BatchNo); err != nil {
			return Outcome{Err: err}
		}
		return Outcome{Ack: true}
	case errors.Is(err, store.ErrNotFound):
		return Outcome{Err: &PoisonError{Err: fmt.Errorf("batch %s/%d does not exist", task.ID, msg.BatchNo)}}
	case err != nil:
		return Outcome{Err: fmt.Errorf("claim batch %s/%d: %w", task.ID, msg.BatchNo, err)}
	}
	g.cfg.Logger.DebugContext(ctx, "batch claimed", logging.TaskID, task.ID, logging.BatchNo, b.No, logging.Attempt, b.Attempt, "receive_count", d.ReceiveCount)
	if !sample {
		return g.runBatch(ctx, task, b, d)
	}
	d.RowLimit, d.RowLimitTried, d.Online = msg.Sample, true, true
	out := g.runBatch(ctx, task, b, d)
	if out.Err != nil || out.Ack {
		return out
	}
	// The sample's rows are answered (or tried: a row whose call failed
	// for now stays pending with its attempt counted, as the quote says).
	// The batch's other rows wait for the start, which sends the batch
	// again; a task started meanwhile keeps the outcome, so its batch comes
	// back as any released batch does.
	if t, err := g.store.GetTask(ctx, task.ID); err == nil && t.Held() {
		return Outcome{Ack: true, Started: out.Started, Progress: out.Progress}
	}
	return out
}

func (g *Generator) ensureExport(ctx context.Context, taskID string, batchNo int) error {
	b, err := g.store.GetBatch(ctx, taskID, batchNo)
	if err != nil {
		return fmt.Errorf("batch %s/%d: check state: %w", taskID, batchNo, err)
	}
	if b.State != store.BatchDone {
		return nil
	}
	task, err := g.store.GetTask(ctx, taskID)
	if err != nil {
		return fmt.Errorf("task %s: check state: %w", taskID, err)
	}
	_, err = StartExportOnce(ctx, g.store, g.exports, task, g.cfg.Clock.Now())
	return err
}

// rowOutcome is what generating one row came to.
type rowOutcome struct {
	result store.RowResult
	// save means result is to be written (with cache, if non-nil), and
	// event observed once it is.
	save  bool
	cache *store.CacheEntry
	event Event
	// aborted means the row was not finished because the batch context
	// ended (shutdown or lost lease) or no new call could start; it stays
	// as it was.
	aborted bool
	// starved means the row was aborted while it waited for the quota
	// limiter (or right after the wait, the stop time having come meanwhile),
	// without a model call in this delivery.
	starved bool
	// parked means the row's line waits in a provider batch still running
	// (EconomyConfig.Park); it stays as it was.
	parked bool
	// overBudget, when set, is why the row's next call was not made: the
	// task's spending cap.
	overBudget *BudgetError
}

func (g *Generator) runBatch(ctx context.Context, task store.Task, b store.Batch, d Delivery) Outcome {
	if d.Online {
		task.Mode = store.ModeOnline
	}
	keepAlive := d.KeepAlive
	// Every line on the batch's path names it; a Lambda's request id rides
	// in ctx too (logging.Handler).
	ctx = logging.With(ctx, logging.TaskID, task.ID, logging.BatchNo, b.No, logging.Attempt, b.Attempt)
	log := g.cfg.Logger
	batchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lost atomic.Bool
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		g.heartbeat(batchCtx, b, keepAlive, func() { lost.Store(true); cancel() }, log)
	}()
	// startCtx ends when no new row may start: the batch context ended, or
	// the task was cancelled (rows already calling the model finish). The
	// cancel is learnt from the result writes (SaveRowResults), not by
	// polling the task.
	startCtx, stopStarting := context.WithCancel(batchCtx)
	defer stopStarting()
	var cancelled, timeUp atomic.Bool
	// stopNow reports whether no new row may start because
	// d.StopStartingAt has come (checked before each row, so that a row
	// never starts after it however the goroutine below is scheduled).
	stopNow := func() bool {
		stopped := false
		if d.Stop != nil {
			select {
			case <-d.Stop:
				stopped = true
			default:
			}
		}
		if !stopped && (d.StopStartingAt.IsZero() || g.cfg.Clock.Now().Before(d.StopStartingAt)) {
			return false
		}
		timeUp.Store(true)
		stopStarting()
		return true
	}
	if d.Stop != nil {
		go func() {
			select {
			case <-startCtx.Done():
			case <-d.Stop:
				timeUp.Store(true)
				stopStarting()
			}
		}()
	}
	if !d.StopStartingAt.IsZero() {
		go func() {
			if wait := d.StopStartingAt.Sub(g.cfg.Clock.Now()); wait > 0 {
				select {
				case <-startCtx.Done():
					return
				case <-g.cfg.Clock.After(wait):
				}
			}
			timeUp.Store(true)
			stopStarting()
		}()
	}
	// mayStart reports whether a row may still start a model call: checked
	// again after the wait for the quota, which can outlast the stop time.
	mayStart := func() bool { return !stopNow() && startCtx.Err() == nil }
	// The task's spending cap, if it has one; the first call it refuses
	// stops the batch, and the task (below).
	spend, err := g.budgets.forTask(batchCtx, task)
	if err != nil {
		g.release(ctx, b, err.Error(), log)
		cancel()
		<-hbDone
		return Outcome{Err: fmt.Errorf("batch %s/%d: %w", task.ID, b.No, err)}
	}
	defer g.budgets.release(ctx, spend)
	var overBudget atomic.Pointer[BudgetError]
	f := &flusher{
		g: g, b: b, ctx: ctx, log: log, stop: make(chan struct{}),
		onFenced:    func() { lost.Store(true); cancel() },
		onCancelled: func() { cancelled.Store(true); stopStarting() },
	}
	finish := func(o Outcome) Outcome {
		close(f.stop)
		cancel()
		<-hbDone
		return o
	}

	tpl, err := prompt.Parse(task.Spec.Prompt)
	var bound *prompt.Bound
	if err == nil {
		bound, err = tpl.Bind(task.Header)
	}
	if err != nil {
		// Validated at split time; reaching this means the task record is
		// damaged. Leave the message to be dead-lettered.
		return finish(Outcome{Err: &PoisonError{Err: fmt.Errorf("task %s: prompt: %w", task.ID, err)}})
	}

	rows, err := g.store.ListRows(batchCtx, store.ListRowsParams{TaskID: task.ID, FromNo: b.FirstRow, ToNo: b.FirstRow + b.RowCount - 1})
	if err != nil {
		g.release(ctx, b, err.Error(), log)
		return finish(Outcome{Err: fmt.Errorf("batch %s/%d: load rows: %w", task.ID, b.No, err)})
	}

	reqs := make([]llm.Request, len(rows))
	keys := make([]string, len(rows))
	var open []string
	for i, r := range rows {
		if r.State.Final() {
			continue
		}
		reqs[i], keys[i] = g.rowRequest(task, bound, r)
		if !r.Fresh { // a row that asks for a new answer is not looked up
			open = append(open, keys[i])
		}
	}
	var cached map[string]string
	if g.cfg.Cache != nil && len(open) > 0 && g.cfg.CacheMode.Reuses(task.Spec) {
		// One batched read for the whole batch instead of one per row.
		if cached, err = g.cfg.Cache.GetCached(batchCtx, open); err != nil {
			if batchCtx.Err() != nil {
				// Out of time before any row started (a slow store under a
				// short invocation): hand the claim back, or the next
				// delivery finds the batch leased to this dead attempt and
				// drops the message, leaving the batch to the sweeper once
				// the lease expires.
				g.release(ctx, b, batchCtx.Err().Error(), log)
				return finish(Outcome{Err: fmt.Errorf("batch %s/%d: %w", task.ID, b.No, batchCtx.Err())})
			}
			log.WarnContext(ctx, "cache lookup failed; calling the model", "error", err)
		}
	}

	outcomes := make([]rowOutcome, len(rows))
	var wg sync.WaitGroup
	// launch generates the rows at idx (one, or a pack of several) in a
	// goroutine holding one concurrency slot.
	launch := func(idx []int) {
		abort := func() {
			for _, i := range idx {
				outcomes[i] = rowOutcome{result: rows[i].RowResult, aborted: true}
			}
		}
		// A row of an economy task waits hours for its provider batch
		// without a slot: it takes one only if it goes online (g.call).
		slotted := !task.Mode.Batched()
		if slotted && !g.slots.acquire(startCtx, task.Owner) {
			abort()
			return
		}
		if stopNow() || startCtx.Err() != nil {
			// Both were ready: a cancel learnt meanwhile wins.
			if slotted {
				g.slots.release()
			}
			abort()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if slotted {
				defer g.slots.release()
			}
			defer func() {
				// A panic in a provider or in this code is a bug; it must
				// not kill the worker process and every other batch with
				// it. The rows stay as they were; the batch is released,
				// and a message that keeps panicking ends in the
				// dead-letter queue.
				if p := recover(); p != nil {
					log.ErrorContext(ctx, "panic while generating a row", logging.Row, rows[idx[0]].No, "panic", p, "stack", string(debug.Stack()))
					abort()
				}
			}()
			var got []rowOutcome
			if len(idx) == 1 {
				got = []rowOutcome{g.answerRow(batchCtx, startCtx, mayStart, spend, task, rows[idx[0]], reqs[idx[0]], keys[idx[0]])}
			} else {
				got = g.generatePack(batchCtx, startCtx, mayStart, spend, task, pick(rows, idx), pick(reqs, idx), pick(keys, idx))
			}
			for k, i := range idx {
				if be := got[k].overBudget; be != nil && overBudget.CompareAndSwap(nil, be) {
					stopStarting() // no row starts past the cap
				}
				if got[k].save {
					// The rows keep their concurrency slot while they
					// write a group, so results never pile up faster than
					// they are saved.
					f.add(rows[i].No, got[k])
				}
				outcomes[i] = got[k]
			}
		}()
	}
	pack := newPacker(task.Spec.RowsPerCall, g.cfg.PackTokens)
	started, tried := 0, 0
	if d.RowLimitTried {
		for _, r := range rows {
			if r.Attempts > 0 {
				tried++
			}
		}
	}
	for i := range rows {
		if rows[i].State.Final() {
			outcomes[i] = rowOutcome{result: rows[i].RowResult}
			continue
		}
		if stopNow() || startCtx.Err() != nil {
			outcomes[i] = rowOutcome{result: rows[i].RowResult, aborted: true}
			continue
		}
		if out, ok := cached[keys[i]]; ok && !rows[i].Fresh {
			outcomes[i] = rowOutcome{
				result: store.RowResult{State: store.RowSucceeded, Output: out, Cached: true, Attempts: rows[i].Attempts},
				save:   true,
				event:  Event{TaskID: task.ID, RowNo: rows[i].No, State: store.RowSucceeded, Cached: true},
			}
			f.addCached(rows[i].No, outcomes[i])
			continue
		}
		if d.RowLimit > 0 && started+tried >= d.RowLimit {
			outcomes[i] = rowOutcome{result: rows[i].RowResult, aborted: true}
			continue
		}
		started++
		if pack.size == 1 {
			launch([]int{i})
			continue
		}
		if full := pack.add(i, llm.EstimateTokens(reqs[i].Prompt)); full != nil {
			launch(full)
		}
	}
	if rest := pack.take(); len(rest) > 0 {
		launch(rest)
	}
	wg.Wait()
	f.flush()

	if lost.Load() {
		g.cfg.Metrics.Add(metrics.LeasesExpired, 1)
		log.WarnContext(ctx, "batch taken over by a newer claim; leaving it to the new owner")
		return finish(Outcome{Ack: true})
	}
	for i := range outcomes {
		if err := f.failure(rows[i].No); err != nil {
			o := outcomes[i]
			outcomes[i] = rowOutcome{
				result:  store.RowResult{State: store.RowPending, Attempts: o.result.Attempts, Error: "could not save result: " + err.Error()},
				aborted: true,
			}
		}
	}
	if be := overBudget.Load(); be != nil {
		// The cap is reached: the task stops as a cancel stops it, saying
		// why; its partial result marks the rows not started, and a retry
		// with a higher cap runs them.
		g.stopOverBudget(ctx, task, be, log)
		cancelled.Store(true)
	}
	if cancelled.Load() {
		// Rows that had started are saved; the rest stay PENDING and are
		// exported as not started.
		g.release(ctx, b, "task cancelled", log)
		log.InfoContext(ctx, "task cancelled; batch stopped")
		return finish(Outcome{Ack: true})
	}
	var tally batchTally
	var maxAttempts, progress int
	var lastErr string
	aborted, starved, called := false, false, false
	parked, onlyParked := 0, true
	for i, o := range outcomes {
		starved = starved || o.starved
		if o.parked {
			parked++
		} else if o.aborted {
			onlyParked = false
		}
		called = called || o.result.Attempts > rows[i].Attempts
		tally.add(o.result)
		if !o.result.State.Final() {
			maxAttempts = max(maxAttempts, o.result.Attempts)
			if o.result.Error != "" {
				lastErr = o.result.Error
			}
		}
		aborted = aborted || o.aborted
		if o.save && o.result.State.Final() {
			progress++
		}
	}
	if pending := tally.pending; pending > 0 {
		delay := time.Duration(0)
		if !aborted {
			round := (maxAttempts + g.cfg.CallsPerRound - 1) / g.cfg.CallsPerRound
			delay = retryDelay(g.cfg.RetryDelays, round)
		}
		if parked > 0 && onlyParked {
			// Rows waiting on provider batches that run for hours: the
			// batch comes back after a poll's wait, as a fresh message
			// (EconomyConfig.Park).
			g.release(ctx, b, ParkedReason, log)
			log.InfoContext(ctx, "batch handed back to wait for its provider batches", "rows_waiting", parked, "pending_rows", pending, "rows_finished", progress, "next_look", g.cfg.Economy.Poll)
			return finish(Outcome{Parked: true, RetryAfter: g.cfg.Economy.Poll, Progress: progress, Started: started})
		}
		g.release(ctx, b, lastErr, log)
		if timeUp.Load() && aborted {
			// Starved: nothing was called and nothing finished because the
			// rows were waiting for the quota, not because anything failed.
			starved = starved && progress == 0 && !called
			log.InfoContext(ctx, "time to stop starting rows; batch handed back", "pending_rows", pending, "rows_finished", progress, "quota_starved", starved)
			return finish(Outcome{HandedBack: true, Progress: progress, QuotaStarved: starved})
		}
		log.InfoContext(ctx, "batch released for a later attempt", "pending_rows", pending, "delay", delay, "last_error", lastErr)
		return finish(Outcome{RetryAfter: delay, Started: started})
	}
	t, err := finishBatch(ctx, g.store, g.exports, b, tally, g.cfg.Clock.Now(), func(write func() error) error {
		return g.retryStore(ctx, write)
	})
	if isConflict(err) {
		log.WarnContext(ctx, "batch finished by someone else")
		return finish(Outcome{Ack: true})
	}
	if err != nil && t.ID == "" {
		return finish(Outcome{Err: err})
	}
	log.InfoContext(ctx, "batch done", "succeeded", tally.Succeeded, "failed", tally.Failed, "skipped", tally.Skipped, "batches_done", t.BatchesDone, "batches_total", t.BatchesTotal)
	if err != nil {
		// The batch is done but its export did not start; a redelivery of
		// this message finds it DONE and starts it (see ensureExport).
		return finish(Outcome{Err: err, Started: started})
	}
	return finish(Outcome{Ack: true, Started: started})
}

// rowRequest is the model call row asks for under task's template, and its
// cache key.
func (g *Generator) rowRequest(task store.Task, bound *prompt.Bound, r store.Row) (llm.Request, string) {
	spec := task.Spec
	req := llm.Request{
		Model: spec.Model, System: spec.System, Prompt: bound.Render(r.Values),
		Temperature: spec.Temperature, TopP: spec.TopP, MaxTokens: spec.MaxTokens,
		Columns: spec.Columns,
	}
	return req, cacheKey(g.cacheOwner(task), spec.Provider, req, spec.RowsPerCall)
}

// stopOverBudget cancels task, whose spending cap refused a call, with
// the reason; a task another batch stopped already is left as it is.
func (g *Generator) stopOverBudget(ctx context.Context, task store.Task, be *BudgetError, log *slog.Logger) {
	_, err := Cancel(ctx, g.store, CancelParams{TaskID: task.ID, Reason: be.Reason(), Now: g.cfg.Clock.Now(), Exports: g.exports})
	var state *StateError
	switch {
	case err == nil:
		log.WarnContext(ctx, "task stopped at its spending cap", "max_cost", task.MaxCost, "reason", be.Error())
	case errors.As(err, &state):
		// Stopped already (another batch met the cap first), or finished.
	default:
		log.ErrorContext(ctx, "could not stop the task at its spending cap; its rows stay not started", "error", err)
	}
}

// heartbeat renews the lease every Lease/3 until ctx ends. If the lease is
// lost to a newer claim it calls onLost.
func (g *Generator) heartbeat(ctx context.Context, b store.Batch, keepAlive func(context.Context) error, onLost func(), log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.cfg.Clock.After(g.cfg.Lease / 3):
		}
		now := g.cfg.Clock.Now()
		err := g.store.RenewLease(ctx, store.RenewLeaseParams{
			TaskID: b.TaskID, BatchNo: b.No, Attempt: b.Attempt, LeaseUntil: now.Add(g.cfg.Lease), Now: now,
		})
		if isConflict(err) {
			log.WarnContext(ctx, "lease lost to a newer claim")
			onLost()
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				log.WarnContext(ctx, "renew lease failed; will try again", "error", err)
			}
			continue
		}
		if keepAlive != nil {
			if err := keepAlive(ctx); err != nil && ctx.Err() == nil {
				log.WarnContext(ctx, "extend message visibility failed", "error", err)
			}
		}
	}
}

// detachedWriteTimeout bounds a store write that must be seen through past
// the work's own deadline (a claim, a release): short enough to end inside
// the Lambda's headroom (generatorfn.DefaultHeadroom, 15 s).
const detachedWriteTimeout = 10 * time.Second

// release hands b back for a later delivery with lastErr as its reason.
func (g *Generator) release(ctx context.Context, b store.Batch, lastErr string, log *slog.Logger) {
	// Use a context that survives shutdown so the release itself is not
	// cancelled; if it still fails, the lease expires and the batch is
	// claimable anyway.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachedWriteTimeout)
	defer cancel()
	err := g.store.ReleaseBatch(rctx, store.ReleaseBatchParams{
		TaskID: b.TaskID, BatchNo: b.No, Attempt: b.Attempt, LastError: truncate(lastErr, 1000), Now: g.cfg.Clock.Now(),
	})
	if err != nil && !isConflict(err) {
		log.WarnContext(ctx, "release batch failed; its lease will expire instead", "error", err)
	}
}

// ProviderLabel is the provider column of a row answered by the task's own
// provider: "provider/model", or the provider alone when the task names no
// model.
func ProviderLabel(spec store.TaskSpec) string {
	if spec.Model == "" {
		return spec.Provider
	}
	return spec.Provider + "/" + spec.Model
}

// CacheKey hashes everything that changes a model's output: the provider
// family, the model, the system prompt, the rendered prompt, temperature,
// top_p, the completion cap and the declared columns (an answer of one
// shape never answers a question asked in another) and how many rows a
// call packs (rowsPerCall: an answer among ten is not one asked alone). An
// unset setting (the provider's default) hashes apart from every explicit
// value, and a request without columns asked alone hashes as it did before
// either existed, so caches filled then still answer.
func CacheKey(provider string, req llm.Request, rowsPerCall int) string {
	return cacheKey("", provider, req, rowsPerCall)
}

// cacheOwner is whose answers task's rows may reuse: its principal's, or
// with CacheShared everyone's (""; a task without an owner, stored before
// tasks had owners, shares too).
func (g *Generator) cacheOwner(task store.Task) string {
	if g.cfg.CacheScope == CacheShared {
		return ""
	}
	return task.Owner
}

// cacheKey is the key of req for owner ("" for the shared key, the same as
// before keys had owners, so older entries still answer).
func cacheKey(owner, provider string, req llm.Request, rowsPerCall int) string {
	var columns json.RawMessage
	if len(req.Columns) > 0 {
		columns = req.Columns.JSONSchema()
	}
	if rowsPerCall < 2 {
		rowsPerCall = 0
	}
	b, _ := json.Marshal(struct {
		Provider    string          `json:"p"`
		Model       string          `json:"m"`
		System      string          `json:"s"`
		Prompt      string          `json:"u"`
		Temperature *float64        `json:"t,omitempty"`
		TopP        *float64        `json:"tp,omitempty"`
		MaxTokens   int             `json:"mt,omitempty"`
		Columns     json.RawMessage `json:"c,omitempty"`
		RowsPerCall int             `json:"n,omitempty"`
		Owner       string          `json:"o,omitempty"`
	}{provider, req.Model, req.System, req.Prompt, req.Temperature, req.TopP, req.MaxTokens, columns, rowsPerCall, owner})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// generateRow produces one row's result (to be saved by the caller). Model
// calls run under ctx; waits before a call (quota, backoff) end with
// startCtx, which ends when no new call may start (shutdown, lost lease,
// task cancelled, the stop time); mayStart is asked again after each wait,
// so no call starts after the stop time however long the wait took.
func (g *Generator) generateRow(ctx, startCtx context.Context, mayStart func() bool, spend *budget, task store.Task, row store.Row, req llm.Request, key string) rowOutcome {
	done := func(res store.RowResult, calls int, class string) rowOutcome {
		return rowOutcome{result: res, save: true, event: Event{
			TaskID: task.ID, RowNo: row.No, State: res.State, Cached: res.Cached, Calls: calls, ErrorClass: class,
		}}
	}
	prior := row.RowResult
	attempts := prior.Attempts
	maxAttempts := g.cfg.CallsPerRound * g.cfg.Rounds
	var last *llm.Error
	// invalid is the last answer, if it did not fit the declared columns;
	// billed sums what the answered calls of this round cost (a re-ask is
	// billed too); asks counts those calls.
	var invalid *invalidAnswer
	var billed store.Usage
	asks := 0
	for i := 0; i < g.cfg.CallsPerRound && attempts < maxAttempts; i++ {
		if f := g.router.Refused(); f != nil {
			return done(store.RowResult{
				State: store.RowFailed, ErrorClass: string(f.Class), Attempts: attempts,
				Error: "not sent: the provider refused an earlier call in this run: " + f.Error(),
			}, 0, string(f.Class))
		}
		if !mayStart() {
			return rowOutcome{result: g.pendingResult(prior, attempts, last), aborted: true}
		}
		resp, err := g.call(ctx, startCtx, mayStart, task, req, spend)
		if errors.Is(err, errNotStarted) {
			// Stopped before any call: while waiting for the quota (a
			// token taken just as the time came is left unused: a call
			// started now could not be saved in time), or for a slot, or
			// by the task's spending cap. A limiter that failed on its own
			// (its store) is not starvation.
			var over *BudgetError
			errors.As(err, &over)
			return rowOutcome{
				result:     g.pendingResult(prior, attempts, last),
				aborted:    true,
				starved:    attempts == prior.Attempts && errors.Is(err, errStarved),
				parked:     errors.Is(err, errParked),
				overBudget: over,
			}
		}
		for _, c := range resp.Log {
			g.recordCall(cmp.Or(c.Response.Provider, c.Route, ProviderLabel(task.Spec)), c.Latency, c.Response, c.Err, c.Aborted)
		}
		latency := resp.Latency
		if err == nil {
			attempts++
			asks++
			billed = billed.Add(billedUsage(resp.Usage))
			text := resp.Text
			if len(req.Columns) > 0 {
				norm, err := req.Columns.Validate(resp.Text)
				if err != nil {
					// The answer came but does not fit: ask again at once, in
					// the same conversation, with what was wrong. No backoff
					// and no later round: the same question to the same model
					// later would not do better than a correction now.
					invalid = &invalidAnswer{raw: resp.Text, err: err.(*schema.InvalidAnswerError), provider: resp.Provider}
					g.observe(Event{TaskID: task.ID, RowNo: row.No, State: store.RowPending, Calls: 1, ErrorClass: string(llm.ClassInvalidOutput)})
					g.cfg.Logger.DebugContext(ctx, "the answer does not fit the columns; asking again", logging.Row, row.No, "call", attempts, "problems", err.Error())
					req.Corrections = append(req.Corrections, llm.Correction{Answer: resp.Text, FollowUp: req.Columns.FollowUp(invalid.err)})
					continue
				}
				text = norm
			}
			o := done(store.RowResult{
				State: store.RowSucceeded, Output: text, Attempts: attempts, LatencyMS: latency.Milliseconds(),
				Provider: cmp.Or(resp.Provider, ProviderLabel(task.Spec)),
				Usage:    billed,
			}, 1, "")
			if g.cfg.Cache != nil {
				o.cache = &store.CacheEntry{Key: key, Output: text}
			}
			return o
		}
		invalid = nil
		if ctx.Err() != nil {
			// Shutdown or lost lease, not the call's own timeout: the call
			// did not count and the row stays as it was.
			return rowOutcome{result: prior, aborted: true}
		}
		attempts++
		e := llm.Classify(err)
		last = e
		if !e.Class.Retryable() {
			return done(store.RowResult{
				State: store.RowFailed, Error: e.Error(), ErrorClass: string(e.Class), Attempts: attempts, LatencyMS: latency.Milliseconds(),
			}, 1, string(e.Class))
		}
		g.observe(Event{TaskID: task.ID, RowNo: row.No, State: store.RowPending, Calls: 1, ErrorClass: string(e.Class)})
		// Per row, so DEBUG only: INFO has one line per batch outcome.
		provider := ProviderLabel(task.Spec)
		if n := len(resp.Log); n > 0 && resp.Log[n-1].Route != "" {
			provider = resp.Log[n-1].Route
		}
		g.cfg.Logger.DebugContext(ctx, "model call failed; the row will be tried again", logging.Row, row.No, "call", attempts,
			logging.Provider, provider, "error_class", e.Class)
		if i == g.cfg.CallsPerRound-1 || attempts >= maxAttempts {
			break
		}
		wait := g.backoff(i, e)
		select {
		case <-startCtx.Done():
			return rowOutcome{result: g.pendingResult(prior, attempts, last), aborted: true}
		case <-g.cfg.Clock.After(wait):
		}
	}
	if invalid != nil {
		// Every ask of this round answered, and the last answer still did
		// not fit: the row fails now, its last answer kept (it was paid
		// for) for a person to read or for retry --error-class
		// invalid_output.
		return done(store.RowResult{
			State: store.RowFailed, ErrorClass: string(llm.ClassInvalidOutput), Attempts: attempts,
			Error:    fmt.Sprintf("the answer did not fit the columns after %d asks: %s; the last answer: %s", asks, invalid.err, invalid.raw),
			Provider: cmp.Or(invalid.provider, ProviderLabel(task.Spec)),
			Usage:    billed,
		}, 0, string(llm.ClassInvalidOutput))
	}
	return g.unfinished(task, row, attempts, last)
}

// unfinished is a row whose round's calls are spent without an answer:
// PENDING for a later round with its last error, or FAILED as
// retry_exhausted once it has had every call it may.
func (g *Generator) unfinished(task store.Task, row store.Row, attempts int, last *llm.Error) rowOutcome {
	res := store.RowResult{State: store.RowPending, Attempts: attempts}
	if last != nil {
		res.Error, res.ErrorClass = last.Error(), string(last.Class)
	}
	if maxAttempts := g.cfg.CallsPerRound * g.cfg.Rounds; attempts >= maxAttempts {
		res.State = store.RowFailed
		res.ErrorClass = string(llm.ClassRetryExhausted)
		res.Error = fmt.Sprintf("gave up after %d attempts; last error: %s", attempts, res.Error)
	}
	class := ""
	if res.State == store.RowFailed {
		class = res.ErrorClass
	}
	return rowOutcome{result: res, save: true, event: Event{TaskID: task.ID, RowNo: row.No, State: res.State, ErrorClass: class}}
}

// pick returns the elements of s at idx, in order.
func pick[T any](s []T, idx []int) []T {
	out := make([]T, len(idx))
	for k, i := range idx {
		out[k] = s[i]
	}
	return out
}

// billedUsage is a call's usage as a row result records it.
func billedUsage(u llm.Usage) store.Usage {
	return store.Usage{
		InputTokens:       int64(u.InputTokens),
		OutputTokens:      int64(u.OutputTokens),
		CachedInputTokens: int64(u.CachedInputTokens),
	}
}

// invalidAnswer is an answer that did not fit the task's columns.
type invalidAnswer struct {
	raw      string
	err      *schema.InvalidAnswerError
	provider string
}

// pendingResult is a row left PENDING after attempts calls, the last of
// which failed with last (nil if none failed in this round).
func (g *Generator) pendingResult(prior store.RowResult, attempts int, last *llm.Error) store.RowResult {
	res := store.RowResult{State: store.RowPending, Attempts: attempts, Error: prior.Error, ErrorClass: prior.ErrorClass}
	if last != nil {
		res.Error, res.ErrorClass = last.Error(), string(last.Class)
	}
	return res
}

// backoff is exponential with equal jitter, at least the provider's
// Retry-After (the limiter also holds every worker back for that long).
func (g *Generator) backoff(i int, e *llm.Error) time.Duration {
	d := g.cfg.BackoffBase << i
	if d > g.cfg.BackoffMax || d <= 0 {
		d = g.cfg.BackoffMax
	}
	d = d/2 + rand.N(d/2+1)
	if e.RetryAfter > d {
		d = min(e.RetryAfter, g.cfg.BackoffMax)
	}
	return d
}

// flusher collects a batch's row results and writes them in groups, each
// one SaveRowResults under the batch's fence with the cache entries that
// came with its rows (river's BatchCompleter is the model). A group is
// written by the row that fills it to FlushRows (which keeps its
// concurrency slot meanwhile, so results never pile up faster than they
// are saved), FlushInterval after its first result, or at the batch's end;
// with FlushAtOnce by whichever row finds no write under way, together with
// every result that arrives while it writes (see enqueue).
// A fenced write means the batch has a newer owner (onFenced); a write
// that reports the task cancelled stops new rows (onCancelled).
type flusher struct {
	g   *Generator
	b   store.Batch
	ctx context.Context
	log *slog.Logger
	// stop ends pending timers when the batch is over.
	stop                  chan struct{}
	onFenced, onCancelled func()

	mu      sync.Mutex
	pending []pendingRow
	gen     int // counts groups taken, so a timer only flushes its own group
	failed  map[int]error
	// writing is true while a row drains the pending results (FlushAtOnce).
	writing bool
	// written is the last group taken (gen) whose write has returned, and
	// wrote signals it (on mu): with FlushAtOnce a row that leaves its paid
	// result to a write under way waits for the write of its group,
	// keeping its concurrency slot, so that at any moment at most as many
	// results are paid and unsaved as there are slots (a kill bills no
	// more rows twice than calls were in flight).
	written int
	wrote   *sync.Cond

	writeMu   sync.Mutex // one group write at a time, in order
	fenced    atomic.Bool
	cancelled atomic.Bool
}

// pendingRow is a row result waiting to be written.
type pendingRow struct {
	write store.RowResultWrite
	cache *store.CacheEntry
	event Event
}

// add queues a row's result; it writes the group when it is full, or with
// FlushAtOnce as soon as no write is under way.
func (f *flusher) add(rowNo int, o rowOutcome) { f.enqueue(rowNo, o, true) }

// addCached queues the result of a row the cache answered, which the batch
// adds itself before starting the next row: with FlushAtOnce it is written
// with a full group or at the batch's end, so a batch of cache hits is a
// few writes instead of one per row (nothing is lost at a kill that the
// cache does not answer again).
func (f *flusher) addCached(rowNo int, o rowOutcome) { f.enqueue(rowNo, o, false) }

func (f *flusher) enqueue(rowNo int, o rowOutcome, atOnce bool) {
	f.mu.Lock()
	f.pending = append(f.pending, pendingRow{write: store.RowResultWrite{RowNo: rowNo, Result: o.result}, cache: o.cache, event: o.event})
	n, gen := len(f.pending), f.gen
	if f.g.cfg.FlushInterval < 0 {
		// Group commit: the row that finds no write under way writes until
		// nothing is pending, and rows that finish meanwhile leave their
		// results to it. With one write per row instead, a fast model's
		// rows arrive one per write and each pays a transaction of its own.
		if f.writing && atOnce {
			// The writer takes this result with its next group (gen+1).
			if f.wrote == nil {
				f.wrote = sync.NewCond(&f.mu)
			}
			for mine := gen + 1; f.written < mine; {
				f.wrote.Wait()
			}
			f.mu.Unlock()
			return
		}
		if f.writing || (!atOnce && n < f.g.cfg.FlushRows) {
			f.mu.Unlock()
			return
		}
		f.writing = true
		f.mu.Unlock()
		f.drain()
		return
	}
	f.mu.Unlock()
	if n >= f.g.cfg.FlushRows {
		f.flushIfFull()
		return
	}
	if n == 1 {
		go func() {
			select {
			case <-f.g.cfg.Clock.After(f.g.cfg.FlushInterval):
			case <-f.stop:
				return
			}
			f.mu.Lock()
			mine := f.gen == gen
			f.mu.Unlock()
			if mine {
				f.flush()
			}
		}()
	}
}

// flushIfFull writes the pending results if they still fill a group once
// the write before it is done. Two rows that fill the group at once both
// get here; the first writes everything pending, and the second must not
// then write the one or two results that arrived meanwhile as a group of
// their own: they wait for company (or their timer) like any other.
func (f *flusher) flushIfFull() {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	f.mu.Lock()
	full := len(f.pending) >= f.g.cfg.FlushRows || (f.g.cfg.FlushInterval < 0 && len(f.pending) > 0)
	f.mu.Unlock()
	if full {
		f.flushLocked()
	}
}

// drain writes the pending results until there are none, then gives up
// the writer's role (FlushAtOnce).
func (f *flusher) drain() {
	for {
		f.writeMu.Lock()
		f.mu.Lock()
		if len(f.pending) == 0 {
			f.writing = false
			f.mu.Unlock()
			f.writeMu.Unlock()
			return
		}
		f.mu.Unlock()
		f.flushLocked()
		f.writeMu.Unlock()
	}
}

// flush writes every pending result, in groups within the store's bounds
// (see saveGroupLen).
func (f *flusher) flush() {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	f.flushLocked()
}

// flushLocked is flush with writeMu held.
func (f *flusher) flushLocked() {
	f.mu.Lock()
	group := f.pending
	f.pending = nil
	f.gen++
	taken := f.gen
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.written = taken
		if f.wrote != nil {
			f.wrote.Broadcast()
		}
		f.mu.Unlock()
	}()
	for len(group) > 0 {
		n := saveGroupLen(len(group), func(i int) int {
			size := group[i].write.SaveSize()
			if group[i].cache != nil {
				size += group[i].cache.SaveSize()
			}
			return size
		})
		f.write(group[:n])
		group = group[n:]
	}
}

// write saves one group, retrying transient store errors.
func (f *flusher) write(group []pendingRow) {
	if f.fenced.Load() {
		return // the batch has a newer owner; nothing of ours may be written
	}
	p := store.SaveRowResultsParams{TaskID: f.b.TaskID, BatchNo: f.b.No, Attempt: f.b.Attempt, Now: f.g.cfg.Clock.Now()}
	for _, r := range group {
		p.Rows = append(p.Rows, r.write)
		if r.cache != nil {
			p.Cache = append(p.Cache, *r.cache)
		}
	}
	// Persist even if the batch context was just cancelled (shutdown): the
	// calls were made and paid for, so their results must not be lost.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), 30*time.Second)
	defer cancel()
	var res store.SaveRowResultsResult
	err := f.g.retryStore(sctx, func() error {
		var err error
		res, err = f.g.store.SaveRowResults(sctx, p)
		return err
	})
	if isConflict(err) {
		f.fenced.Store(true)
		f.onFenced()
		return
	}
	if err != nil {
		f.log.ErrorContext(f.ctx, "save row results failed; the rows will be retried", "rows", len(group), "error", err)
		f.mu.Lock()
		if f.failed == nil {
			f.failed = map[int]error{}
		}
		for _, r := range group {
			f.failed[r.write.RowNo] = err
		}
		f.mu.Unlock()
		return
	}
	for _, r := range group {
		f.g.observe(r.event)
	}
	if res.TaskCancelled && !f.cancelled.Swap(true) {
		f.onCancelled()
	}
}

// failure returns why a row's result could not be written, or nil.
func (f *flusher) failure(rowNo int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed[rowNo]
}

// retryStore runs a store write under the store's one retry layer
// (store.Retry): a database that is briefly locked, unavailable or
// throttled must not lose a result the model was already paid for.
func (g *Generator) retryStore(ctx context.Context, write func() error) error {
	return store.Retry(ctx, g.cfg.Clock, g.cfg.Logger, write)
}

func (g *Generator) observe(e Event) {
	recordRow(g.cfg.Metrics, e)
	if g.cfg.Observer != nil {
		g.cfg.Observer(e)
	}
}

// truncate cuts s to at most n bytes without splitting a UTF-8 character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
