package dynamostore

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/store"
)

// Attribute names used in expressions. The item structs below carry the same
// names in their tags.
const (
	attrPK      = "PK"
	attrSK      = "SK"
	attrState   = "state"
	attrAttempt = "attempt"
	attrLease   = "lease_until"
	attrOwner   = "owner"
	// attrClaim is the token of the claim that holds a batch (ClaimBatch).
	attrClaim = "claim_token"
	// attrTransition is the token of a task's last state change
	// (TransitionTask), for the same reason as attrClaim.
	attrTransition = "transition_token"
	attrLastError  = "last_error"
	attrUpdatedAt  = "updated_at"
	attrFinishedAt = "finished_at"
	attrOpenPK     = "open_pk"
	attrOpenSK     = "open_sk"
	attrFirstRow   = "first_row"
	// A batch's saved counts (store.Batch.Saved).
	attrSavedSucceeded = "saved_succeeded"
	attrSavedFailed    = "saved_failed"
	attrSavedSkipped   = "saved_skipped"
	attrLastRow        = "last_row"
	attrError          = "error"
	attrResultKey      = "result_key"
	attrMaxCost        = "max_cost"
	attrMode           = "mode"
	attrSample         = "sample"
	attrDeadline       = "deadline"
	attrExpiresAt      = "expires_at"
	attrListPK         = "list_pk"
	// attrTaskOwner and attrOwnerSK put a task in the tasks-by-owner
	// index. "owner" is taken: a batch's claim holder.
	attrTaskOwner  = "task_owner"
	attrOwnerSK    = "owner_sk"
	attrCreatedAt  = "created_at"
	attrOutput     = "output"
	attrErrorClass = "error_class"
	attrAttempts   = "attempts"
	attrLatencyMS  = "latency_ms"
	attrCached     = "cached"
	attrProvider   = "provider"
	// Token counts, on rows (the call's) and on tasks (the sums).
	attrInputTokens       = "input_tokens"
	attrOutputTokens      = "output_tokens"
	attrCachedInputTokens = "cached_input_tokens"
	attrCells             = "cells"
	attrCellsRef          = "cells_ref"
	// attrTaskCancelled marks the open batches of a cancelled task (see
	// TransitionTask), so their next SaveRowResults reports it.
	attrTaskCancelled = "task_cancelled"

	// usageAttrPrefixes start the names of a task's per-provider token
	// sums: one top-level number attribute per counter and provider label
	// ("input_tokens@openai/gpt-4o-mini"). Top-level, because FinishBatch
	// grows them with ADD, which creates a missing attribute at 0 and adds
	// atomically; a map would need its parent to exist first, an extra
	// write or condition on every first finish.
	usageInPrefix     = "input_tokens@"
	usageOutPrefix    = "output_tokens@"
	usageCachedPrefix = "cached_input_tokens@"

	attrBatchesDone   = "batches_done"
	attrRowsSucceeded = "rows_succeeded"
	attrRowsFailed    = "rows_failed"
	attrRowsSkipped   = "rows_skipped"
	attrExportGen     = "export_gen"
)

