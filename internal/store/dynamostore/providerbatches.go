package dynamostore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/store"
)

// The journal of an economy task's provider batches: one item per entry,
// under the task's partition,
//
//	PK=TASK#<id>  SK=PBATCH#<submitted>#<key>#<0 intent|1 job or gone|2 ended>#<job>#<part, 4 digits>
//
// sorted as ListProviderBatches returns them. A batch of many lines (up to
// 100,000 ids of about 30 bytes) passes DynamoDB's 400 KB item: its ids are
// split over parts of journalPartLines, written last part first, with
// part 0 (which carries the count) last, so that an entry is read only
// when all its parts were written. Items are written with UpdateItem, the
// generator's grant.
const (
	journalPrefix    = "PBATCH#"
	journalPartLines = 8000
	attrJournalKey   = "pkey"
	attrJournalKind  = "kind"
	attrJournalJob   = "job"
	attrJournalLines = "lines"
	attrJournalParts = "parts"
	attrJournalAt    = "submitted"
)

var _ store.ProviderBatches = (*Store)(nil)

// journalSK is the sort key of part n of entry e.
func journalSK(e store.ProviderBatch, n int) string {
	order := map[string]string{"intent": "0", "job": "1", "gone": "1", "ended": "2"}[e.Kind()]
	return fmt.Sprintf("%s%s#%s#%s#%s#%04d", journalPrefix, encodeTime(e.Submitted), e.Key, order, e.Job, n)
}

// RecordProviderBatch implements store.ProviderBatches.
func (s *Store) RecordProviderBatch(ctx context.Context, taskID string, e store.ProviderBatch) error {
	parts := max(1, (len(e.Lines)+journalPartLines-1)/journalPartLines)
	for n := parts - 1; n >= 0; n-- {
		ex := newExpr()
		u := &update{e: ex}
		part := e.Lines[min(n*journalPartLines, len(e.Lines)):min((n+1)*journalPartLines, len(e.Lines))]
		if len(part) > 0 {
			l := make([]types.AttributeValue, len(part))
			for i, id := range part {
				l[i] = &types.AttributeValueMemberS{Value: id}
			}
			u.set = append(u.set, ex.n(attrJournalLines)+" = "+ex.v(&types.AttributeValueMemberL{Value: l}))
		}
		if n == 0 {
			u.setOrRemove(attrJournalKey, e.Key)
			u.setS(attrJournalKind, e.Kind())
			u.setOrRemove(attrJournalJob, e.Job)
			u.setS(attrJournalAt, encodeTime(e.Submitted))
			u.setI(attrJournalParts, int64(parts))
		}
		if len(u.set) == 0 {
			continue
		}
		_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(s.table), Key: key(taskPK(taskID), journalSK(e, n)),
			UpdateExpression: aws.String(u.String()), ExpressionAttributeNames: ex.attrNames(), ExpressionAttributeValues: ex.attrValues(),
		})
		if err != nil {
			return fmt.Errorf("record provider batch %s of task %s (part %d of %d): %w", e.Key, taskID, n+1, parts, err)
		}
	}
	return nil
}

// ListProviderBatches implements store.ProviderBatches. An entry whose
// part 0 is missing, or whose parts are fewer than it counts (a write cut
// short), is left out: as if it had not been recorded.
func (s *Store) ListProviderBatches(ctx context.Context, taskID string) ([]store.ProviderBatch, error) {
	ex := newExpr()
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.table),
		KeyConditionExpression: aws.String(fmt.Sprintf("%s = %s AND begins_with(%s, %s)",
			ex.n(attrPK), ex.s(taskPK(taskID)), ex.n(attrSK), ex.s(journalPrefix))),
		ConsistentRead: aws.Bool(true),
	}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = ex.attrNames(), ex.attrValues()
	var out []store.ProviderBatch
	var cur *store.ProviderBatch
	var curEntry string
	partsWant, partsGot := 0, 0
	flush := func() {
		if cur != nil && partsGot == partsWant {
			out = append(out, *cur)
		}
		cur, partsWant, partsGot = nil, 0, 0
	}
	err := s.queryPages(ctx, in, 0, 0, 0, func(item map[string]types.AttributeValue) (bool, error) {
		sk := stringAttr(item, attrSK)
		cut := strings.LastIndexByte(sk, '#')
		entry, part := sk[:max(cut, 0)], sk[cut+1:]
		n, err := strconv.Atoi(part)
		if cut < 0 || err != nil {
			return false, fmt.Errorf("provider batch item %s: not a journal key", sk)
		}
		if entry != curEntry {
			flush()
			curEntry = entry
			if n != 0 {
				return true, nil // part 0 was never written: no entry
			}
			submitted, err := decodeTime(stringAttr(item, attrJournalAt))
			if err != nil {
				return false, fmt.Errorf("provider batch item %s: %w", sk, err)
			}
			kind := stringAttr(item, attrJournalKind)
			cur = &store.ProviderBatch{Key: stringAttr(item, attrJournalKey), Job: stringAttr(item, attrJournalJob),
				Intent: kind == "intent", Gone: kind == "gone", Ended: kind == "ended", Submitted: submitted}
			p, _ := item[attrJournalParts].(*types.AttributeValueMemberN)
			if p != nil {
				partsWant, _ = strconv.Atoi(p.Value)
			}
		}
		if cur == nil {
			return true, nil
		}
		partsGot++
		if l, ok := item[attrJournalLines].(*types.AttributeValueMemberL); ok {
			for _, v := range l.Value {
				if id, ok := v.(*types.AttributeValueMemberS); ok {
					cur.Lines = append(cur.Lines, id.Value)
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list provider batches of task %s: %w", taskID, err)
	}
	flush()
	return out, nil
}

// stringAttr is item's string attribute name, "" when it has none.
func stringAttr(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}
