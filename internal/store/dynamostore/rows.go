package dynamostore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
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

// PutRows puts each row that does not exist yet with one conditional
// PutItem (BatchWriteItem cannot be conditional, and a transaction of 100
// conditional puts costs twice the capacity and is cancelled whole by one
// existing row), Options.WriteConcurrency at a time. Existing rows, results
// included, are left unchanged. Rows whose task does not exist fail with
// ErrNotFound; rows too large for an item go to Options.Overflow (see the
// package comment).
func (s *Store) PutRows(ctx context.Context, rows []store.Row) error {
	if len(rows) == 0 {
		return nil
	}
	first, last := rows[0], rows[len(rows)-1]
	what := fmt.Sprintf("put rows %s/%d..%d", first.TaskID, first.No, last.No)
	ids := make([]string, 0, 1)
	items := make([]map[string]types.AttributeValue, len(rows))
	overflow := make([]bool, len(rows))
	for i, r := range rows {
		if err := checkTaskID(r.TaskID); err != nil {
			return fmt.Errorf("%s: row %d: %w", what, r.No, err)
		}
		if err := checkRowNo(r.No); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if r.State != "" && !validRowState(r.State) {
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
		if len(ids) == 0 || ids[len(ids)-1] != r.TaskID {
			ids = append(ids, r.TaskID)
		}
	}
	if err := s.requireTasks(ctx, ids); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	err := forEach(ctx, len(items), s.opts.WriteConcurrency, func(ctx context.Context, i int) error {
		if overflow[i] {
			return s.putOverflowRow(ctx, rows[i], items[i])
		}
		if _, err := s.putIfAbsent(ctx, items[i]); err != nil {
			return fmt.Errorf("row %d: %w", rows[i].No, err)
		}
		return nil
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
	for {
		if p.Limit > 0 {
			in.Limit = aws.Int32(int32(min(p.Limit-len(out), 10_000)))
		}
		page, err := s.db.Query(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		for _, item := range page.Items {
			r, ref, err := rowFromAV(item)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			if ref != "" {
				if r.Values, err = s.loadOverflow(ctx, ref); err != nil {
					return nil, fmt.Errorf("%s: row %d: %w", what, r.No, err)
				}
			}
			out = append(out, r)
		}
		if len(page.LastEvaluatedKey) == 0 || (p.Limit > 0 && len(out) >= p.Limit) {
			return out, nil
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
	}
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

// SaveRowResult is one TransactWriteItems: a ConditionCheck that the batch
// is RUNNING under p.Attempt and holds the row, and the row's update,
// conditional on the row existing and not being SUCCEEDED or SKIPPED.
// A failed batch check is ErrConflict (ErrNotFound for a missing batch); a
// failed row check is ErrConflict (ErrNotFound for a missing row).
func (s *Store) SaveRowResult(ctx context.Context, p store.SaveRowResultParams) error {
	what := fmt.Sprintf("save result of row %s/%d (batch %d, attempt %d)", p.TaskID, p.RowNo, p.BatchNo, p.Attempt)
	r := p.Result
	if r.State == "" {
		r.State = store.RowPending
	}
	if !validRowState(r.State) {
		return fmt.Errorf("%s: invalid state %q", what, r.State)
	}
	if err := errors.Join(checkBatchNo(p.BatchNo), checkRowNo(p.RowNo)); err != nil {
		return fmt.Errorf("%s: %w: %w", what, err, store.ErrNotFound)
	}

	be := newExpr()
	bcond := fmt.Sprintf("%s AND %s <= %s AND %s >= %s", heldCondition(be, p.Attempt),
		be.n(attrFirstRow), be.i(int64(p.RowNo)), be.n(attrLastRow), be.i(int64(p.RowNo)))

	re := newExpr()
	rcond := fmt.Sprintf("attribute_exists(%s) AND (attribute_not_exists(%s) OR NOT %s)",
		re.n(attrPK), re.n(attrState), re.in(attrState, []string{string(store.RowSucceeded), string(store.RowSkipped)}))
	u := &update{e: re}
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
		u.set = append(u.set, re.n(attrCached)+" = "+re.v(&types.AttributeValueMemberBOOL{Value: true}))
	} else {
		u.del(attrCached)
	}
	u.setOrRemove(attrUpdatedAt, encodeTime(p.Now))

	err := s.transact(ctx, []types.TransactWriteItem{
		{ConditionCheck: &types.ConditionCheck{
			TableName:                           aws.String(s.table),
			Key:                                 key(taskPK(p.TaskID), batchSK(p.BatchNo)),
			ConditionExpression:                 aws.String(bcond),
			ExpressionAttributeNames:            be.attrNames(),
			ExpressionAttributeValues:           be.attrValues(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}},
		{Update: &types.Update{
			TableName:                           aws.String(s.table),
			Key:                                 key(taskPK(p.TaskID), rowSK(p.RowNo)),
			ConditionExpression:                 aws.String(rcond),
			UpdateExpression:                    aws.String(u.String()),
			ExpressionAttributeNames:            re.attrNames(),
			ExpressionAttributeValues:           re.attrValues(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}},
	})
	return saveRowError(what, err)
}

// saveRowError maps SaveRowResult's transaction outcome to the store's
// errors: which check failed, and whether its item existed.
func saveRowError(what string, err error) error {
	if err == nil {
		return nil
	}
	if reasons, ok := cancelReasons(err); ok {
		switch {
		case reasonCode(reasons, 0) == reasonCondition:
			old := reasons[0].Item
			return fmt.Errorf("%s: %s, not RUNNING under this attempt or not holding the row: %w",
				what, describeBatch(old), notFoundOrConflict(old))
		case reasonCode(reasons, 1) == reasonCondition:
			old := reasons[1].Item
			if len(old) == 0 {
				return fmt.Errorf("%s: no such row: %w", what, store.ErrNotFound)
			}
			state, _ := old[attrState].(*types.AttributeValueMemberS)
			got := "unknown"
			if state != nil {
				got = state.Value
			}
			return fmt.Errorf("%s: row is already %s: %w", what, got, store.ErrConflict)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}
