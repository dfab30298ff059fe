package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/store"
)

// Several rows per call (TaskSpec.RowsPerCall): at a quota of requests per minute, a sheet of short rows is
// bounded by requests while the token quota has room for many rows a request. A packed call asks for one answer
// per row id (schema.PackPrompt); each answer is matched to its row by id, never by position, and a row the call
// did not decide (its item missing, given twice, or not fitting the columns) is asked again alone, so a packed call
// never decides a row it did not answer.

// MaxPackPromptTokens bounds a packed call's estimated prompt: rows are added to a pack until it holds
// RowsPerCall of them or the next would take it past this, so that a pack of long rows stays far inside a model's
// context window and does not take a whole minute's token quota in one request.
const MaxPackPromptTokens = 12_000

// packer groups a batch's rows that need a call into packs as they come.
type packer struct {
	size   int // rows per call
	budget int // the most estimated prompt tokens a pack carries
	rows   []int
	tokens int
}

// newPacker packs size rows a call within budget tokens (MaxPackPromptTokens when 0 or more).
func newPacker(size, budget int) *packer {
	if budget <= 0 || budget > MaxPackPromptTokens {
		budget = MaxPackPromptTokens
	}
	return &packer{size: max(size, 1), budget: budget}
}

// add puts row i (its prompt estimated at tokens) in the pack, and returns the pack to send first when the row
// does not fit beside the rows already in it.
func (p *packer) add(i, tokens int) (full []int) {
	if len(p.rows) > 0 && (len(p.rows) == p.size || p.tokens+tokens > p.budget) {
		full = p.take()
	}
	p.rows = append(p.rows, i)
	p.tokens += tokens
	return full
}

// take empties the pack and returns what it held.
func (p *packer) take() []int {
	rows := p.rows
	p.rows, p.tokens = nil, 0
	return rows
}

// generatePack answers rows (not final, not answered by the cache) with one call, and each row it did not decide
// with a call of its own (generateRow). It returns one outcome per row. The packed call is tried as a row's call
// is: a retryable failure backs off and tries again within the round, and every try counts as a call of every row
// in it. A packed call refused for good (a content filter, a prompt too long, a bad request: perhaps one row's
// doing) asks every row alone instead.
func (g *Generator) generatePack(ctx, startCtx context.Context, mayStart func() bool, spend *budget, task store.Task, rows []store.Row, reqs []llm.Request, keys []string) []rowOutcome {
	out := make([]rowOutcome, len(rows))
	items := make([]schema.PackItem, len(rows))
	ids := make([]string, len(rows))
	weights := make([]int, len(rows))
	for i, r := range rows {
		ids[i] = strconv.Itoa(r.No)
		items[i] = schema.PackItem{ID: ids[i], Prompt: reqs[i].Prompt}
		weights[i] = llm.EstimateTokens(reqs[i].Prompt) + 1
	}
	req := reqs[0]
	req.Prompt, req.Pack = schema.PackPrompt(items), items
	req.MaxTokens *= len(rows) // each row's cap, for every row

	aborted := func(starved bool, over *BudgetError) []rowOutcome {
		for i, r := range rows {
			out[i] = rowOutcome{result: r.RowResult, aborted: true, starved: starved, overBudget: over}
		}
		return out
	}
	var last *llm.Error
	calls := 0
	var resp RoutedResponse
	answered := false
	for i := 0; i < g.cfg.CallsPerRound && g.router.Refused() == nil; i++ {
		if !mayStart() {
			return g.afterPackCalls(task, rows, calls, last, true)
		}
		r, err := g.call(ctx, startCtx, mayStart, task, req, spend)
		if errors.Is(err, errNotStarted) {
			var over *BudgetError
			errors.As(err, &over)
			if calls > 0 {
				o := g.afterPackCalls(task, rows, calls, last, true)
				if over != nil {
					o[0].overBudget = over
				}
				return o
			}
			return aborted(errors.Is(err, errStarved), over)
		}
		for _, c := range r.Log {
			g.recordCall(cmp.Or(c.Response.Provider, c.Route, ProviderLabel(task.Spec)), c.Latency, c.Response, c.Err, c.Aborted)
		}
		if err == nil {
			calls++
			resp, answered = r, true
			break
		}
		if ctx.Err() != nil {
			return aborted(false, nil)
		}
		calls++
		last = llm.Classify(err)
		if !last.Class.Retryable() {
			break
		}
		if i == g.cfg.CallsPerRound-1 {
			return g.afterPackCalls(task, rows, calls, last, false)
		}
		select {
		case <-startCtx.Done():
			return g.afterPackCalls(task, rows, calls, last, true)
		case <-g.cfg.Clock.After(g.backoff(i, last)):
		}
	}

	var outputs, problems map[string]string
	if answered {
		var err error
		outputs, problems, err = task.Spec.Columns.SplitPacked(resp.Text, ids)
		if err != nil {
			g.cfg.Logger.DebugContext(ctx, "the packed answer cannot be read; asking each row alone", "rows", len(rows), "error", err)
		}
	}
	shares := shareUsage(billedUsage(resp.Usage), weights)
	first := true
	for i, r := range rows {
		prior := r.RowResult
		if text, ok := outputs[ids[i]]; ok {
			o := rowOutcome{save: true, result: store.RowResult{
				State: store.RowSucceeded, Output: text, Attempts: prior.Attempts + calls, LatencyMS: resp.Latency.Milliseconds(),
				Provider: cmp.Or(resp.Provider, ProviderLabel(task.Spec)), Usage: shares[i],
			}}
			o.event = Event{TaskID: task.ID, RowNo: r.No, State: store.RowSucceeded}
			if first {
				o.event.Calls, first = calls, false
			}
			if g.cfg.Cache != nil {
				o.cache = &store.CacheEntry{Key: keys[i], Output: text}
			}
			out[i] = o
			continue
		}
		if answered && problems[ids[i]] != "" {
			g.cfg.Logger.DebugContext(ctx, "a packed answer did not decide this row; asking it alone", logging.Row, r.No, "problem", problems[ids[i]])
		}
		// Asked alone: what the packed calls cost it and counted against it go with it.
		r.Attempts = prior.Attempts + calls
		o := g.generateRow(ctx, startCtx, mayStart, spend, task, r, single(reqs[i]), keys[i])
		if o.save {
			o.result.Usage = o.result.Usage.Add(shares[i])
		} else if calls > 0 {
			o = g.afterPackCalls(task, []store.Row{rows[i]}, calls, last, true)[0]
			o.result.Usage = shares[i]
		}
		out[i] = o
	}
	return out
}

