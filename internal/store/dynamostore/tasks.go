package dynamostore

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/store"
)

// CreateTask puts the task item if no item has its key, or returns
// ErrConflict. An empty State is stored as PENDING.
func (s *Store) CreateTask(ctx context.Context, t store.Task) error {
	if err := checkTaskID(t.ID); err != nil {
		return fmt.Errorf("create task: %w", err)
	}
	if t.State == "" {
		t.State = store.TaskPending
	}
	it, err := taskToItem(t)
	if err != nil {
		return fmt.Errorf("create task %s: %w", t.ID, err)
	}
	if t.State.Final() && !t.FinishedAt.IsZero() && s.opts.ResultTTL > 0 {
		it.ExpiresAt = t.FinishedAt.Add(s.opts.ResultTTL).Unix()
	} else {
		created := t.CreatedAt
		if created.IsZero() {
			created = s.opts.Clock.Now()
		}
		it.ExpiresAt = s.horizon(created)
	}
	av, err := marshal(it)
	if err != nil {
		return fmt.Errorf("create task %s: %w", t.ID, err)
	}
	putUsage(av, t.UsageByProvider)
	e := newExpr()
	_, err = s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.table),
		Item:                                av,
		ConditionExpression:                 aws.String("attribute_not_exists(" + e.n(attrPK) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, retryConflicts)
	if old, ok := conditionFailed(err); ok {
		// The SDK retries a put whose answer was lost; its second try finds
		// the first one's item, which is this very create.
		if cur, derr := taskFromAV(old); derr == nil && store.SameCreate(cur, t) {
			return nil
		}
		return fmt.Errorf("create task %s: %w", t.ID, store.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("create task %s: %w", t.ID, err)
	}
	return nil
}

// GetTask reads the task item, strongly consistent, or returns ErrNotFound.
func (s *Store) GetTask(ctx context.Context, id string) (store.Task, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            key(taskPK(id), taskSK),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return store.Task{}, fmt.Errorf("get task %s: %w", id, err)
	}
	if len(out.Item) == 0 {
		return store.Task{}, fmt.Errorf("get task %s: %w", id, store.ErrNotFound)
	}
	t, err := taskFromAV(out.Item)
	if err != nil {
		return store.Task{}, fmt.Errorf("get task %s: %w", id, err)
	}
	return t, nil
}

// ListTasks queries the tasks-by-time index newest first. The index is
// eventually consistent (see the package comment); tasks created in the
// same nanosecond come in no particular order.
func (s *Store) ListTasks(ctx context.Context, limit int) ([]store.Task, error) {
	e := newExpr()
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.table),
		IndexName:                 aws.String(indexTasks),
		KeyConditionExpression:    aws.String(e.n(attrListPK) + " = " + e.s(listPK)),
		ScanIndexForward:          aws.Bool(false),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	}
	tasks, err := s.queryTasks(ctx, in, limit)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return tasks, nil
}

// queryTasks runs a query of task items, at most limit (0: all).
func (s *Store) queryTasks(ctx context.Context, in *dynamodb.QueryInput, limit int) ([]store.Task, error) {
	var tasks []store.Task
	err := s.queryPages(ctx, in, limit, 0, 1000, func(item map[string]types.AttributeValue) (bool, error) {
		t, err := taskFromAV(item)
		tasks = append(tasks, t)
		return true, err
	})
	return tasks, err
}

// ListTasksByOwner queries the tasks-by-owner index newest first, after
// p.After. The index is eventually consistent, like tasks-by-time.
func (s *Store) ListTasksByOwner(ctx context.Context, p store.ListTasksByOwnerParams) ([]store.Task, error) {
	if p.Owner == "" {
		return nil, fmt.Errorf("list tasks by owner: empty owner")
	}
	e := newExpr()
	cond := e.n(attrTaskOwner) + " = " + e.s(p.Owner)
	if p.After.ID != "" {
		cond += " AND " + e.n(attrOwnerSK) + " < " + e.s(ownerSK(p.Owner, p.After))
	}
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.table),
		IndexName:                 aws.String(indexOwner),
		KeyConditionExpression:    aws.String(cond),
		ScanIndexForward:          aws.Bool(false),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	}
	tasks, err := s.queryTasks(ctx, in, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list tasks of %s: %w", p.Owner, err)
	}
	return tasks, nil
}

