package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// A task's spending cap (store.Task.MaxCost) is held call by call: before
// a model call starts, its worst case (the prompt's estimated tokens and
// the completion's cap, at the answering route's price) is held against
// what the task may still spend; after it, the hold gives way to what the
// call really cost. A call whose worst case does not fit is not made: its
// row stays not started, and the task is stopped (cancelled, saying why),
// so its partial result is written and `retry --max-cost` with a higher
// cap runs the rest. So the cap is never passed, except by a call that
// answers with more tokens than its cap allowed for (a task without
// max_tokens is held at budgetOutputTokens a call).
//
// The ledger is the process's: exact on the embedded runtime, whose one
// process runs every batch of its tasks. A generator without prices (the
// AWS functions, for now) cannot hold a task to a cap, and stops a capped
// task at its first call rather than spend without bound.

// budgetOutputTokens is the completion held for a call of a task that sets
// no max_tokens (for each row of a packed call): what a provider's default
// cap commonly is.
const budgetOutputTokens = 4096

// BudgetError is a call not made because it could cost more than its
// task may still spend (or could not be priced at all).
type BudgetError struct {
	TaskID string
	// MaxCost is the task's cap; Spent what its calls cost so far, Held
	// what calls in flight may still cost, and Need the worst case of the
	// call refused.
	MaxCost, Spent, Held, Need float64
	// Unpriced, when set, says why the call could not be priced instead.
	Unpriced string
}

func (e *BudgetError) Error() string {
	if e.Unpriced != "" {
		return fmt.Sprintf("task %s has a max cost of %s, but %s", e.TaskID, money(e.MaxCost), e.Unpriced)
	}
	return fmt.Sprintf("max cost %s reached: %s spent and %s held by calls in flight; the next call could cost %s",
		money(e.MaxCost), money(e.Spent), money(e.Held), money(e.Need))
}

// Reason is what the stopped task says, for its status and result.
func (e *BudgetError) Reason() string {
	if e.Unpriced != "" {
		return e.Error()
	}
	return e.Error() + "; a retry with a higher --max-cost runs the rest"
}

// CheckMaxCost refuses a spending cap that is not an amount: negative, NaN
// or infinite (0 means no cap). name is what the caller calls the setting
// (--max-cost, max_cost_usd).
func CheckMaxCost(name string, v float64) error {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%s %v: must be an amount in USD, 0 (no cap) or more", name, v)
	}
	return nil
}

// money formats an amount as pricing.Estimate does.
func money(v float64) string { return pricing.Estimate{Cost: v, Known: true}.String() }

// errUnpriced: no price is known for the answering route or model.
var errUnpriced = errors.New("no price known")

// budgets are the spending ledgers of the tasks this process calls for,
// one per task with a cap, made at the task's first batch.
type budgets struct {
	store  store.Store
	prices *pricing.Table
	mu     sync.Mutex
	tasks  map[string]*budget
}

