package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/prompt"
	"github.com/batchgen/batchgen/internal/store"
)

// Sample answers up to n rows of task taskID that have no result yet, for
// a quote, online whatever the task's mode, in this process (the CLI's
// quote; the API's quote sends SampleMessages instead). The rows are
// spread over the sheet (samplePlan). Each batch is worked as a worker
// would work it (claimed, fenced, each result saved), starting only the
// rows the sample takes from it, and handed back with its other rows
// pending. The task keeps the answers, so the run that follows does not
// pay for them again. It returns how many rows it started.
func (g *Generator) Sample(ctx context.Context, taskID string, n int) (int, error) {
	task, err := g.store.GetTask(ctx, taskID)
	if err != nil {
		return 0, fmt.Errorf("sample task %s: %w", taskID, err)
	}
	started := 0
	for _, s := range samplePlan(task, n) {
		out := g.Process(ctx, Delivery{Body: EncodeBatchMessage(taskID, s.batchNo), RowLimit: s.rows, Online: true})
		if out.Err != nil {
			return started, fmt.Errorf("sample task %s: batch %d: %w", taskID, s.batchNo, out.Err)
		}
		started += out.Started
		if err := ctx.Err(); err != nil {
			return started, err
		}
	}
	return started, nil
}

// QuoteParams are what a quote is computed from besides the task's rows.
type QuoteParams struct {
	// Prices price each answered row at the provider that answered it.
	Prices *pricing.Table
	// RequestsPerSecond is the pace the quota allows (configured, or learnt
	// during the sample); 0 when not known.
	RequestsPerSecond float64
	// Concurrency is how many calls run at once.
	Concurrency int
	// RowsToCall is how many of the rows left will need a model's answer
	// (Generator.RowsToCall: the others ask what the cache holds);
	// negative for every row left.
	RowsToCall int
}

// Spread is an expected value with the 90% interval around it.
type Spread struct{ Low, Mid, High float64 }

// Quote is what the rows of a task still without a result are expected to
// cost and take, measured on the rows already answered (a sample).
type Quote struct {
	// Rows is the task's rows; Left those without a result (not answered,
	// failed or skipped), and ToCall those of them that will need a
	// model's answer (the rest ask what the cache holds).
	Rows, Left, ToCall int
	// Measured is how many answered rows the figures come from: rows a
	// model answered (cached answers cost nothing and say nothing).
	Measured int
	// Asked is the sample a held task asked for (store.Terms.Sample), and
	// Tried how many of its rows a model was asked for so far (answered,
	// failed, or failed for now). Sampling is set while a held task's
	// sample is still being answered: fewer rows tried than asked, and
	// rows left to try.
	Asked, Tried int
	Sampling     bool
	// Spent is what the measured rows cost.
	Spent float64
	// InputTokens and OutputTokens are per row.
	InputTokens, OutputTokens Spread
	// Cost is what the rows left are expected to cost online, and Economy
	// through the provider's batch API; CostKnown is false when a measured
	// row's provider has no price.
	Cost, Economy Spread
	CostKnown     bool
	// Duration is how long the rows left are expected to take online at
	// the quota (or, when it is not known, at Concurrency calls of the
	// measured latency at once; then QuotaKnown is false).
	Duration   [3]time.Duration
	QuotaKnown bool
}

// ErrNothingMeasured: no row of the task was answered by a model, so there
// is nothing to quote from.
var ErrNothingMeasured = errors.New("no row answered by a model to measure")