// TransitionTask is one conditional UpdateItem: the task must exist and be
// in one of p.From. Moving to a final state also sets FinishedAt and the
// item's TTL. Moving to CANCELLED then flags the task's open batches (one
// UpdateItem each; see flagCancelled), so that their workers learn it from
// their next SaveRowResults; a repeated cancel of a CANCELLED task flags
// them again before returning ErrConflict, so a caller can retry a cancel
// whose flagging failed.
func (s *Store) TransitionTask(ctx context.Context, p store.TransitionTaskParams) (store.Task, error) {
	if err := p.Check(); err != nil {
		return store.Task{}, err
	}
	what := p.String()
	if len(p.From) == 0 {
		// Nothing may change; still tell a missing task from a present one.
		if _, err := s.GetTask(ctx, p.ID); err != nil {
			return store.Task{}, fmt.Errorf("%s: %w", what, err)
		}
		return store.Task{}, fmt.Errorf("%s: no source state allowed: %w", what, store.ErrConflict)
	}
	e := newExpr()
	from := make([]string, len(p.From))
	for i, st := range p.From {
		from[i] = string(st)
	}
	cond := fmt.Sprintf("attribute_exists(%s) AND %s", e.n(attrPK), e.in(attrState, from))
	u := &update{e: e}
	u.setS(attrState, string(p.To))
	u.setS(attrUpdatedAt, encodeTime(p.Now))
	if p.Error != "" {
		u.setS(attrError, p.Error)
	}
	if p.ResultKey != "" {
		u.setS(attrResultKey, p.ResultKey)
	}
	if p.NextExportGen {
		u.addI(attrExportGen, 1)
	}
	if tu := p.Recount; tu != nil {
		u.setI(attrRowsSucceeded, int64(tu.Rows.Succeeded))
		u.setI(attrRowsFailed, int64(tu.Rows.Failed))
		u.setI(attrRowsSkipped, int64(tu.Rows.Skipped))
		u.setI(attrInputTokens, tu.Total.InputTokens)
		u.setI(attrOutputTokens, tu.Total.OutputTokens)
		u.setI(attrCachedInputTokens, tu.Total.CachedInputTokens)
		for label, pu := range tu.ByProvider {
			u.setI(usageInPrefix+label, pu.InputTokens)
			u.setI(usageOutPrefix+label, pu.OutputTokens)
			u.setI(usageCachedPrefix+label, pu.CachedInputTokens)
		}
	}
	if p.To.Final() {
		u.setS(attrFinishedAt, encodeTime(p.Now))
		if s.opts.ResultTTL > 0 {
			u.setI(attrExpiresAt, p.Now.Add(s.opts.ResultTTL).Unix())
		}
	}
	// The transition's token: a transition whose answer was lost is re-sent
	// by the SDK and fails its condition on the state it set itself. Finding
	// its own token, it is this transition's answer, not a conflict (an
	// export marked started and never started, as it was before).
	token := rand.Text()
	u.setS(attrTransition, token)
	updated, err := s.updateIf(ctx, key(taskPK(p.ID), taskSK), cond, u, true)
	if old, ok := conditionFailed(err); ok && carriesToken(old, attrTransition, token) {
		updated, err = old, nil
	}
	if old, ok := conditionFailed(err); ok {
		if len(old) == 0 {
			return store.Task{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
		}
		cur, derr := taskFromAV(old)
		if derr != nil {
			return store.Task{}, fmt.Errorf("%s: %w (and %w)", what, store.ErrConflict, derr)
		}
		if p.To == store.TaskCancelled && cur.State == store.TaskCancelled {
			if err := s.flagCancelled(ctx, p.ID); err != nil {
				return store.Task{}, fmt.Errorf("%s: %w", what, err)
			}
		}
		return store.Task{}, fmt.Errorf("%s: task is %s, not one of %v: %w", what, cur.State, p.From, store.ErrConflict)
	}
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	t, err := taskFromAV(updated)
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	if p.To == store.TaskCancelled {
		if err := s.flagCancelled(ctx, p.ID); err != nil {
			return store.Task{}, fmt.Errorf("%s: the task is cancelled, but %w", what, err)
		}
	}
	return t, nil
}

// flagCancelled sets the cancel flag on every batch of the task that is not
// DONE. Running batches see it in their next SaveRowResults, which is how
// cancellation reaches them without each polling the task item; batches
// claimed later see the task's state when their message is processed.
func (s *Store) flagCancelled(ctx context.Context, taskID string) error {
	open, err := s.ListBatches(ctx, store.ListBatchesParams{TaskID: taskID, States: []store.BatchState{store.BatchPending, store.BatchRunning}})
	if err != nil {
		return fmt.Errorf("flag open batches cancelled: %w", err)
	}
	err = forEach(ctx, len(open), s.opts.WriteConcurrency, func(ctx context.Context, i int) error {
		e := newExpr()
		_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(s.table),
			Key:                       key(taskPK(taskID), batchSK(open[i].No)),
			ConditionExpression:       aws.String("attribute_exists(" + e.n(attrPK) + ")"),
			UpdateExpression:          aws.String("SET " + e.n(attrTaskCancelled) + " = " + e.v(&types.AttributeValueMemberBOOL{Value: true})),
			ExpressionAttributeNames:  e.attrNames(),
			ExpressionAttributeValues: e.attrValues(),
		}, retryConflicts)
		if err != nil {
			return fmt.Errorf("batch %d: %w", open[i].No, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("flag open batches cancelled: %w", err)
	}
	return nil
}

// horizon is the TTL (epoch seconds) of the items of a task created at
// created, or 0 (no TTL) when results are kept forever.
func (s *Store) horizon(created time.Time) int64 {
	if s.opts.ResultTTL < 0 {
		return 0
	}
	return created.Add(s.opts.MaxTaskAge + s.opts.ResultTTL).Unix()
}

// stampTaskHorizons checks, with one strongly consistent read per task,
// that the tasks of items (item i belongs to taskOf(i)) exist, so that rows
// and batches are never written for a missing task (ErrNotFound, as the
// SQLite store's foreign keys do), and gives each item its task's horizon
// as its TTL, so a task's rows and batches expire with it.
func (s *Store) stampTaskHorizons(ctx context.Context, items []map[string]types.AttributeValue, taskOf func(i int) string) error {
	ids := make([]string, len(items))
	for i := range items {
		ids[i] = taskOf(i)
	}
	horizons, err := s.taskHorizons(ctx, ids)
	if err != nil {
		return err
	}
	for i := range items {
		if h := horizons[taskOf(i)]; h > 0 {
			items[i][attrExpiresAt] = &types.AttributeValueMemberN{Value: strconv.FormatInt(h, 10)}
		}
	}
	return nil
}

// taskHorizons reads the horizon of each of the tasks ids, failing with
// ErrNotFound for one that does not exist.
func (s *Store) taskHorizons(ctx context.Context, ids []string) (map[string]int64, error) {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	horizons := make(map[string]int64, len(ids))
	for _, id := range ids {
		e := newExpr()
		out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
			TableName:                aws.String(s.table),
			Key:                      key(taskPK(id), taskSK),
			ConsistentRead:           aws.Bool(true),
			ProjectionExpression:     aws.String(e.n(attrPK) + ", " + e.n(attrCreatedAt)),
			ExpressionAttributeNames: e.attrNames(),
		})
		if err != nil {
			return nil, fmt.Errorf("check task %s: %w", id, err)
		}
		if len(out.Item) == 0 {
			return nil, fmt.Errorf("task %s: %w", id, store.ErrNotFound)
		}
		created := s.opts.Clock.Now()
		if v, ok := out.Item[attrCreatedAt].(*types.AttributeValueMemberS); ok {
			if t, err := decodeTime(v.Value); err == nil && !t.IsZero() {
				created = t
			}
		}
		horizons[id] = s.horizon(created)
	}
	return horizons, nil
}

// SetTerms implements store.Store.
func (s *Store) SetTerms(ctx context.Context, taskID string, terms store.Terms) (store.Task, error) {
	what := fmt.Sprintf("set terms of task %s", taskID)
	e := newExpr()
	u := &update{e: e}
	u.setFOrRemove(attrMaxCost, terms.MaxCost)
	u.setOrRemove(attrMode, string(terms.Mode))
	u.setOrRemove(attrDeadline, encodeTime(terms.Deadline))
	u.setFOrRemove(attrSample, float64(terms.Sample))
	updated, err := s.updateIf(ctx, key(taskPK(taskID), taskSK), "attribute_exists("+e.n(attrPK)+")", u, true)
	if _, ok := conditionFailed(err); ok {
		return store.Task{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	t, err := taskFromAV(updated)
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	return t, nil
}
