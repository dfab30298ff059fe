package dynamostore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/store"
)

// rowState is the part of a row item ReopenTask reads: no cells.
type rowState struct {
	No                int    `dynamodbav:"no"`
	State             string `dynamodbav:"state"`
	ErrorClass        string `dynamodbav:"error_class,omitempty"`
	Provider          string `dynamodbav:"provider,omitempty"`
	InputTokens       int64  `dynamodbav:"input_tokens,omitempty"`
	OutputTokens      int64  `dynamodbav:"output_tokens,omitempty"`
	CachedInputTokens int64  `dynamodbav:"cached_input_tokens,omitempty"`
}

// ReopenTask puts the FAILED rows of a finished task (those of class
// errorClass, or all when it is empty) back to PENDING with a fresh attempt
// budget, reopens the batches that hold a PENDING row (and puts a cancelled
// task's unfinished batches back in the open index), recounts the task from
// the batches still DONE, and sets it RUNNING with no result and the next
// export generation. It returns the task and the batch numbers to enqueue.
// When nothing is left to run it changes nothing and returns no batches. A
// task that is not SUCCEEDED, PARTIAL or CANCELLED gives ErrConflict.
//
// DynamoDB has no transaction that large, so the steps are ordered to be
// safe to repeat: rows first, then batches, then the task (still final
// until that last write, so no worker touches its batches meanwhile, and the
// sweeper never sees the reopened batches as stale before it). A retry that
// died halfway is finished by running it again: rows already PENDING make
// their batches reopen.
func (s *Store) ReopenTask(ctx context.Context, taskID, errorClass string, now time.Time) (store.Task, []int, error) {
	what := fmt.Sprintf("reopen task %s", taskID)
	task, err := s.GetTask(ctx, taskID)
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	if !store.EventReopen.Allows(task.State) {
		return store.Task{}, nil, fmt.Errorf("%s: task is %s; only a finished or cancelled task can be retried: %w", what, task.State, store.ErrConflict)
	}
	rows, err := s.rowStates(ctx, taskID)
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	var reset []int
	for i, r := range rows {
		if r.State == string(store.RowFailed) && (errorClass == "" || r.ErrorClass == errorClass) {
			reset = append(reset, r.No)
			rows[i] = rowState{No: r.No, State: string(store.RowPending)}
		}
	}
	batches, err := s.ListBatches(ctx, store.ListBatchesParams{TaskID: taskID})
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	state := make(map[int]string, len(rows))
	usage := make(map[int]store.Usage, len(rows))
	provider := make(map[int]string, len(rows))
	for _, r := range rows {
		state[r.No] = r.State
		usage[r.No] = store.Usage{InputTokens: r.InputTokens, OutputTokens: r.OutputTokens, CachedInputTokens: r.CachedInputTokens}
		provider[r.No] = r.Provider
	}
	var open []int
	var reopen []store.Batch
	var saved []store.RowCounts // of each batch in reopen: its rows final after the reset
	counts := map[string]int{}
	var tokens store.Usage
	byProvider := map[string]store.Usage{}
	done := 0
	for _, b := range batches {
		pending := b.State != store.BatchDone
		for no := b.FirstRow; no < b.FirstRow+b.RowCount && !pending; no++ {
			pending = state[no] == string(store.RowPending)
		}
		if pending {
			open = append(open, b.No)
			reopen = append(reopen, b)
			var c store.RowCounts
			for no := b.FirstRow; no < b.FirstRow+b.RowCount; no++ {
				c = c.Count(store.RowState(state[no]))
			}
			saved = append(saved, c)
			continue
		}
		done++
		for no := b.FirstRow; no < b.FirstRow+b.RowCount; no++ {
			counts[state[no]]++
			tokens = tokens.Add(usage[no])
			if usage[no] != (store.Usage{}) {
				byProvider[provider[no]] = byProvider[provider[no]].Add(usage[no])
			}
		}
	}
	if len(open) == 0 {
		return task, nil, nil
	}

	err = forEach(ctx, len(reset), s.opts.WriteConcurrency, func(ctx context.Context, i int) error {
		return s.resetRow(ctx, taskID, reset[i], now)
	})
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: reset rows: %w", what, err)
	}
	err = forEach(ctx, len(reopen), s.opts.WriteConcurrency, func(ctx context.Context, i int) error {
		return s.reopenBatch(ctx, reopen[i], saved[i], now)
	})
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: reopen batches: %w", what, err)
	}

	e := newExpr()
	u := &update{e: e}
	u.setS(attrState, string(store.EventReopen.To()))
	u.setS(attrUpdatedAt, encodeTime(now))
	u.setI(attrBatchesDone, int64(done))
	u.setI(attrRowsSucceeded, int64(counts[string(store.RowSucceeded)]))
	u.setI(attrRowsFailed, int64(counts[string(store.RowFailed)]))
	u.setI(attrRowsSkipped, int64(counts[string(store.RowSkipped)]))
	u.setI(attrInputTokens, tokens.InputTokens)
	u.setI(attrOutputTokens, tokens.OutputTokens)
	u.setI(attrCachedInputTokens, tokens.CachedInputTokens)
	// The per-provider split is recounted likewise: the counters of the
	// kept rows are set, every other counter the task had is removed
	// (DynamoDB refuses a name in two clauses, hence the set first).
	kept := map[string]bool{}
	for _, label := range slices.Sorted(maps.Keys(byProvider)) {
		attrs := usageAttrs(label, byProvider[label])
		for _, name := range slices.Sorted(maps.Keys(attrs)) {
			u.setI(name, attrs[name])
			kept[name] = true
		}
	}
	for _, label := range slices.Sorted(maps.Keys(task.UsageByProvider)) {
		for _, name := range usageAttrNames(label) {
			if !kept[name] {
				u.del(name)
			}
		}
	}
	u.addI(attrExportGen, 1)
	u.del(attrResultKey)
	u.del(attrError)
	u.del(attrFinishedAt)
	u.del(attrExpiresAt)
	cond := fmt.Sprintf("attribute_exists(%s) AND %s = %s", e.n(attrPK), e.n(attrState), e.s(string(task.State)))
	reopened, err := s.updateIf(ctx, key(taskPK(taskID), taskSK), cond, u, true)
	if _, ok := conditionFailed(err); ok {
		return store.Task{}, nil, fmt.Errorf("%s: task changed meanwhile: %w", what, store.ErrConflict)
	}
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: reset task: %w", what, err)
	}
	t, err := taskFromAV(reopened)
	if err != nil {
		return store.Task{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	return t, open, nil
}

// rowStates reads the number, state, error class, provider and tokens of
// every row of a task, without their cells.
func (s *Store) rowStates(ctx context.Context, taskID string) ([]rowState, error) {
	e := newExpr()
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.table),
		KeyConditionExpression: aws.String(fmt.Sprintf("%s = %s AND begins_with(%s, %s)",
			e.n(attrPK), e.s(taskPK(taskID)), e.n(attrSK), e.s(rowPrefix))),
		ProjectionExpression: aws.String(strings.Join([]string{e.n("no"), e.n(attrState), e.n(attrErrorClass), e.n(attrProvider),
			e.n(attrInputTokens), e.n(attrOutputTokens), e.n(attrCachedInputTokens)}, ", ")),
		ConsistentRead: aws.Bool(true),
	}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.attrNames(), e.attrValues()
	var out []rowState
	err := s.queryPages(ctx, in, 0, 0, 0, func(item map[string]types.AttributeValue) (bool, error) {
		var r rowState
		err := attributevalue.UnmarshalMap(item, &r)
		out = append(out, r)
		return true, err
	})
	if err != nil {
		return nil, fmt.Errorf("read row states: %w", err)
	}
	return out, nil
}