// forTask returns task's ledger, nil for a task without a cap. The first
// call for a task reads what its rows cost so far (a run that stopped
// before), so a resumed task keeps counting from there. A ledger follows
// the task's cap as its batches bring it (a retry with a higher one).
func (bs *budgets) forTask(ctx context.Context, task store.Task) (*budget, error) {
	if task.MaxCost <= 0 {
		return nil, nil
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b, ok := bs.tasks[task.ID]; ok {
		b.setLimit(task.MaxCost)
		return b, nil
	}
	b := &budget{taskID: task.ID, spec: task.Spec, prices: bs.prices, limit: task.MaxCost}
	if bs.prices != nil {
		spent, err := rowsCost(ctx, bs.store, bs.prices, task)
		if err != nil {
			return nil, err
		}
		b.spent = spent
	}
	if bs.tasks == nil {
		bs.tasks = map[string]*budget{}
	}
	bs.tasks[task.ID] = b
	return b, nil
}

// rowsCost is what task's rows cost so far, each at the price of the
// provider it records (pricing.Table.Task's rule), rows of unfinished
// batches included. Tokens without a price count as nothing: a cap set on
// a task whose earlier rows cannot be priced holds from here on.
func rowsCost(ctx context.Context, st store.Store, prices *pricing.Table, task store.Task) (float64, error) {
	const page = 1000
	byLabel := map[string]store.Usage{}
	for from := 1; ; from += page {
		rows, err := st.ListRows(ctx, store.ListRowsParams{TaskID: task.ID, FromNo: from, ToNo: from + page - 1})
		if err != nil {
			return 0, fmt.Errorf("task %s: read what its rows cost: %w", task.ID, err)
		}
		for _, r := range rows {
			if r.Usage != (store.Usage{}) {
				byLabel[r.Provider] = byLabel[r.Provider].Add(r.Usage)
			}
		}
		if from+page-1 >= task.RowsTotal {
			break
		}
	}
	total := 0.0
	for label, u := range byLabel {
		if e := prices.Task(store.Task{Spec: task.Spec, UsageByProvider: map[string]store.Usage{label: u}}); e.Known {
			total += e.Cost
		}
	}
	return total, nil
}

// budget is one task's ledger: its cap, what its calls cost, and what the
// calls in flight may still cost.
type budget struct {
	taskID string
	spec   store.TaskSpec
	prices *pricing.Table
	mu     sync.Mutex
	limit  float64
	spent  float64
	held   float64
}

func (b *budget) setLimit(v float64) {
	b.mu.Lock()
	b.limit = v
	b.mu.Unlock()
}

// maxCost is the cap now.
func (b *budget) maxCost() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limit
}

// price is the price of a call answered by route label (empty for a lone
// route, whose calls the task's provider answers) with model.
func (b *budget) price(label, model string) (pricing.Price, error) {
	if b.prices == nil {
		return pricing.Price{}, &BudgetError{TaskID: b.taskID, MaxCost: b.maxCost(), Unpriced: "this runtime cannot hold a task to a cap yet (it has no price table)"}
	}
	var keys []string
	base, batch := strings.CutSuffix(label, pricing.BatchSuffix)
	if base != "" {
		keys = append(keys, base)
		if _, m, ok := strings.Cut(base, "/"); ok {
			keys = append(keys, m)
		}
	}
	keys = append(keys, model, b.spec.Provider+"/"+b.spec.Model, b.spec.Model, b.spec.Provider)
	p, ok := b.prices.Lookup(keys...)
	if ok && batch {
		p = p.Batch()
	}
	if !ok {
		who := model
		if label != "" {
			who = label + " (" + model + ")"
		}
		return pricing.Price{}, &BudgetError{TaskID: b.taskID, MaxCost: b.maxCost(),
			Unpriced: fmt.Sprintf("%s: %s; give its price in the providers file (price: {input_per_mtok, output_per_mtok}) or --prices", errUnpriced, who)}
	}
	return p, nil
}

// hold reserves the worst case of req, answered by route label, or
// returns a *BudgetError when it does not fit what the task may still
// spend.
func (b *budget) hold(label string, req llm.Request) (float64, error) {
	p, err := b.price(label, req.Model)
	if err != nil {
		return 0, err
	}
	out := req.MaxTokens
	if out <= 0 {
		out = budgetOutputTokens * max(len(req.Pack), 1)
	}
	worst := p.Cost(store.Usage{InputTokens: int64(llm.EstimateInputTokens(req)), OutputTokens: int64(out)})
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.spent+b.held+worst > b.limit {
		return 0, &BudgetError{TaskID: b.taskID, MaxCost: b.limit, Spent: b.spent, Held: b.held, Need: worst}
	}
	b.held += worst
	return worst, nil
}

// settle replaces a hold by what the call cost: u at the route's price (u
// is zero for a call that failed, which is not billed).
func (b *budget) settle(label string, req llm.Request, held float64, u llm.Usage) {
	cost := 0.0
	if u != (llm.Usage{}) {
		if p, err := b.price(label, req.Model); err == nil {
			cost = p.Cost(billedUsage(u))
		}
	}
	b.mu.Lock()
	b.held = max(b.held-held, 0)
	b.spent += cost
	b.mu.Unlock()
}
