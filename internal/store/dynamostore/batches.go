package dynamostore

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/store"
)

// PutBatches puts each batch that does not exist yet, PENDING with Attempt
// 0, in transactions of up to 100 conditional Puts (see putAllIfAbsent).
// Batches whose task does not exist fail with ErrNotFound.
func (s *Store) PutBatches(ctx context.Context, batches []store.Batch) error {
	if len(batches) == 0 {
		return nil
	}
	what := fmt.Sprintf("put %d batches of %s", len(batches), batches[0].TaskID)
	items := make([]map[string]types.AttributeValue, len(batches))
	for i, b := range batches {
		if err := checkTaskID(b.TaskID); err != nil {
			return fmt.Errorf("%s: batch %d: %w", what, b.No, err)
		}
		if err := checkBatchNo(b.No); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if b.RowCount < 0 || checkRowNo(b.FirstRow) != nil {
			return fmt.Errorf("%s: batch %d: invalid rows %d+%d", what, b.No, b.FirstRow, b.RowCount)
		}
		av, err := marshal(batchToItem(b))
		if err != nil {
			return fmt.Errorf("%s: batch %d: %w", what, b.No, err)
		}
		items[i] = av
	}
	if err := s.stampTaskHorizons(ctx, items, func(i int) string { return batches[i].TaskID }); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := s.putAllIfAbsent(ctx, items); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// maxTxItems is TransactWriteItems' limit of actions per call.
const maxTxItems = 100

// maxTxBytes keeps one transaction's items under DynamoDB's 4 MB request
// limit, with room for the request's own overhead.
const maxTxBytes = 3 << 20

// putAllIfAbsent puts every item that does not exist yet, in transactions
// of up to maxTxItems Puts conditional on attribute_not_exists (and under
// maxTxBytes), Options.WriteConcurrency transactions at a time. An item
// that exists cancels its whole transaction; the cancellation reasons name
// such items, and the transaction is sent again without them, so a resumed
// split costs one extra call per transaction that meets existing items.
func (s *Store) putAllIfAbsent(ctx context.Context, items []map[string]types.AttributeValue) error {
	var chunks [][]map[string]types.AttributeValue
	start, size := 0, 0
	for i, item := range items {
		n := itemSize(item)
		if i > start && (i-start == maxTxItems || size+n > maxTxBytes) {
			chunks = append(chunks, items[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(items) {
		chunks = append(chunks, items[start:])
	}
	return forEach(ctx, len(chunks), s.opts.WriteConcurrency, func(ctx context.Context, i int) error {
		return s.putChunkIfAbsent(ctx, chunks[i])
	})
}

// putChunkIfAbsent is one transaction of putAllIfAbsent, repeated without
// the items that turned out to exist.
func (s *Store) putChunkIfAbsent(ctx context.Context, chunk []map[string]types.AttributeValue) error {
	for len(chunk) > 0 {
		tx := make([]types.TransactWriteItem, len(chunk))
		for i, item := range chunk {
			e := newExpr()
			tx[i] = types.TransactWriteItem{Put: &types.Put{
				TableName:                aws.String(s.table),
				Item:                     item,
				ConditionExpression:      aws.String("attribute_not_exists(" + e.n(attrPK) + ")"),
				ExpressionAttributeNames: e.attrNames(),
			}}
		}
		err := s.transact(ctx, tx)
		if err == nil {
			return nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return err
		}
		var rest []map[string]types.AttributeValue
		for i := range chunk {
			switch reasonCode(reasons, i) {
			case reasonCondition: // exists: left as it is
			case reasonNone, "":
				rest = append(rest, chunk[i])
			default:
				return err
			}
		}
		if len(rest) == len(chunk) {
			return err // cancelled for no item's own reason
		}
		chunk = rest
	}
	return nil
}

// putIfAbsent puts item unless an item has its key, and reports whether it
// did.
func (s *Store) putIfAbsent(ctx context.Context, item map[string]types.AttributeValue) (bool, error) {
	e := newExpr()
	_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                aws.String(s.table),
		Item:                     item,
		ConditionExpression:      aws.String("attribute_not_exists(" + e.n(attrPK) + ")"),
		ExpressionAttributeNames: e.attrNames(),
	}, retryConflicts)
	if _, ok := conditionFailed(err); ok {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// GetBatch reads a batch, strongly consistent, or returns ErrNotFound.
func (s *Store) GetBatch(ctx context.Context, taskID string, no int) (store.Batch, error) {
	if err := checkBatchNo(no); err != nil {
		return store.Batch{}, fmt.Errorf("get batch %s/%d: %w", taskID, no, store.ErrNotFound)
	}
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            key(taskPK(taskID), batchSK(no)),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return store.Batch{}, fmt.Errorf("get batch %s/%d: %w", taskID, no, err)
	}
	if len(out.Item) == 0 {
		return store.Batch{}, fmt.Errorf("get batch %s/%d: %w", taskID, no, store.ErrNotFound)
	}
	b, err := batchFromAV(out.Item)
	if err != nil {
		return store.Batch{}, fmt.Errorf("get batch %s/%d: %w", taskID, no, err)
	}
	return b, nil
}

// ListBatches queries the task's partition for its batches, in batch order,
// strongly consistent, keeping those in p.States.
func (s *Store) ListBatches(ctx context.Context, p store.ListBatchesParams) ([]store.Batch, error) {
	e := newExpr()
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.table),
		KeyConditionExpression: aws.String(fmt.Sprintf("%s = %s AND begins_with(%s, %s)",
			e.n(attrPK), e.s(taskPK(p.TaskID)), e.n(attrSK), e.s(batchPrefix))),
		ConsistentRead: aws.Bool(true),
	}
	if len(p.States) > 0 {
		states := make([]string, len(p.States))
		for i, st := range p.States {
			states[i] = string(st)
		}
		in.FilterExpression = aws.String(e.in(attrState, states))
	}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.attrNames(), e.attrValues()
	var out []store.Batch
	err := s.queryPages(ctx, in, 0, 0, 0, func(item map[string]types.AttributeValue) (bool, error) {
		b, err := batchFromAV(item)
		out = append(out, b)
		return true, err
	})
	if err != nil {
		return nil, fmt.Errorf("list batches of %s: %w", p.TaskID, err)
	}
	return out, nil
}

// openBatch is a batch read from the open-batches index with its sort key,
// for merging the shards.
type openBatch struct {
	sk string
	b  store.Batch
}

// ListOpenBatches queries every shard of the sparse open-batches index for
// batches changed before p.UpdatedBefore, in parallel, and merges them
// oldest change first. Only batches that are not DONE are in the index, so
// the cost follows the open work, not the table. The index is eventually
// consistent: the sweeper may see a batch's previous change.
func (s *Store) ListOpenBatches(ctx context.Context, p store.ListOpenBatchesParams) ([]store.Batch, error) {
	var (
		wg     sync.WaitGroup
		shards [openShards][]openBatch
		errs   [openShards]error
	)
	for i := range openShards {
		wg.Go(func() {
			shards[i], errs[i] = s.queryOpenShard(ctx, fmt.Sprintf("OPEN#%d", i), p)
		})
	}
	wg.Wait()
	var all []openBatch
	for i := range openShards {
		if errs[i] != nil {
			return nil, fmt.Errorf("list open batches: shard %d: %w", i, errs[i])
		}
		all = append(all, shards[i]...)
	}
	slices.SortFunc(all, func(a, b openBatch) int { return cmp.Compare(a.sk, b.sk) })
	if p.Limit > 0 && len(all) > p.Limit {
		all = all[:p.Limit]
	}
	out := make([]store.Batch, len(all))
	for i, ob := range all {
		out[i] = ob.b
	}
	return out, nil
}

// queryOpenShard returns the batches of one open-batches shard changed
// before p.UpdatedBefore, oldest first, at most p.Limit (0: all).
func (s *Store) queryOpenShard(ctx context.Context, shard string, p store.ListOpenBatchesParams) ([]openBatch, error) {
	e := newExpr()
	keyCond := fmt.Sprintf("%s = %s AND %s < %s",
		e.n(attrOpenPK), e.s(shard), e.n(attrOpenSK), e.s(openBefore(p.UpdatedBefore)))
	after := ""
	if p.After.TaskID != "" {
		// BETWEEN is inclusive: the cursor's own batch comes back and is
		// dropped below; openBefore never equals an open_sk, so the upper
		// bound stays exclusive.
		after = openSK(p.After.UpdatedAt, p.After.TaskID, p.After.No)
		if after >= openBefore(p.UpdatedBefore) {
			return nil, nil
		}
		keyCond = fmt.Sprintf("%s = %s AND %s BETWEEN %s AND %s",
			e.n(attrOpenPK), e.s(shard), e.n(attrOpenSK), e.s(after), e.s(openBefore(p.UpdatedBefore)))
	}
	in := &dynamodb.QueryInput{
		TableName:              aws.String(s.table),
		IndexName:              aws.String(indexOpen),
		KeyConditionExpression: aws.String(keyCond),
		ScanIndexForward:       aws.Bool(true),
	}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.attrNames(), e.attrValues()
	var out []openBatch
	// Slack 1: the cursor's own batch may take a place in the page.
	err := s.queryPages(ctx, in, p.Limit, 1, 1000, func(item map[string]types.AttributeValue) (bool, error) {
		b, err := batchFromAV(item)
		if err != nil {
			return false, err
		}
		sk, _ := item[attrOpenSK].(*types.AttributeValueMemberS)
		if sk == nil || b.State == store.BatchDone {
			return false, nil // a DONE batch never keeps open_sk; skip one if a write raced the index
		}
		if sk.Value == after {
			return false, nil // the cursor itself
		}
		out = append(out, openBatch{sk: sk.Value, b: b})
		return true, nil
	})
	return out, err
}

// ParkBatch is one conditional UpdateItem: a batch that is not DONE and
// still carries the change time p.UpdatedAt loses open_pk and open_sk, and
// with them its place in the sparse open-batches index.
func (s *Store) ParkBatch(ctx context.Context, p store.ParkBatchParams) error {
	what := fmt.Sprintf("park batch %s/%d", p.TaskID, p.BatchNo)
	if err := checkBatchNo(p.BatchNo); err != nil {
		return fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	e := newExpr()
	cond := fmt.Sprintf("attribute_exists(%s) AND %s <> %s AND %s = %s",
		e.n(attrPK), e.n(attrState), e.s(string(store.BatchDone)), e.n(attrUpdatedAt), e.s(encodeTime(p.UpdatedAt)))
	u := &update{e: e}
	u.del(attrOpenPK)
	u.del(attrOpenSK)
	_, err := s.updateIf(ctx, key(taskPK(p.TaskID), batchSK(p.BatchNo)), cond, u, false)
	if old, ok := conditionFailed(err); ok {
		return fmt.Errorf("%s: %s, changed since %s: %w", what, describeBatch(old), encodeTime(p.UpdatedAt), notFoundOrConflict(old))
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// ClaimBatch is one conditional UpdateItem: PENDING, or RUNNING with a
// lease that ended before p.Now, becomes RUNNING with the new lease and
// owner and Attempt+1, and the batch moves in the open index.
func (s *Store) ClaimBatch(ctx context.Context, p store.ClaimBatchParams) (store.Batch, error) {
	what := fmt.Sprintf("claim batch %s/%d for %s", p.TaskID, p.BatchNo, p.Owner)
	if err := checkBatchNo(p.BatchNo); err != nil {
		return store.Batch{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	e := newExpr()
	cond := fmt.Sprintf("attribute_exists(%[1]s) AND (%[2]s = %[3]s OR (%[2]s = %[4]s AND (attribute_not_exists(%[5]s) OR %[5]s < %[6]s)))",
		e.n(attrPK), e.n(attrState), e.s(string(store.BatchPending)), e.s(string(store.BatchRunning)),
		e.n(attrLease), e.s(encodeTime(p.Now)))
	// The claim's token: the SDK re-sends the same request when an answer
	// is lost (a dropped connection, a 500 after the write), and a re-sent
	// claim that had in fact been applied fails its condition. Finding its
	// own token on the batch, it is this claim's answer, not a conflict (a
	// batch lost until its lease ran out, as it was before).
	token := rand.Text()
	u := &update{e: e}
	u.setS(attrState, string(store.BatchRunning))
	u.setOrRemove(attrOwner, p.Owner)
	u.setOrRemove(attrLease, encodeTime(p.LeaseUntil))
	u.setS(attrClaim, token)
	u.addI(attrAttempt, 1)
	s.touchOpen(u, p.TaskID, p.BatchNo, p.Now)
	claimed, err := s.updateIf(ctx, key(taskPK(p.TaskID), batchSK(p.BatchNo)), cond, u, true)
	if old, ok := conditionFailed(err); ok {
		if carriesToken(old, attrClaim, token) {
			claimed, err = old, nil
		} else {
			return store.Batch{}, fmt.Errorf("%s: %s: %w", what, describeBatch(old), notFoundOrConflict(old))
		}
	}
	if err != nil {
		return store.Batch{}, fmt.Errorf("%s: %w", what, err)
	}
	b, err := batchFromAV(claimed)
	if err != nil {
		return store.Batch{}, fmt.Errorf("%s: %w", what, err)
	}
	return b, nil
}

// touchOpen sets updated_at and the batch's position in the open index,
// for every write that leaves a batch open.
func (s *Store) touchOpen(u *update, taskID string, no int, now time.Time) {
	u.setS(attrUpdatedAt, encodeTime(now))
	u.setS(attrOpenPK, openShard(taskID, no))
	u.setS(attrOpenSK, openSK(now, taskID, no))
}

// describeBatch says what state a batch was in when a condition failed, for
// error messages.
func describeBatch(old map[string]types.AttributeValue) string {
	if len(old) == 0 {
		return "no such batch"
	}
	b, err := batchFromAV(old)
	if err != nil {
		return "batch unreadable: " + err.Error()
	}
	return fmt.Sprintf("batch is %s (attempt %d by %q, lease until %s)",
		b.State, b.Attempt, b.Owner, b.LeaseUntil.Format("15:04:05.000"))
}

// RenewLease is one conditional UpdateItem fenced on RUNNING and p.Attempt.
func (s *Store) RenewLease(ctx context.Context, p store.RenewLeaseParams) error {
	what := fmt.Sprintf("renew lease of batch %s/%d (attempt %d)", p.TaskID, p.BatchNo, p.Attempt)
	u := &update{e: newExpr()}
	u.setOrRemove(attrLease, encodeTime(p.LeaseUntil))
	s.touchOpen(u, p.TaskID, p.BatchNo, p.Now)
	return s.fencedBatchUpdate(ctx, what, p.TaskID, p.BatchNo, p.Attempt, u)
}

// ReleaseBatch is one conditional UpdateItem fenced on RUNNING and
// p.Attempt: the batch becomes PENDING without a lease. The owner stays, for
// operators; a non-empty p.LastError replaces the recorded one.
func (s *Store) ReleaseBatch(ctx context.Context, p store.ReleaseBatchParams) error {
	what := fmt.Sprintf("release batch %s/%d (attempt %d)", p.TaskID, p.BatchNo, p.Attempt)
	u := &update{e: newExpr()}
	u.setS(attrState, string(store.BatchPending))
	u.del(attrLease)
	if p.LastError != "" {
		u.setS(attrLastError, p.LastError)
	}
	s.touchOpen(u, p.TaskID, p.BatchNo, p.Now)
	return s.fencedBatchUpdate(ctx, what, p.TaskID, p.BatchNo, p.Attempt, u)
}

// TouchBatch is one conditional UpdateItem fenced on PENDING and
// p.Attempt: the batch's change time (and so its place in the open index)
// moves to p.Now, so the sweeper that re-enqueued it skips it next pass.
func (s *Store) TouchBatch(ctx context.Context, p store.TouchBatchParams) error {
	what := fmt.Sprintf("touch batch %s/%d (attempt %d)", p.TaskID, p.BatchNo, p.Attempt)
	u := &update{e: newExpr()}
	s.touchOpen(u, p.TaskID, p.BatchNo, p.Now)
	return s.conditionalBatchUpdate(ctx, what, p.TaskID, p.BatchNo, store.BatchPending, p.Attempt, u)
}

// fencedBatchUpdate applies u to a batch that is RUNNING under attempt, or
// returns ErrConflict (the caller lost the batch, or never had it).
func (s *Store) fencedBatchUpdate(ctx context.Context, what, taskID string, no, attempt int, u *update) error {
	return s.conditionalBatchUpdate(ctx, what, taskID, no, store.BatchRunning, attempt, u)
}

// conditionalBatchUpdate applies u to a batch that is in state under
// attempt, or returns ErrConflict.
func (s *Store) conditionalBatchUpdate(ctx context.Context, what, taskID string, no int, state store.BatchState, attempt int, u *update) error {
	if err := checkBatchNo(no); err != nil {
		return fmt.Errorf("%s: %w: %w", what, err, store.ErrConflict)
	}
	cond := stateCondition(u.e, state, attempt)
	_, err := s.updateIf(ctx, key(taskPK(taskID), batchSK(no)), cond, u, false)
	if old, ok := conditionFailed(err); ok {
		return fmt.Errorf("%s: %s, not %s under this attempt: %w", what, describeBatch(old), state, store.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// stateCondition holds when the batch is in state under attempt; a missing
// batch fails it.
func stateCondition(e *expr, state store.BatchState, attempt int) string {
	return fmt.Sprintf("%s = %s AND %s = %s",
		e.n(attrState), e.s(string(state)), e.n(attrAttempt), e.i(int64(attempt)))
}

// finishEchoed reports whether old, the batch a FinishBatch found not
// RUNNING, is that very finish already applied: DONE under p.Attempt at
// p.Now with p's counts. The SDK re-sends a transaction whose answer was
// lost, and the second sending fails on the batch the first one finished;
// taking that for a newer claim would leave the task's last batch done
// and its export never started.
func finishEchoed(old map[string]types.AttributeValue, p store.FinishBatchParams) bool {
	var it batchItem
	if len(old) == 0 || attributevalue.UnmarshalMap(old, &it) != nil {
		return false
	}
	return it.State == string(store.BatchDone) && it.Attempt == p.Attempt && it.UpdatedAt == encodeTime(p.Now) &&
		it.SavedSucceeded == p.Succeeded && it.SavedFailed == p.Failed && it.SavedSkipped == p.Skipped
}

// heldCondition is the fence of a claim's owner: the batch is RUNNING under
// attempt.
func heldCondition(e *expr, attempt int) string {
	return stateCondition(e, store.BatchRunning, attempt)
}

// FinishBatch is one TransactWriteItems: the batch, fenced on RUNNING and
// p.Attempt, becomes DONE with its counts as saved counts and leaves the open index, and the task's counters
// grow by the batch and its rows, its per-provider token sums included (ADD,
// so concurrent finishes of one task add up). A transaction returns no values, so the task is then read back,
// strongly consistent: it may include other batches finished meanwhile,
// which is what the caller needs to see to start the export.
func (s *Store) FinishBatch(ctx context.Context, p store.FinishBatchParams) (store.Task, error) {
	what := fmt.Sprintf("finish batch %s/%d (attempt %d)", p.TaskID, p.BatchNo, p.Attempt)
	if err := p.Check(); err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	if err := checkBatchNo(p.BatchNo); err != nil {
		return store.Task{}, fmt.Errorf("%s: %w: %w", what, err, store.ErrConflict)
	}
	be := newExpr()
	bu := &update{e: be}
	bu.setS(attrState, string(store.BatchDone))
	bu.setS(attrUpdatedAt, encodeTime(p.Now))
	bu.del(attrLease)
	bu.del(attrOpenPK)
	bu.del(attrOpenSK)
	setSaved(bu, store.RowCounts{Succeeded: p.Succeeded, Failed: p.Failed, Skipped: p.Skipped})
	bcond := heldCondition(be, p.Attempt)

	te := newExpr()
	tu := &update{e: te}
	tu.setS(attrUpdatedAt, encodeTime(p.Now))
	tu.addI(attrBatchesDone, 1)
	tu.addI(attrRowsSucceeded, int64(p.Succeeded))
	tu.addI(attrRowsFailed, int64(p.Failed))
	tu.addI(attrRowsSkipped, int64(p.Skipped))
	tu.addI(attrInputTokens, p.Usage.InputTokens)
	tu.addI(attrOutputTokens, p.Usage.OutputTokens)
	tu.addI(attrCachedInputTokens, p.Usage.CachedInputTokens)
	// The per-provider split grows in the same write (sorted: the same
	// batch renders the same expression).
	for _, label := range slices.Sorted(maps.Keys(p.UsageByProvider)) {
		attrs := usageAttrs(label, p.UsageByProvider[label])
		for _, name := range slices.Sorted(maps.Keys(attrs)) {
			tu.addI(name, attrs[name])
		}
	}
	tcond := "attribute_exists(" + te.n(attrPK) + ")"

	err := s.transact(ctx, []types.TransactWriteItem{
		{Update: &types.Update{
			TableName:                           aws.String(s.table),
			Key:                                 key(taskPK(p.TaskID), batchSK(p.BatchNo)),
			ConditionExpression:                 aws.String(bcond),
			UpdateExpression:                    aws.String(bu.String()),
			ExpressionAttributeNames:            be.attrNames(),
			ExpressionAttributeValues:           be.attrValues(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}},
		{Update: &types.Update{
			TableName:                 aws.String(s.table),
			Key:                       key(taskPK(p.TaskID), taskSK),
			ConditionExpression:       aws.String(tcond),
			UpdateExpression:          aws.String(tu.String()),
			ExpressionAttributeNames:  te.attrNames(),
			ExpressionAttributeValues: te.attrValues(),
		}},
	})
	if reasons, ok := cancelReasons(err); ok {
		switch {
		case reasonCode(reasons, 0) == reasonCondition && finishEchoed(reasons[0].Item, p):
			err = nil // applied by an earlier sending whose answer was lost
		case reasonCode(reasons, 0) == reasonCondition:
			return store.Task{}, fmt.Errorf("%s: %s, not RUNNING under this attempt: %w",
				what, describeBatch(reasons[0].Item), store.ErrConflict)
		case reasonCode(reasons, 1) == reasonCondition:
			return store.Task{}, fmt.Errorf("%s: task: %w", what, store.ErrNotFound)
		}
	}
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: %w", what, err)
	}
	t, err := s.GetTask(ctx, p.TaskID)
	if err != nil {
		return store.Task{}, fmt.Errorf("%s: read task back: %w", what, err)
	}
	return t, nil
}