// single is a row's own request, for a row a packed call did not decide.
func single(req llm.Request) llm.Request {
	req.Pack = nil
	return req
}

// afterPackCalls is the outcome of rows whose packed call was tried calls times without an answer: each row's
// calls grow by that many, and it stays PENDING for a later round (FAILED once it has had every call it may).
// aborted marks a stop before the round's calls were spent (a batch handed back).
func (g *Generator) afterPackCalls(task store.Task, rows []store.Row, calls int, last *llm.Error, aborted bool) []rowOutcome {
	out := make([]rowOutcome, len(rows))
	for i, r := range rows {
		if calls == 0 {
			out[i] = rowOutcome{result: r.RowResult, aborted: true}
			continue
		}
		out[i] = g.unfinished(task, r, r.Attempts+calls, last)
		out[i].aborted = aborted && out[i].result.State == store.RowPending
	}
	return out
}

// shareUsage splits a packed call's usage over its rows by their share of the prompt (weights): each count's
// shares add up to the whole, so the task's tokens are what the provider billed.
func shareUsage(u store.Usage, weights []int) []store.Usage {
	total := 0
	for _, w := range weights {
		total += w
	}
	out := make([]store.Usage, len(weights))
	split := func(n int64, set func(*store.Usage, int64)) {
		left := n
		for i, w := range weights {
			part := n * int64(w) / int64(max(total, 1))
			if i == len(weights)-1 {
				part = left
			}
			set(&out[i], part)
			left -= part
		}
	}
	split(u.InputTokens, func(x *store.Usage, v int64) { x.InputTokens = v })
	split(u.OutputTokens, func(x *store.Usage, v int64) { x.OutputTokens = v })
	split(u.CachedInputTokens, func(x *store.Usage, v int64) { x.CachedInputTokens = v })
	return out
}

// checkRowsPerCall is the rule for TaskSpec.RowsPerCall: 0 (one, the default) to schema.MaxRowsPerCall.
func checkRowsPerCall(n int) error {
	if n < 0 || n > schema.MaxRowsPerCall {
		return fmt.Errorf("rows per call %d: must be between 1 and %d", n, schema.MaxRowsPerCall)
	}
	return nil
}