// QuoteTask quotes task from its answered rows. The intervals are those of
// the mean per row (±1.645 standard errors), scaled to the rows left: what
// the total of many rows is expected to land within, not the spread of one
// row.
func QuoteTask(ctx context.Context, st store.Store, task store.Task, p QuoteParams) (Quote, error) {
	q := Quote{Rows: task.RowsTotal, CostKnown: p.Prices != nil, QuotaKnown: p.RequestsPerSecond > 0, Asked: task.Sample}
	untried := 0
	var in, out, cost, economy, latency []float64
	const page = 1000
	for from := 1; from <= task.RowsTotal; from += page {
		rows, err := st.ListRows(ctx, store.ListRowsParams{TaskID: task.ID, FromNo: from, ToNo: from + page - 1})
		if err != nil {
			return Quote{}, fmt.Errorf("quote task %s: %w", task.ID, err)
		}
		for _, r := range rows {
			if r.State != store.RowSucceeded && r.State != store.RowSkipped {
				q.Left++
			}
			switch {
			case r.Attempts > 0:
				q.Tried++
			case !r.State.Final():
				untried++
			}
			if r.State != store.RowSucceeded || r.Cached || r.Usage == (store.Usage{}) {
				continue
			}
			in = append(in, float64(r.Usage.InputTokens))
			out = append(out, float64(r.Usage.OutputTokens))
			// Stored in whole milliseconds: a call answered faster is
			// counted as 1 ms, not as no measure (which left the time of a
			// quote on a fast model unknown).
			latency = append(latency, float64(max(r.LatencyMS, 1))/1000)
			if p.Prices != nil {
				e := p.Prices.Task(store.Task{Spec: task.Spec, UsageByProvider: map[string]store.Usage{r.Provider: r.Usage}})
				q.CostKnown = q.CostKnown && e.Known
				q.Spent += e.Cost
				// The same tokens online and through the batch API,
				// whichever way the sample's row was answered.
				label := strings.TrimSuffix(r.Provider, pricing.BatchSuffix)
				on := p.Prices.Task(store.Task{Spec: task.Spec, UsageByProvider: map[string]store.Usage{label: r.Usage}})
				eco := p.Prices.Task(store.Task{Spec: task.Spec, UsageByProvider: map[string]store.Usage{pricing.BatchLabel(label): r.Usage}})
				cost = append(cost, on.Cost)
				economy = append(economy, eco.Cost)
			}
		}
	}
	q.Measured = len(in)
	q.Sampling = task.Held() && q.Tried < q.Asked && untried > 0
	if q.Measured == 0 {
		return q, fmt.Errorf("quote task %s: %w", task.ID, ErrNothingMeasured)
	}
	q.ToCall = q.Left
	if p.RowsToCall >= 0 && p.RowsToCall < q.Left {
		q.ToCall = p.RowsToCall
	}
	left := float64(q.ToCall)
	q.InputTokens, q.OutputTokens = meanSpread(in, 1), meanSpread(out, 1)
	if q.CostKnown {
		q.Cost, q.Economy = meanSpread(cost, left), meanSpread(economy, left)
	}
	// Rows a second: the quota's pace, or what the calls in flight manage
	// at the measured latency, whichever binds.
	lat := meanSpread(latency, 1)
	pace := func(seconds float64) float64 {
		r := math.Inf(1)
		if seconds > 0 && p.Concurrency > 0 {
			r = float64(p.Concurrency) / seconds
		}
		if p.RequestsPerSecond > 0 {
			r = math.Min(r, p.RequestsPerSecond)
		}
		return r
	}
	for i, seconds := range []float64{lat.Low, lat.Mid, lat.High} {
		if r := pace(seconds); !math.IsInf(r, 1) && r > 0 {
			q.Duration[i] = time.Duration(left / r * float64(time.Second))
		}
	}
	return q, nil
}

// meanSpread is the mean of xs with its 90% interval, times scale.
func meanSpread(xs []float64, scale float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	half := 0.0
	if len(xs) > 1 {
		ss := 0.0
		for _, x := range xs {
			ss += (x - mean) * (x - mean)
		}
		half = 1.645 * math.Sqrt(ss/float64(len(xs)-1)/float64(len(xs)))
	}
	return Spread{Low: math.Max(mean-half, 0) * scale, Mid: mean * scale, High: (mean + half) * scale}
}

// RowsToCall counts the rows of task still without a result that will need
// a model's answer: one per distinct question, less the questions the cache
// answers already, when the task reuses the cache (rows asking what another
// row asks share its call: see shared.go); every row left when it does not,
// and every row that asks for a new answer.
func (g *Generator) RowsToCall(ctx context.Context, task store.Task) (int, error) {
	tpl, err := prompt.Parse(task.Spec.Prompt)
	var bound *prompt.Bound
	if err == nil {
		bound, err = tpl.Bind(task.Header)
	}
	if err != nil {
		return 0, fmt.Errorf("task %s: prompt: %w", task.ID, err)
	}
	reuse := g.cfg.Cache != nil && g.cfg.CacheMode.Reuses(task.Spec)
	calls := 0
	seen := map[string]bool{}
	const page = 1000
	for from := 1; from <= task.RowsTotal; from += page {
		rows, err := g.store.ListRows(ctx, store.ListRowsParams{TaskID: task.ID, FromNo: from, ToNo: from + page - 1})
		if err != nil {
			return 0, fmt.Errorf("task %s: %w", task.ID, err)
		}
		var keys []string
		for _, r := range rows {
			if r.State.Final() {
				continue
			}
			if !reuse || r.Fresh {
				calls++ // asks anew whatever the cache holds
				continue
			}
			if _, key := g.rowRequest(task, bound, r); !seen[key] {
				seen[key] = true
				keys = append(keys, key)
			}
		}
		if len(keys) == 0 {
			continue
		}
		cached, err := g.cfg.Cache.GetCached(ctx, keys)
		if err != nil {
			return 0, fmt.Errorf("task %s: read the cache: %w", task.ID, err)
		}
		calls += len(keys) - len(cached)
	}
	return calls, nil
}