// taskItem is a task as stored. The spec is JSON (its optional float
// pointers round-trip exactly, a zero top_p included); times are
// timeLayout strings.
type taskItem struct {
	PK        string `dynamodbav:"PK"`
	SK        string `dynamodbav:"SK"`
	ID        string `dynamodbav:"id"`
	State     string `dynamodbav:"state"`
	Spec      string `dynamodbav:"spec"`
	Source    string `dynamodbav:"source,omitempty"`
	Sheet     string `dynamodbav:"sheet,omitempty"`
	Encoding  string `dynamodbav:"encoding,omitempty"`
	Delimiter string `dynamodbav:"delimiter,omitempty"`
	// Rerun is store.RerunCounts as JSON; absent for a task not made of a
	// result sent back in.
	Rerun         string   `dynamodbav:"rerun,omitempty"`
	Header        []string `dynamodbav:"header,omitempty"`
	RowsTotal     int      `dynamodbav:"rows_total"`
	BatchesTotal  int      `dynamodbav:"batches_total"`
	BatchesDone   int      `dynamodbav:"batches_done"`
	RowsSucceeded int      `dynamodbav:"rows_succeeded"`
	RowsFailed    int      `dynamodbav:"rows_failed"`
	RowsSkipped   int      `dynamodbav:"rows_skipped"`
	ResultKey     string   `dynamodbav:"result_key,omitempty"`
	Error         string   `dynamodbav:"error,omitempty"`
	ExportGen     int      `dynamodbav:"export_gen,omitempty"`
	// MaxCost is store.Task.MaxCost; absent for none.
	MaxCost float64 `dynamodbav:"max_cost,omitempty"`
	// Mode and Deadline are store.Task.Mode and Deadline (RFC 3339);
	// absent for online and none.
	Mode     string `dynamodbav:"mode,omitempty"`
	Deadline string `dynamodbav:"deadline,omitempty"`
	// Sample is store.Task.Sample; absent for none.
	Sample int `dynamodbav:"sample,omitempty"`
	// Token sums of the task's finished batches.
	InputTokens       int64 `dynamodbav:"input_tokens,omitempty"`
	OutputTokens      int64 `dynamodbav:"output_tokens,omitempty"`
	CachedInputTokens int64 `dynamodbav:"cached_input_tokens,omitempty"`
	// CreatedAt is also the sort key of the tasks-by-time index, so it is
	// always present.
	CreatedAt  string `dynamodbav:"created_at"`
	UpdatedAt  string `dynamodbav:"updated_at,omitempty"`
	FinishedAt string `dynamodbav:"finished_at,omitempty"`
	// ListPK puts the task in the tasks-by-time index.
	ListPK string `dynamodbav:"list_pk"`
	// Owner and OwnerSK (created_at#id, so equal times still sort) put the
	// task in the tasks-by-owner index; a task without an owner is not in
	// it.
	Owner   string `dynamodbav:"task_owner,omitempty"`
	OwnerSK string `dynamodbav:"owner_sk,omitempty"`
	// ExpiresAt is the TTL (epoch seconds): the task's horizon until it
	// reaches a final state, then FinishedAt + ResultTTL.
	ExpiresAt int64 `dynamodbav:"expires_at,omitempty"`
}

// batchItem is a batch as stored. LastRow (FirstRow+RowCount-1) lets
// SaveRowResults' condition check that a row belongs to the batch without
// arithmetic, which condition expressions lack.
type batchItem struct {
	PK         string `dynamodbav:"PK"`
	SK         string `dynamodbav:"SK"`
	TaskID     string `dynamodbav:"task_id"`
	No         int    `dynamodbav:"no"`
	FirstRow   int    `dynamodbav:"first_row"`
	RowCount   int    `dynamodbav:"row_count"`
	LastRow    int    `dynamodbav:"last_row"`
	State      string `dynamodbav:"state"`
	Attempt    int    `dynamodbav:"attempt"`
	LeaseUntil string `dynamodbav:"lease_until,omitempty"`
	Owner      string `dynamodbav:"owner,omitempty"`
	LastError  string `dynamodbav:"last_error,omitempty"`
	CreatedAt  string `dynamodbav:"created_at,omitempty"`
	UpdatedAt  string `dynamodbav:"updated_at,omitempty"`
	// Saved* are store.Batch.Saved, absent when 0.
	SavedSucceeded int `dynamodbav:"saved_succeeded,omitempty"`
	SavedFailed    int `dynamodbav:"saved_failed,omitempty"`
	SavedSkipped   int `dynamodbav:"saved_skipped,omitempty"`
	// OpenPK and OpenSK put a batch that is not DONE in the sparse
	// open-batches index; FinishBatch removes them.
	OpenPK string `dynamodbav:"open_pk,omitempty"`
	OpenSK string `dynamodbav:"open_sk,omitempty"`
	// ExpiresAt is the TTL (epoch seconds): the task's horizon.
	ExpiresAt int64 `dynamodbav:"expires_at,omitempty"`
}

// rowItem is a row as stored. The task ID is the partition key's. Values
// too large for the item live in the overflow blob store under CellsRef.
type rowItem struct {
	PK         string   `dynamodbav:"PK"`
	SK         string   `dynamodbav:"SK"`
	No         int      `dynamodbav:"no"`
	SheetRow   int      `dynamodbav:"sheet_row"`
	Cells      []string `dynamodbav:"cells,omitempty"`
	CellsRef   string   `dynamodbav:"cells_ref,omitempty"`
	State      string   `dynamodbav:"state"`
	Output     string   `dynamodbav:"output,omitempty"`
	Error      string   `dynamodbav:"error,omitempty"`
	ErrorClass string   `dynamodbav:"error_class,omitempty"`
	Attempts   int      `dynamodbav:"attempts,omitempty"`
	LatencyMS  int64    `dynamodbav:"latency_ms,omitempty"`
	Cached     bool     `dynamodbav:"cached,omitempty"`
	Fresh      bool     `dynamodbav:"fresh,omitempty"`
	Provider   string   `dynamodbav:"provider,omitempty"`
	// The tokens of the call that produced the result.
	InputTokens       int64  `dynamodbav:"input_tokens,omitempty"`
	OutputTokens      int64  `dynamodbav:"output_tokens,omitempty"`
	CachedInputTokens int64  `dynamodbav:"cached_input_tokens,omitempty"`
	UpdatedAt         string `dynamodbav:"updated_at,omitempty"`
	// ExpiresAt is the TTL (epoch seconds): the task's horizon.
	ExpiresAt int64 `dynamodbav:"expires_at,omitempty"`
}

