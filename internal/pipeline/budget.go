package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

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
// The ledger is the process's on the embedded runtime, whose one process
// runs every batch of its tasks: exact. A fleet (the AWS generators) shares
// one ledger per task in the store (store.Allowances, GeneratorConfig.
// Allowances): each process takes an allowance of a few calls' worst case
// at a time, holds its calls against it, and gives back what they did not
// spend when its last batch of the task ends. So the fleet together never
// passes the cap; a process killed before it gives back leaves its
// allowance counted as spent (the task may stop up to that much short of
// its cap, never past it). A generator without prices cannot hold a task to
// a cap, and stops a capped task at its first call rather than spend
// without bound.

// allowanceCalls is how many calls' worst case a process takes from the
// fleet's ledger at a time beyond the call at hand: fewer writes to the
// task's ledger item, at the price of that much set aside while this
// process has it.
const allowanceCalls = 4

// takeTimeout bounds one taking from the fleet's ledger, its opening
// included.
const takeTimeout = 20 * time.Second

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
	// Fleet is set when the ledger is the fleet's (store.Allowances):
	// Spent then counts what every process spent or set aside.
	Fleet bool
}

func (e *BudgetError) Error() string {
	if e.Unpriced != "" {
		return fmt.Sprintf("task %s has a max cost of %s, but %s", e.TaskID, money(e.MaxCost), e.Unpriced)
	}
	if e.Fleet {
		return fmt.Sprintf("max cost %s reached: %s spent or set aside for calls in flight by every generator; the next call could cost %s",
			money(e.MaxCost), money(e.Spent), money(e.Need))
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
	// shared, when set, is the fleet's ledger each budget takes its
	// allowances from.
	shared store.Allowances
	mu     sync.Mutex
	tasks  map[string]*budget
}

// forTask returns task's ledger, nil for a task without a cap. The first
// call for a task reads what its rows cost so far (a run that stopped
// before), so a resumed task keeps counting from there. A ledger follows
// the task's cap as its batches bring it (a retry with a higher one).
// With a fleet's ledger nothing is read here: the first taking opens it.
// Each ledger returned is released (release) when its batch ends.
func (bs *budgets) forTask(ctx context.Context, task store.Task) (*budget, error) {
	if task.MaxCost <= 0 {
		return nil, nil
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b, ok := bs.tasks[task.ID]; ok {
		b.setLimit(task.MaxCost)
		b.mu.Lock()
		b.active++
		b.mu.Unlock()
		return b, nil
	}
	b := &budget{taskID: task.ID, spec: task.Spec, rows: task.RowsTotal, prices: bs.prices, limit: task.MaxCost, active: 1}
	if bs.shared != nil && bs.prices != nil {
		b.shared, b.st = bs.shared, bs.store
	} else if bs.prices != nil {
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

// release ends one batch's use of b: when it was the last of its task in
// this process, the allowance b holds from the fleet's ledger is given
// back, so that other processes may spend it. It runs on a context of its
// own: the batch's may have ended.
func (bs *budgets) release(ctx context.Context, b *budget) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active--
	if b.active > 0 || b.shared == nil || b.allowance <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := b.shared.ReturnAllowance(ctx, b.taskID, b.limit, b.allowance); err == nil {
		b.allowance = 0
	}
	// A return that failed stays counted as spent by the fleet: the task
	// may stop that much short of its cap, never past it. This process
	// keeps it for its next batch of the task.
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
	rows   int
	prices *pricing.Table
	mu     sync.Mutex
	limit  float64
	spent  float64
	held   float64
	// active counts this process's batches of the task using the ledger.
	active int
	// shared is the fleet's ledger (nil: this process's ledger is the
	// task's); allowance what this process took from it and has not held
	// yet; st reads what the rows cost when the ledger is opened.
	shared    store.Allowances
	allowance float64
	st        store.Store
}

func (b *budget) setLimit(v float64) {
	b.mu.Lock()
	if b.shared != nil && v != b.limit {
		// The fleet's ledger is opened again under the new cap from what
		// the rows cost: what was taken under the old one is not this
		// process's to hold any more.
		b.allowance = 0
	}
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
func (b *budget) hold(ctx context.Context, label string, req llm.Request) (float64, error) {
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
	if b.shared != nil {
		if b.allowance < worst {
			need := worst - b.allowance
			taken, left, err := b.take(ctx, need, need+allowanceCalls*worst)
			if err != nil {
				return 0, err
			}
			if taken == 0 {
				return 0, &BudgetError{TaskID: b.taskID, MaxCost: b.limit, Spent: b.limit - left, Need: worst, Fleet: true}
			}
			b.allowance += taken
		}
		b.allowance -= worst
		b.held += worst
		return worst, nil
	}
	if b.spent+b.held+worst > b.limit {
		return 0, &BudgetError{TaskID: b.taskID, MaxCost: b.limit, Spent: b.spent, Held: b.held, Need: worst}
	}
	b.held += worst
	return worst, nil
}

// take takes between need and want from the fleet's ledger, opening it
// (from what the task's rows cost so far) when it is not open under the
// task's cap.
func (b *budget) take(ctx context.Context, need, want float64) (taken, left float64, err error) {
	// The caller holds b.mu, which every call of the task in this process
	// waits on: a store call that hangs must not hold them all. One that
	// runs out fails this call's row for now (its batch comes back).
	ctx, cancel := context.WithTimeout(ctx, takeTimeout)
	defer cancel()
	taken, left, err = b.shared.TakeAllowance(ctx, b.taskID, b.limit, need, want)
	if !errors.Is(err, store.ErrNotFound) {
		return taken, left, err
	}
	spent, err := rowsCost(ctx, b.st, b.prices, store.Task{ID: b.taskID, Spec: b.spec, RowsTotal: b.rows})
	if err != nil {
		return 0, 0, err
	}
	if err := b.shared.OpenAllowance(ctx, b.taskID, b.limit, spent); err != nil {
		return 0, 0, err
	}
	return b.shared.TakeAllowance(ctx, b.taskID, b.limit, need, want)
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
	if b.shared != nil {
		// What the hold set aside and the call did not spend is this
		// process's to hold again (or to give back); a call that cost more
		// than its hold leaves the allowance short, and the next hold takes
		// the difference.
		b.allowance += held - cost
	}
	b.mu.Unlock()
}