// DefaultCutOverMargin is the time an auto task keeps beside what its
// waiting rows need online (EconomyConfig.CutOverMargin's default).
const DefaultCutOverMargin = 30 * time.Second

// onlineNeed is the time an auto task keeps before its deadline for rows
// that take online long at the pace it knows: a tenth more, for a pace
// that falls short, and margin (the provider batches' cancel, the
// export). The lane cuts over by it, and the quote places the cut-over by
// it.
func onlineNeed(online, margin time.Duration) time.Duration { return online*11/10 + margin }

// Plan is one way of running a task's rows left, as its quote prices it.
type Plan struct {
	// Mode is the plan's mode.
	Mode store.Mode
	// Offered is false when the plan cannot run here; Why then says why
	// (and, for an offered plan, anything its figures leave out).
	Offered bool
	Why     string
	// Cost is what the plan is expected to cost; known when
	// Quote.CostKnown. An auto plan costs between its economy part
	// (Cost.Low: the batch API answers everything in time) and online
	// (Cost.High: nothing comes back before the cut-over).
	Cost Spread
	// Duration is how long the plan is expected to take (low, expected,
	// high), when it is known: online at the quota; for economy none (the
	// provider's batch window); for auto at most its deadline.
	Duration [3]time.Duration
	// EconomyFor is how long an auto plan waits on the batch API before
	// the rows left go online; 0 when they go online at once
	// (AllOnline).
	EconomyFor time.Duration
	AllOnline  bool
	// NeedsDeadline: an auto plan not offered for want of a deadline.
	NeedsDeadline bool
}

// BatchWindow is what a provider batch takes, as the providers sell it.
const BatchWindow = "within the provider's batch window (often minutes to a few hours, at most 24h)"

// Plans prices the rows left of q three ways: online, economy (when batch:
// a provider here sells a batch API) and auto with a deadline this far
// away (0 for none given).
func (q Quote) Plans(batch bool, deadline time.Duration) []Plan {
	online := Plan{Mode: store.ModeOnline, Offered: true, Cost: q.Cost, Duration: q.Duration}
	if q.Duration[1] > 0 && !q.QuotaKnown {
		online.Why = "if the quota does not bind (it is not known)"
	}
	if q.Duration[1] == 0 {
		online.Why = "time unknown"
	}
	economy := Plan{Mode: store.ModeEconomy, Offered: batch, Cost: q.Economy, Why: BatchWindow}
	auto := Plan{Mode: store.ModeAuto, Offered: batch}
	if !batch {
		economy.Why = "no provider here sells a batch API (openai, anthropic and the simulator do)"
		auto.Why = economy.Why
		return []Plan{online, economy, auto}
	}
	need := onlineNeed(q.Duration[1], DefaultCutOverMargin)
	switch {
	case deadline <= 0:
		auto.Offered, auto.NeedsDeadline = false, true
		auto.Why = "needs a deadline: economy until the deadline leaves the time the rest needs online"
	case q.Duration[1] == 0:
		auto.Offered, auto.Why = false, "time online unknown, so the switch to online cannot be placed"
	case need >= deadline:
		auto.AllOnline, auto.Cost, auto.Duration = true, q.Cost, q.Duration
		auto.Why = "all online at once: the rows need about " + need.Round(time.Second).String() + " online, the deadline is " + deadline.Round(time.Second).String() + " away"
	default:
		auto.Cost = Spread{Low: q.Economy.Mid, Mid: (q.Economy.Mid + q.Cost.Mid) / 2, High: q.Cost.Mid}
		auto.Duration = [3]time.Duration{0, deadline, deadline}
		auto.EconomyFor = deadline - need
		auto.Why = "economy for up to " + auto.EconomyFor.Round(time.Second).String() + ", then the rows left online"
	}
	return []Plan{online, economy, auto}
}