// cacheItem is one result cache entry.
type cacheItem struct {
	PK        string `dynamodbav:"PK"`
	SK        string `dynamodbav:"SK"`
	Output    string `dynamodbav:"output"`
	CreatedAt string `dynamodbav:"created_at,omitempty"`
	ExpiresAt int64  `dynamodbav:"expires_at,omitempty"`
}

// key returns the primary key attributes.
func key(pk, sk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrPK: &types.AttributeValueMemberS{Value: pk},
		attrSK: &types.AttributeValueMemberS{Value: sk},
	}
}

// marshal encodes an item struct.
func marshal(v any) (map[string]types.AttributeValue, error) {
	av, err := attributevalue.MarshalMap(v)
	if err != nil {
		return nil, fmt.Errorf("encode item: %w", err)
	}
	return av, nil
}

// taskToItem encodes a task for PutItem.
func taskToItem(t store.Task) (taskItem, error) {
	spec, err := json.Marshal(t.Spec)
	if err != nil {
		return taskItem{}, fmt.Errorf("encode spec: %w", err)
	}
	var rerun []byte
	if t.Rerun != nil {
		if rerun, err = json.Marshal(t.Rerun); err != nil {
			return taskItem{}, fmt.Errorf("encode rerun counts: %w", err)
		}
	}
	return taskItem{
		Rerun:             string(rerun),
		PK:                taskPK(t.ID),
		SK:                taskSK,
		ID:                t.ID,
		State:             string(t.State),
		Spec:              string(spec),
		Source:            t.Source,
		Sheet:             t.Sheet,
		Encoding:          t.Encoding,
		Delimiter:         t.Delimiter,
		Header:            t.Header,
		RowsTotal:         t.RowsTotal,
		BatchesTotal:      t.BatchesTotal,
		BatchesDone:       t.BatchesDone,
		RowsSucceeded:     t.RowsSucceeded,
		RowsFailed:        t.RowsFailed,
		RowsSkipped:       t.RowsSkipped,
		ResultKey:         t.ResultKey,
		Error:             t.Error,
		ExportGen:         t.ExportGen,
		MaxCost:           t.MaxCost,
		Sample:            t.Sample,
		Mode:              string(t.Mode),
		Deadline:          encodeTime(t.Deadline),
		InputTokens:       t.Usage.InputTokens,
		OutputTokens:      t.Usage.OutputTokens,
		CachedInputTokens: t.Usage.CachedInputTokens,
		CreatedAt:         sortTime(t.CreatedAt),
		UpdatedAt:         encodeTime(t.UpdatedAt),
		FinishedAt:        encodeTime(t.FinishedAt),
		ListPK:            listPK,
		Owner:             t.Owner,
		OwnerSK:           ownerSK(t.Owner, t.Cursor()),
	}, nil
}

// usageAttrs returns the attribute names and values of u's counters for
// provider label, leaving out zero counters (absent numbers read as 0).
func usageAttrs(label string, u store.Usage) map[string]int64 {
	out := map[string]int64{}
	for name, n := range map[string]int64{
		usageInPrefix + label:     u.InputTokens,
		usageOutPrefix + label:    u.OutputTokens,
		usageCachedPrefix + label: u.CachedInputTokens,
	} {
		if n != 0 {
			out[name] = n
		}
	}
	return out
}

// usageAttrNames returns the names every counter of label would have, to
// remove them.
func usageAttrNames(label string) []string {
	return []string{usageInPrefix + label, usageOutPrefix + label, usageCachedPrefix + label}
}

// putUsage adds a task's per-provider sums to its item.
func putUsage(av map[string]types.AttributeValue, byProvider map[string]store.Usage) {
	for label, u := range byProvider {
		for name, n := range usageAttrs(label, u) {
			av[name] = &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
		}
	}
}

