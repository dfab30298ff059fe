package dynamostore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/store"
)

// A capped task's fleet ledger (store.Allowances) is one item under the
// task's partition,
//
//	PK=TASK#<id>  SK=ALLOWANCE  cap=<the cap it was opened under>  left=<what may still be taken>
//
// written only by conditional UpdateItem (the generator's grant): a taking
// is one decrement conditioned on what is left, so that any number of
// generators share the cap without a lock. One write per taking (a few
// calls' worth, see pipeline's budget) and one per return keep it far from
// a partition's write limit.
const (
	allowanceSK   = "ALLOWANCE"
	attrCap       = "cap"
	attrLeft      = "left"
	takeAttempts  = 5
	allowanceWhat = "allowance of task %s"
)

var _ store.Allowances = (*Store)(nil)

// TakeAllowance implements store.Allowances: it takes want when that much
// is left, else what is left (at least need), each a decrement conditioned
// on the cap and on what is left; a taking that loses a race to another
// reads what is left from the failed condition and tries again.
func (s *Store) TakeAllowance(ctx context.Context, taskID string, limit, need, want float64) (taken, left float64, err error) {
	what := fmt.Sprintf("take "+allowanceWhat, taskID)
	amount := want
	for attempt := 1; ; attempt++ {
		e := newExpr()
		u := &update{e: e}
		u.set = append(u.set, e.n(attrLeft)+" = "+e.n(attrLeft)+" - "+e.f(amount))
		cond := fmt.Sprintf("%s = %s AND %s >= %s", e.n(attrCap), e.f(limit), e.n(attrLeft), e.f(amount))
		updated, err := s.updateIf(ctx, key(taskPK(taskID), allowanceSK), cond, u, true)
		if err == nil {
			return amount, numberAttr(updated, attrLeft), nil
		}
		old, failed := conditionFailed(err)
		if !failed {
			return 0, 0, fmt.Errorf("%s: %w", what, err)
		}
		if len(old) == 0 || numberAttr(old, attrCap) != limit {
			return 0, 0, fmt.Errorf("%s: no ledger under a cap of %v: %w", what, limit, store.ErrNotFound)
		}
		left = numberAttr(old, attrLeft)
		if left < need {
			return 0, left, nil
		}
		if attempt == takeAttempts {
			amount = need // others keep taking: settle for the least
		} else {
			amount = min(want, left)
		}
		if attempt > takeAttempts {
			return 0, left, fmt.Errorf("%s: %d takings lost to others in a row", what, attempt)
		}
	}
}

// OpenAllowance implements store.Allowances.
func (s *Store) OpenAllowance(ctx context.Context, taskID string, limit, spent float64) error {
	e := newExpr()
	u := &update{e: e}
	u.set = append(u.set, e.n(attrCap)+" = "+e.f(limit), e.n(attrLeft)+" = "+e.f(limit-spent))
	cond := fmt.Sprintf("attribute_not_exists(%s) OR %s <> %s", e.n(attrPK), e.n(attrCap), e.f(limit))
	_, err := s.updateIf(ctx, key(taskPK(taskID), allowanceSK), cond, u, false)
	if _, failed := conditionFailed(err); failed {
		return nil // open under limit already: its takings stand
	}
	if err != nil {
		return fmt.Errorf("open "+allowanceWhat+": %w", taskID, err)
	}
	return nil
}

// ReturnAllowance implements store.Allowances.
func (s *Store) ReturnAllowance(ctx context.Context, taskID string, limit, amount float64) error {
	e := newExpr()
	u := &update{e: e}
	u.set = append(u.set, e.n(attrLeft)+" = "+e.n(attrLeft)+" + "+e.f(amount))
	cond := fmt.Sprintf("%s = %s", e.n(attrCap), e.f(limit))
	_, err := s.updateIf(ctx, key(taskPK(taskID), allowanceSK), cond, u, false)
	if _, failed := conditionFailed(err); failed {
		return nil // opened again under another cap, or gone
	}
	if err != nil {
		return fmt.Errorf("return "+allowanceWhat+": %w", taskID, err)
	}
	return nil
}

// numberAttr reads a number attribute; 0 when absent or not a number.
func numberAttr(item map[string]types.AttributeValue, name string) float64 {
	if v, ok := item[name].(*types.AttributeValueMemberN); ok {
		f, _ := strconv.ParseFloat(v.Value, 64)
		return f
	}
	return 0
}
