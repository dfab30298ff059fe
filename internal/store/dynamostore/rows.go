package dynamostore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/store"
)

// ErrItemTooLarge is returned for a row (when no Options.Overflow store is
// configured) or a cache entry whose item would exceed DynamoDB's 400 KB
// item limit.
var ErrItemTooLarge = errors.New("too large for a DynamoDB item")

// overflowKey is the blob key of a row's cells kept outside its item.
func overflowKey(taskID string, no int) string {
	return fmt.Sprintf("overflow/%s/%d.json", taskID, no)
}

// PutRows puts each row that does not exist yet, in transactions of up to
// 100 conditional Puts (see putAllIfAbsent): one call per 100 rows rather
// than one per row. BatchWriteItem would be cheaper still but cannot be
// conditional, and a resumed split must never overwrite a row that already
// has its result. Existing rows, results included, are left unchanged.
// Rows whose task does not exist fail with ErrNotFound; rows too large for
// an item go to Options.Overflow (see the package comment), one at a time.
func (s *Store) PutRows(ctx context.Context, rows []store.Row) error {
	if len(rows) == 0 {
		return nil
	}
	first, last := rows[0], rows[len(rows)-1]
	what := fmt.Sprintf("put rows %s/%d..%d", first.TaskID, first.No, last.No)
	items := make([]map[string]types.AttributeValue, len(rows))
	overflow := make([]bool, len(rows))
	for i, r := range rows {
		if err := checkTaskID(r.TaskID); err != nil {
			return fmt.Errorf("%s: row %d: %w", what, r.No, err)
		}
		if err := checkRowNo(r.No); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if r.State != "" && !r.State.Valid() {
			return fmt.Errorf("%s: row %d: invalid state %q", what, r.No, r.State)
		}
		av, err := marshal(rowToItem(r))
		if err != nil {
			return fmt.Errorf("%s: row %d: %w", what, r.No, err)
		}
		if size := itemSize(av); size > s.opts.OverflowAbove {
			if s.opts.Overflow == nil {
				if size > maxItemSize {
					return fmt.Errorf("%s: row %d (sheet row %d) is about %d bytes: %w (limit %d bytes); configure an overflow blob store",
						what, r.No, r.SheetRow, size, ErrItemTooLarge, maxItemSize)
				}
			} else {
				overflow[i] = true
			}
		}
		items[i] = av
	}
	if err := s.stampTaskHorizons(ctx, items, func(i int) string { return rows[i].TaskID }); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var plain []map[string]types.AttributeValue
	var big []int
	for i := range items {
		if overflow[i] {
			big = append(big, i)
		} else {
			plain = append(plain, items[i])
		}
	}
	if err := s.putAllIfAbsent(ctx, plain); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	err := forEach(ctx, len(big), s.opts.WriteConcurrency, func(ctx context.Context, i int) error {
		return s.putOverflowRow(ctx, rows[big[i]], items[big[i]])
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// putOverflowRow stores a row's cells in the overflow blob store and the
// row item with a pointer to them, unless the row exists. The existence
// check comes first so that a resumed split never replaces the cells of a
// stored row; two splits of one task racing past it write the same cells
// (the task ID derives from the source object), so the blob that wins is
// the right one either way.
func (s *Store) putOverflowRow(ctx context.Context, r store.Row, item map[string]types.AttributeValue) error {
	e := newExpr()
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:                aws.String(s.table),
		Key:                      key(taskPK(r.TaskID), rowSK(r.No)),
		ConsistentRead:           aws.Bool(true),
		ProjectionExpression:     aws.String(e.n(attrPK)),
		ExpressionAttributeNames: e.attrNames(),
	})
	if err != nil {
		return fmt.Errorf("row %d: check existing: %w", r.No, err)
	}
	if len(out.Item) > 0 {
		return nil
	}
	cells, err := json.Marshal(r.Values)
	if err != nil {
		return fmt.Errorf("row %d: encode cells: %w", r.No, err)
	}
	ref := overflowKey(r.TaskID, r.No)
	if err := s.opts.Overflow.Put(ctx, ref, bytes.NewReader(cells)); err != nil {
		return fmt.Errorf("row %d: store %d bytes of cells in overflow: %w", r.No, len(cells), err)
	}
	slim := make(map[string]types.AttributeValue, len(item))
	for k, v := range item {
		if k != attrCells {
			slim[k] = v
		}
	}
	slim[attrCellsRef] = &types.AttributeValueMemberS{Value: ref}
	if size := itemSize(slim); size > maxItemSize {
		return fmt.Errorf("row %d: %w even without its cells (about %d bytes)", r.No, ErrItemTooLarge, size)
	}
	if _, err := s.putIfAbsent(ctx, slim); err != nil {
		return fmt.Errorf("row %d: %w", r.No, err)
	}
	return nil
}

// ListRows queries the task's partition for rows FromNo..ToNo, in row
// order, strongly consistent, and resolves cells kept in the overflow
// store.
func (s *Store) ListRows(ctx context.Context, p store.ListRowsParams) ([]store.Row, error) {
	what := "list rows of " + p.TaskID
	from, to := max(p.FromNo, 0), p.ToNo
	if to <= 0 || to > maxRowNo {
		to = maxRowNo
	}
	if from > to {
		return nil, nil
	}
	e := newExpr()
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.table),
		KeyConditionExpression: aws.String(fmt.Sprintf("%s = %s AND %s BETWEEN %s AND %s",
			e.n(attrPK), e.s(taskPK(p.TaskID)), e.n(attrSK), e.s(rowSK(from)), e.s(rowSK(to)))),
		ConsistentRead: aws.Bool(true),
	}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.attrNames(), e.attrValues()
	var out []store.Row
	err := s.queryPages(ctx, in, p.Limit, 0, 10_000, func(item map[string]types.AttributeValue) (bool, error) {
		r, ref, err := rowFromAV(item)
		if err != nil {
			return false, err
		}
		if ref != "" {
			if r.Values, err = s.loadOverflow(ctx, ref); err != nil {
				return false, fmt.Errorf("row %d: %w", r.No, err)
			}
		}
		out = append(out, r)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// loadOverflow reads cells kept in the overflow store.
func (s *Store) loadOverflow(ctx context.Context, ref string) ([]string, error) {
	if s.opts.Overflow == nil {
		return nil, fmt.Errorf("cells are in overflow blob %s, but no overflow store is configured", ref)
	}
	rc, err := s.opts.Overflow.Open(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("open overflow cells: %w", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("read overflow cells %s: %w", ref, err)
	}
	var cells []string
	if err := json.Unmarshal(data, &cells); err != nil {
		return nil, fmt.Errorf("decode overflow cells %s: %w", ref, err)
	}
	return cells, nil
}

// SaveRowResults is one TransactWriteItems: an Update of the batch that
// adds the group's final rows to its saved counts, conditional on the batch
// being RUNNING under p.Attempt, holding every row and not having been told
// its task was cancelled (the fence; an Update costs what a ConditionCheck
// would, and one kind of action keeps the roles' grants to one); an Update per
// row, conditional on the row existing and still being PENDING; and an Update per new cache
// entry that sets its output only if it has none (put-if-absent that
// cannot fail, so a cached key never cancels the group). A batch that
// fails only the cancelled clause is written again without it, and the
// result says TaskCancelled: the cancel flag rides on the flush (see
// TransitionTask) instead of a poll of the task item.
func (s *Store) SaveRowResults(ctx context.Context, p store.SaveRowResultsParams) (store.SaveRowResultsResult, error) {
	what := fmt.Sprintf("save %d row results of batch %s/%d (attempt %d)", len(p.Rows), p.TaskID, p.BatchNo, p.Attempt)
	if err := p.Validate(); err != nil {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: %w", what, err)
	}
	if len(p.Rows) == 0 && len(p.Cache) == 0 {
		return store.SaveRowResultsResult{}, nil
	}
	if err := checkBatchNo(p.BatchNo); err != nil {
		return store.SaveRowResultsResult{}, fmt.Errorf("%s: %w: %w", what, err, store.ErrNotFound)
	}
	lo, hi := maxRowNo, 0
	for _, w := range p.Rows {
		if err := checkRowNo(w.RowNo); err != nil {
			return store.SaveRowResultsResult{}, fmt.Errorf("%s: %w: %w", what, err, store.ErrNotFound)
		}
		lo, hi = min(lo, w.RowNo), max(hi, w.RowNo)
	}
	if len(p.Rows) == 0 {
		lo, hi = 0, 0
	}
	items := make([]types.TransactWriteItem, 0, 1+len(p.Rows)+len(p.Cache))
	items = append(items, types.TransactWriteItem{}) // the batch check, below
	for _, w := range p.Rows {
		items = append(items, types.TransactWriteItem{Update: s.rowResultUpdate(p.TaskID, w, p.Now)})
	}
	seen := make(map[string]bool, len(p.Cache))
	for _, c := range p.Cache {
		if seen[c.Key] {
			continue // one item may appear once in a transaction; the first output stays
		}
		seen[c.Key] = true
		if u := s.cacheUpdate(c); u != nil {
			items = append(items, types.TransactWriteItem{Update: u})
		}
	}
	items[0] = s.batchCheck(p, lo, hi, true)
	err := s.transact(ctx, items)
	reasons, ok := cancelReasons(err)
	if ok && reasonCode(reasons, 0) == reasonCondition && cancelledOnly(reasons[0].Item, p.Attempt, lo, hi) {
		items[0] = s.batchCheck(p, lo, hi, false)
		err = s.transact(ctx, items)
		if err == nil {
			return store.SaveRowResultsResult{TaskCancelled: true}, nil
		}
	}
	if ok && echoOfApplied(reasons, p) {
		return store.SaveRowResultsResult{}, nil
	}
	return store.SaveRowResultsResult{}, saveRowsError(what, p.Rows, err)
}

// echoOfApplied reports whether a cancelled SaveRowResults is the second
// sending of one DynamoDB already applied: the SDK re-sends a transaction
// whose answer was lost (a reset connection, a 500; its idempotency token
// covers that on AWS, not on every emulator), and a caller's retry of a
// save that timed out is a new request with a new token. The batch check
// passed, so the batch is still held
// under this attempt, and every row that failed its condition already
// holds exactly this write (state, output, attempts and this save's
// timestamp). Transactions are all or nothing, so the earlier sending
// wrote the whole group. Without this, the worker took the conflict for a
// newer claim and left a batch nobody held until its lease ran out.
func echoOfApplied(reasons []types.CancellationReason, p store.SaveRowResultsParams) bool {
	if reasonCode(reasons, 0) != reasonNone {
		return false
	}
	echoed := false
	for i, w := range p.Rows {
		switch reasonCode(reasons, 1+i) {
		case reasonNone:
		case reasonCondition:
			var old rowItem
			if err := attributevalue.UnmarshalMap(reasons[1+i].Item, &old); err != nil {
				return false
			}
			r := w.Result
			if old.State != string(r.State) || old.Output != r.Output || old.Attempts != r.Attempts || old.UpdatedAt != encodeTime(p.Now) {
				return false
			}
			echoed = true
		default:
			return false
		}
	}
	return echoed
}

// saveRowsError maps SaveRowResults' transaction outcome to the store's
// errors: which check failed, and whether its item existed.
func saveRowsError(what string, rows []store.RowResultWrite, err error) error {
	if err == nil {
		return nil
	}
	if reasons, ok := cancelReasons(err); ok {
		if reasonCode(reasons, 0) == reasonCondition {
			old := reasons[0].Item
			return fmt.Errorf("%s: %s, not RUNNING under this attempt or not holding the rows: %w",
				what, describeBatch(old), notFoundOrConflict(old))
		}
		for i, w := range rows {
			if reasonCode(reasons, 1+i) != reasonCondition {
				continue
			}
			old := reasons[1+i].Item
			if len(old) == 0 {
				return fmt.Errorf("%s: no such row %d: %w", what, w.RowNo, store.ErrNotFound)
			}
			got := "unknown"
			if state, _ := old[attrState].(*types.AttributeValueMemberS); state != nil {
				got = state.Value
			}
			return fmt.Errorf("%s: row %d is already %s: %w", what, w.RowNo, got, store.ErrConflict)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// batchCheck is the fence of a SaveRowResults group: the batch is RUNNING
// under p.Attempt and holds rows lo..hi (no rows: lo = hi = 0), and, with
// notCancelled, carries no cancel flag. The same action adds the group's
// final rows to the batch's saved counts (zeros included, so that it is an
// Update whatever the group holds).
func (s *Store) batchCheck(p store.SaveRowResultsParams, lo, hi int, notCancelled bool) types.TransactWriteItem {
	e := newExpr()
	cond := heldCondition(e, p.Attempt)
	if hi > 0 {
		cond += fmt.Sprintf(" AND %s <= %s AND %s >= %s", e.n(attrFirstRow), e.i(int64(lo)), e.n(attrLastRow), e.i(int64(hi)))
	}
	if notCancelled {
		cond += fmt.Sprintf(" AND attribute_not_exists(%s)", e.n(attrTaskCancelled))
	}
	u := &update{e: e}
	c := p.Saved()
	for _, f := range savedFields(c) {
		u.addI(f.attr, int64(f.n))
	}
	return types.TransactWriteItem{Update: &types.Update{
		TableName:                           aws.String(s.table),
		Key:                                 key(taskPK(p.TaskID), batchSK(p.BatchNo)),
		ConditionExpression:                 aws.String(cond),
		UpdateExpression:                    aws.String(u.String()),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}
}

// setSaved sets a batch's saved counts to c, removing those that are 0.
func setSaved(u *update, c store.RowCounts) {
	for _, f := range savedFields(c) {
		u.setIOrRemove(f.attr, int64(f.n))
	}
}

// savedFields pairs a batch's saved-count attributes with c's counts.
func savedFields(c store.RowCounts) []struct {
	attr string
	n    int
} {
	return []struct {
		attr string
		n    int
	}{{attrSavedSucceeded, c.Succeeded}, {attrSavedFailed, c.Failed}, {attrSavedSkipped, c.Skipped}}
}

// cancelledOnly reports whether a batch that failed the group's check
// failed only because it carries the cancel flag: it is held under attempt
// and holds rows lo..hi.
func cancelledOnly(old map[string]types.AttributeValue, attempt, lo, hi int) bool {
	if _, ok := old[attrTaskCancelled]; !ok {
		return false
	}
	var it batchItem
	if err := attributevalue.UnmarshalMap(old, &it); err != nil {
		return false
	}
	return it.State == string(store.BatchRunning) && it.Attempt == attempt &&
		(hi == 0 || (it.FirstRow <= lo && it.LastRow >= hi))
}

// rowResultUpdate writes one row's result unless the row is missing or
// already final (SUCCEEDED, FAILED or SKIPPED).
func (s *Store) rowResultUpdate(taskID string, w store.RowResultWrite, now time.Time) *types.Update {
	r := w.Result
	if r.State == "" {
		r.State = store.RowPending
	}
	e := newExpr()
	cond := fmt.Sprintf("attribute_exists(%s) AND (attribute_not_exists(%s) OR %s = %s)",
		e.n(attrPK), e.n(attrState), e.n(attrState), e.s(string(store.RowPending)))
	u := &update{e: e}
	u.setS(attrState, string(r.State))
	u.setOrRemove(attrOutput, r.Output)
	u.setOrRemove(attrError, r.Error)
	u.setOrRemove(attrErrorClass, r.ErrorClass)
	if r.Attempts != 0 {
		u.setI(attrAttempts, int64(r.Attempts))
	} else {
		u.del(attrAttempts)
	}
	if r.LatencyMS != 0 {
		u.setI(attrLatencyMS, r.LatencyMS)
	} else {
		u.del(attrLatencyMS)
	}
	if r.Cached {
		u.set = append(u.set, e.n(attrCached)+" = "+e.v(&types.AttributeValueMemberBOOL{Value: true}))
	} else {
		u.del(attrCached)
	}
	u.setOrRemove(attrProvider, r.Provider)
	u.setIOrRemove(attrInputTokens, r.InputTokens)
	u.setIOrRemove(attrOutputTokens, r.OutputTokens)
	u.setIOrRemove(attrCachedInputTokens, r.CachedInputTokens)
	u.setOrRemove(attrUpdatedAt, encodeTime(now))
	return &types.Update{
		TableName:                           aws.String(s.table),
		Key:                                 key(taskPK(taskID), rowSK(w.RowNo)),
		ConditionExpression:                 aws.String(cond),
		UpdateExpression:                    aws.String(u.String()),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}