// usageFromAV reads a task item's per-provider sums; nil when it has none.
func usageFromAV(av map[string]types.AttributeValue) (map[string]store.Usage, error) {
	var out map[string]store.Usage
	for name, v := range av {
		var label string
		var field func(*store.Usage) *int64
		switch {
		case strings.HasPrefix(name, usageInPrefix):
			label, field = strings.TrimPrefix(name, usageInPrefix), func(u *store.Usage) *int64 { return &u.InputTokens }
		case strings.HasPrefix(name, usageOutPrefix):
			label, field = strings.TrimPrefix(name, usageOutPrefix), func(u *store.Usage) *int64 { return &u.OutputTokens }
		case strings.HasPrefix(name, usageCachedPrefix):
			label, field = strings.TrimPrefix(name, usageCachedPrefix), func(u *store.Usage) *int64 { return &u.CachedInputTokens }
		default:
			continue
		}
		num, ok := v.(*types.AttributeValueMemberN)
		if !ok {
			return nil, fmt.Errorf("attribute %q: want a number, got %T", name, v)
		}
		n, err := strconv.ParseInt(num.Value, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", name, err)
		}
		if out == nil {
			out = map[string]store.Usage{}
		}
		u := out[label]
		*field(&u) = n
		out[label] = u
	}
	for label, u := range out {
		if u == (store.Usage{}) {
			delete(out, label) // counters added as 0: no tokens
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// taskFromAV decodes a task item.
func taskFromAV(av map[string]types.AttributeValue) (store.Task, error) {
	var it taskItem
	if err := attributevalue.UnmarshalMap(av, &it); err != nil {
		return store.Task{}, fmt.Errorf("decode task item: %w", err)
	}
	t := store.Task{
		ID:            it.ID,
		State:         store.TaskState(it.State),
		Source:        it.Source,
		Sheet:         it.Sheet,
		Encoding:      it.Encoding,
		Delimiter:     it.Delimiter,
		Header:        it.Header,
		RowsTotal:     it.RowsTotal,
		BatchesTotal:  it.BatchesTotal,
		BatchesDone:   it.BatchesDone,
		RowsSucceeded: it.RowsSucceeded,
		RowsFailed:    it.RowsFailed,
		RowsSkipped:   it.RowsSkipped,
		ResultKey:     it.ResultKey,
		Error:         it.Error,
		ExportGen:     it.ExportGen,
		Owner:         it.Owner,
		Usage:         store.Usage{InputTokens: it.InputTokens, OutputTokens: it.OutputTokens, CachedInputTokens: it.CachedInputTokens},
	}
	if err := json.Unmarshal([]byte(it.Spec), &t.Spec); err != nil {
		return store.Task{}, fmt.Errorf("decode spec of task %s: %w", it.ID, err)
	}
	t.Terms = store.Terms{MaxCost: it.MaxCost, Mode: store.Mode(it.Mode), Sample: it.Sample}
	deadline, derr := decodeTime(it.Deadline)
	if derr != nil {
		return store.Task{}, fmt.Errorf("decode deadline of task %s: %w", it.ID, derr)
	}
	t.Deadline = deadline
	if it.Rerun != "" {
		if err := json.Unmarshal([]byte(it.Rerun), &t.Rerun); err != nil {
			return store.Task{}, fmt.Errorf("decode rerun counts of task %s: %w", it.ID, err)
		}
	}
	var err error
	if t.UsageByProvider, err = usageFromAV(av); err != nil {
		return store.Task{}, fmt.Errorf("decode usage by provider of task %s: %w", it.ID, err)
	}
	var errs [3]error
	t.CreatedAt, errs[0] = decodeTime(it.CreatedAt)
	t.UpdatedAt, errs[1] = decodeTime(it.UpdatedAt)
	t.FinishedAt, errs[2] = decodeTime(it.FinishedAt)
	if err := errors.Join(errs[:]...); err != nil {
		return store.Task{}, fmt.Errorf("decode task %s: %w", it.ID, err)
	}
	return t, nil
}

// batchToItem encodes a new batch: PENDING, never claimed, in the open
// index.
func batchToItem(b store.Batch) batchItem {
	updated := b.UpdatedAt
	if updated.IsZero() {
		updated = b.CreatedAt
	}
	return batchItem{
		PK:        taskPK(b.TaskID),
		SK:        batchSK(b.No),
		TaskID:    b.TaskID,
		No:        b.No,
		FirstRow:  b.FirstRow,
		RowCount:  b.RowCount,
		LastRow:   b.FirstRow + b.RowCount - 1,
		State:     string(store.BatchPending),
		CreatedAt: encodeTime(b.CreatedAt),
		UpdatedAt: encodeTime(updated),
		OpenPK:    openShard(b.TaskID, b.No),
		OpenSK:    openSK(updated, b.TaskID, b.No),

		SavedSucceeded: b.Saved.Succeeded,
		SavedFailed:    b.Saved.Failed,
		SavedSkipped:   b.Saved.Skipped,
	}
}

// batchFromAV decodes a batch item.
func batchFromAV(av map[string]types.AttributeValue) (store.Batch, error) {
	var it batchItem
	if err := attributevalue.UnmarshalMap(av, &it); err != nil {
		return store.Batch{}, fmt.Errorf("decode batch item: %w", err)
	}
	b := store.Batch{
		TaskID:    it.TaskID,
		No:        it.No,
		FirstRow:  it.FirstRow,
		RowCount:  it.RowCount,
		State:     store.BatchState(it.State),
		Attempt:   it.Attempt,
		Owner:     it.Owner,
		LastError: it.LastError,
		Saved:     store.RowCounts{Succeeded: it.SavedSucceeded, Failed: it.SavedFailed, Skipped: it.SavedSkipped},
	}
	var errs [3]error
	b.LeaseUntil, errs[0] = decodeTime(it.LeaseUntil)
	b.CreatedAt, errs[1] = decodeTime(it.CreatedAt)
	b.UpdatedAt, errs[2] = decodeTime(it.UpdatedAt)
	if err := errors.Join(errs[:]...); err != nil {
		return store.Batch{}, fmt.Errorf("decode batch %s/%d: %w", it.TaskID, it.No, err)
	}
	return b, nil
}

// rowToItem encodes a new row; a row without a state is PENDING.
func rowToItem(r store.Row) rowItem {
	state := r.State
	if state == "" {
		state = store.RowPending
	}
	return rowItem{
		PK:                taskPK(r.TaskID),
		SK:                rowSK(r.No),
		No:                r.No,
		SheetRow:          r.SheetRow,
		Cells:             r.Values,
		State:             string(state),
		Output:            r.Output,
		Error:             r.Error,
		ErrorClass:        r.ErrorClass,
		Attempts:          r.Attempts,
		LatencyMS:         r.LatencyMS,
		Cached:            r.Cached,
		Fresh:             r.Fresh,
		Provider:          r.Provider,
		InputTokens:       r.InputTokens,
		OutputTokens:      r.OutputTokens,
		CachedInputTokens: r.CachedInputTokens,
	}
}

// rowFromAV decodes a row item. A row whose cells are in the overflow store
// comes back with nil Values and the blob key in ref.
func rowFromAV(av map[string]types.AttributeValue) (r store.Row, ref string, err error) {
	var it rowItem
	if err := attributevalue.UnmarshalMap(av, &it); err != nil {
		return store.Row{}, "", fmt.Errorf("decode row item: %w", err)
	}
	taskID, err := taskIDOf(it.PK)
	if err != nil {
		return store.Row{}, "", fmt.Errorf("decode row %d: %w", it.No, err)
	}
	return store.Row{
		TaskID:   taskID,
		No:       it.No,
		SheetRow: it.SheetRow,
		Values:   it.Cells,
		Fresh:    it.Fresh,
		RowResult: store.RowResult{
			State:      store.RowState(it.State),
			Output:     it.Output,
			Error:      it.Error,
			ErrorClass: it.ErrorClass,
			Attempts:   it.Attempts,
			LatencyMS:  it.LatencyMS,
			Cached:     it.Cached,
			Provider:   it.Provider,
			Usage:      store.Usage{InputTokens: it.InputTokens, OutputTokens: it.OutputTokens, CachedInputTokens: it.CachedInputTokens},
		},
	}, it.CellsRef, nil
}

// maxItemSize is DynamoDB's item size limit: 400 KB, counted in binary
// kilobytes (409,600 bytes), attribute names included.
const maxItemSize = 400 << 10

// itemSize estimates an item's size the way DynamoDB bills and limits it:
// attribute names plus values, strings as UTF-8 bytes, numbers at their
// largest encoding (21 bytes), lists and maps with 3 bytes of overhead plus
// 1 per element. The estimate errs on the large side, so an item it accepts
// is accepted by DynamoDB.
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return 21
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += 1 + len(k) + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberSS:
		n := 0
		for _, e := range v.Value {
			n += len(e)
		}
		return n
	case *types.AttributeValueMemberNS:
		return 21 * len(v.Value)
	case *types.AttributeValueMemberBS:
		n := 0
		for _, e := range v.Value {
			n += len(e)
		}
		return n
	}
	return 0
}