// resetRow puts a FAILED row back to PENDING with no result and a fresh
// attempt count; a row no longer FAILED is left alone.
func (s *Store) resetRow(ctx context.Context, taskID string, no int, now time.Time) error {
	e := newExpr()
	u := &update{e: e}
	u.setS(attrState, string(store.RowPending))
	u.setS(attrUpdatedAt, encodeTime(now))
	for _, a := range []string{attrOutput, attrError, attrErrorClass, attrAttempts, attrLatencyMS, attrCached,
		attrProvider, attrInputTokens, attrOutputTokens, attrCachedInputTokens} {
		u.del(a)
	}
	_, err := s.updateIf(ctx, key(taskPK(taskID), rowSK(no)), fmt.Sprintf("%s = %s", e.n(attrState), e.s(string(store.RowFailed))), u, false)
	if _, ok := conditionFailed(err); ok {
		return nil
	}
	if err != nil {
		return fmt.Errorf("row %d: %w", no, err)
	}
	return nil
}

// reopenBatch makes a DONE batch PENDING again, or puts an unfinished one
// (of a cancelled task, perhaps parked) back in the open index, as changed
// now, with saved as its saved counts.
func (s *Store) reopenBatch(ctx context.Context, b store.Batch, saved store.RowCounts, now time.Time) error {
	e := newExpr()
	u := &update{e: e}
	setSaved(u, saved)
	if b.State == store.BatchDone {
		u.setS(attrState, string(store.BatchPending))
		u.del(attrLease)
	}
	// The cancel marked the task's open batches so that their row saves
	// fail (tasks.go); reopened, their rows are to be saved again.
	u.del(attrTaskCancelled)
	s.touchOpen(u, b.TaskID, b.No, now)
	_, err := s.updateIf(ctx, key(taskPK(b.TaskID), batchSK(b.No)), fmt.Sprintf("%s = %s", e.n(attrState), e.s(string(b.State))), u, false)
	if _, ok := conditionFailed(err); ok {
		return fmt.Errorf("batch %d changed meanwhile: %w", b.No, store.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("batch %d: %w", b.No, err)
	}
	return nil
}
