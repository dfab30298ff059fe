package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/store"
)

var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

func TestTaskItemRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		task store.Task
	}{
		{"every field", store.Task{
			ID: "t1", State: store.TaskPartial,
			Spec: store.TaskSpec{Prompt: "为{{名}}写文案", System: "s", Provider: "openai", Model: "m",
				Temperature: ptr(0.7), TopP: ptr(0.0), MaxTokens: 256, BatchSize: 50},
			Source: "incoming/商品.xlsx", Sheet: "Sheet1", Header: []string{"名", "", "价格"},
			RowsTotal: 5000, BatchesTotal: 100, BatchesDone: 99, RowsSucceeded: 4900, RowsFailed: 90, RowsSkipped: 10,
			ResultKey: "results/t1.xlsx", Error: "row 17: content filter",
			CreatedAt: base.Add(123456789), UpdatedAt: base.Add(time.Minute), FinishedAt: base.Add(time.Hour),
		}},
		{"minimal", store.Task{ID: "t2", State: store.TaskPending, Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 100}}},
		{"routed over providers", store.Task{ID: "t3", State: store.TaskSucceeded, Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "route", BatchSize: 100},
			Usage: store.Usage{InputTokens: 3_000_000_100, OutputTokens: 75, CachedInputTokens: 1024},
			UsageByProvider: map[string]store.Usage{
				// Labels with the characters providers' names and models
				// have, and the unlabelled rows' "".
				"bedrock/us.anthropic.claude-3-haiku-20240307-v1:0": {InputTokens: 3_000_000_000, OutputTokens: 50, CachedInputTokens: 1024},
				"openai@eu": {OutputTokens: 25},
				"":          {InputTokens: 100},
			}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			it, err := taskToItem(tt.task)
			if err != nil {
				t.Fatal(err)
			}
			av, err := marshal(it)
			if err != nil {
				t.Fatal(err)
			}
			putUsage(av, tt.task.UsageByProvider)
			if s, ok := av[attrListPK].(*types.AttributeValueMemberS); !ok || s.Value != listPK {
				t.Errorf("list_pk = %#v, want %q (the tasks-by-time index key)", av[attrListPK], listPK)
			}
			if _, ok := av[attrCreatedAt].(*types.AttributeValueMemberS); !ok {
				t.Errorf("created_at = %#v, want a string (the index sort key) even for a zero time", av[attrCreatedAt])
			}
			got, err := taskFromAV(av)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.task, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("round trip (-want +got):\n%s", d)
			}
		})
	}
}

func TestBatchItem(t *testing.T) {
	b := store.Batch{TaskID: "t", No: 3, FirstRow: 201, RowCount: 100, State: store.BatchDone, Attempt: 9, CreatedAt: base}
	it := batchToItem(b)
	// A new batch is PENDING, never claimed, changed when created, open,
	// and knows its last row for SaveRowResults' condition.
	want := batchItem{
		PK: "TASK#t", SK: "BATCH#00000003", TaskID: "t", No: 3, FirstRow: 201, RowCount: 100, LastRow: 300,
		State: "PENDING", CreatedAt: encodeTime(base), UpdatedAt: encodeTime(base),
		OpenPK: openShard("t", 3), OpenSK: openSK(base, "t", 3),
	}
	if d := cmp.Diff(want, it); d != "" {
		t.Errorf("batch item (-want +got):\n%s", d)
	}
	av, err := marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	for _, absent := range []string{attrLease, attrOwner, attrLastError} {
		if _, ok := av[absent]; ok {
			t.Errorf("new batch item has %s; empty attributes must be left out", absent)
		}
	}
	got, err := batchFromAV(av)
	if err != nil {
		t.Fatal(err)
	}
	wantBatch := store.Batch{TaskID: "t", No: 3, FirstRow: 201, RowCount: 100, State: store.BatchPending, CreatedAt: base, UpdatedAt: base}
	if d := cmp.Diff(wantBatch, got); d != "" {
		t.Errorf("decoded batch (-want +got):\n%s", d)
	}
}

func TestRowItem(t *testing.T) {
	rows := []store.Row{
		{TaskID: "t", No: 1, SheetRow: 2, Values: []string{"积木", "", "a \"q\"\nline"}},
		{TaskID: "t", No: 2, SheetRow: 3, Values: []string{"x"}, RowResult: store.RowResult{
			State: store.RowFailed, Output: "o", Error: "e", ErrorClass: "permanent", Attempts: 2, LatencyMS: 300, Cached: true}},
	}
	for _, r := range rows {
		t.Run(fmt.Sprint(r.No), func(t *testing.T) {
			av, err := marshal(rowToItem(r))
			if err != nil {
				t.Fatal(err)
			}
			got, ref, err := rowFromAV(av)
			if err != nil || ref != "" {
				t.Fatalf("rowFromAV = ref %q, %v", ref, err)
			}
			want := r
			if want.State == "" {
				want.State = store.RowPending
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("round trip (-want +got):\n%s", d)
			}
		})
	}
	t.Run("overflow pointer", func(t *testing.T) {
		av, err := marshal(rowItem{PK: "TASK#t", SK: rowSK(5), No: 5, CellsRef: "overflow/t/5.json", State: "PENDING"})
		if err != nil {
			t.Fatal(err)
		}
		got, ref, err := rowFromAV(av)
		if err != nil || ref != "overflow/t/5.json" || got.Values != nil || got.TaskID != "t" {
			t.Errorf("rowFromAV = %+v, ref %q, %v; want task t, no values, the ref", got, ref, err)
		}
	})
}

func TestItemSize(t *testing.T) {
	tests := []struct {
		name string
		item map[string]types.AttributeValue
		want int
	}{
		{"string", map[string]types.AttributeValue{"ab": &types.AttributeValueMemberS{Value: "héllo"}}, 2 + 6},
		{"number at its largest", map[string]types.AttributeValue{"n": &types.AttributeValueMemberN{Value: "1"}}, 1 + 21},
		{"bool", map[string]types.AttributeValue{"b": &types.AttributeValueMemberBOOL{Value: true}}, 1 + 1},
		{"list", map[string]types.AttributeValue{"l": &types.AttributeValueMemberL{Value: []types.AttributeValue{
			&types.AttributeValueMemberS{Value: "abc"}, &types.AttributeValueMemberS{Value: ""},
		}}}, 1 + 3 + (1 + 3) + (1 + 0)},
		{"map", map[string]types.AttributeValue{"m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			"k": &types.AttributeValueMemberS{Value: "v"},
		}}}, 1 + 3 + (1 + 1 + 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := itemSize(tt.item); got != tt.want {
				t.Errorf("itemSize = %d, want %d", got, tt.want)
			}
		})
	}
	t.Run("20 columns of 30000 characters exceed the item limit", func(t *testing.T) {
		values := make([]string, 20)
		for i := range values {
			values[i] = strings.Repeat("x", 30_000)
		}
		av, err := marshal(rowToItem(store.Row{TaskID: "t", No: 1, Values: values}))
		if err != nil {
			t.Fatal(err)
		}
		if n := itemSize(av); n <= maxItemSize || n > 610_000 {
			t.Errorf("itemSize = %d, want just over 600,000 (more than %d)", n, maxItemSize)
		}
	})
}

// reason returns a cancellation reason with code and, when old is
// non-nil, the item as it was.
func reason(code string, old map[string]types.AttributeValue) types.CancellationReason {
	return types.CancellationReason{Code: aws.String(code), Item: old}
}

// cancelled returns a TransactionCanceledException with reasons.
func cancelled(reasons ...types.CancellationReason) error {
	return fmt.Errorf("operation error: %w", &types.TransactionCanceledException{Message: aws.String("cancelled"), CancellationReasons: reasons})
}

func TestSaveRowsError(t *testing.T) {
	batch, err := marshal(batchItem{TaskID: "t", No: 1, State: "RUNNING", Attempt: 2, Owner: "w2"})
	if err != nil {
		t.Fatal(err)
	}
	row := map[string]types.AttributeValue{attrState: &types.AttributeValueMemberS{Value: "SUCCEEDED"}}
	tests := []struct {
		name     string
		err      error
		want     error
		contains string
	}{
		{"saved", nil, nil, ""},
		{"fenced", cancelled(reason("ConditionalCheckFailed", batch), reason("None", nil)), store.ErrConflict, `attempt 2 by "w2"`},
		{"no batch", cancelled(reason("ConditionalCheckFailed", nil), reason("None", nil)), store.ErrNotFound, "no such batch"},
		{"row final", cancelled(reason("None", nil), reason("None", nil), reason("ConditionalCheckFailed", row)), store.ErrConflict, "row 8 is already SUCCEEDED"},
		{"no row", cancelled(reason("None", nil), reason("ConditionalCheckFailed", nil), reason("None", nil)), store.ErrNotFound, "no such row 7"},
		{"other", errors.New("network"), nil, "network"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := saveRowsError("save", []store.RowResultWrite{{RowNo: 7}, {RowNo: 8}}, tt.err)
			if tt.err == nil {
				if got != nil {
					t.Fatalf("saveRowsError(nil) = %v", got)
				}
				return
			}
			if tt.want != nil && !errors.Is(got, tt.want) {
				t.Errorf("saveRowsError = %v, want %v", got, tt.want)
			}
			if tt.want == nil && (errors.Is(got, store.ErrConflict) || errors.Is(got, store.ErrNotFound)) {
				t.Errorf("saveRowsError = %v, want neither sentinel", got)
			}
			if !strings.Contains(got.Error(), tt.contains) {
				t.Errorf("saveRowsError = %q, want it to mention %q", got, tt.contains)
			}
		})
	}
}

func TestConditionFailed(t *testing.T) {
	old := map[string]types.AttributeValue{"PK": &types.AttributeValueMemberS{Value: "x"}}
	got, ok := conditionFailed(fmt.Errorf("op: %w", &types.ConditionalCheckFailedException{Item: old}))
	if !ok || len(got) != 1 || !errors.Is(notFoundOrConflict(got), store.ErrConflict) {
		t.Errorf("conditionFailed with an old item = %v, %v", got, ok)
	}
	got, ok = conditionFailed(&types.ConditionalCheckFailedException{})
	if !ok || !errors.Is(notFoundOrConflict(got), store.ErrNotFound) {
		t.Errorf("conditionFailed without an old item = %v, %v; want not found", got, ok)
	}
	if _, ok := conditionFailed(errors.New("other")); ok {
		t.Error("conditionFailed(other) = true")
	}
}

func TestForEach(t *testing.T) {
	t.Run("all, bounded", func(t *testing.T) {
		var inFlight, peak atomic.Int64
		var mu sync.Mutex
		seen := map[int]bool{}
		started, release := make(chan struct{}, 100), make(chan struct{})
		go func() {
			// Hold the first four until all four are in, so the peak shows
			// the bound; then let everything run.
			for range 4 {
				<-started
			}
			close(release)
		}()
		err := forEach(t.Context(), 100, 4, func(ctx context.Context, i int) error {
			n := inFlight.Add(1)
			started <- struct{}{}
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-release
			mu.Lock()
			seen[i] = true
			mu.Unlock()
			inFlight.Add(-1)
			return nil
		})
		if err != nil || len(seen) != 100 || peak.Load() != 4 {
			t.Errorf("forEach = %v, saw %d items, peak %d in flight; want nil, 100, 4", err, len(seen), peak.Load())
		}
	})
	t.Run("first error stops", func(t *testing.T) {
		boom := errors.New("boom")
		var calls atomic.Int64
		err := forEach(t.Context(), 10_000, 2, func(ctx context.Context, i int) error {
			calls.Add(1)
			if i == 3 {
				return boom
			}
			return nil
		})
		if !errors.Is(err, boom) || calls.Load() > 100 {
			t.Errorf("forEach = %v after %d calls; want boom, soon", err, calls.Load())
		}
	})
	t.Run("none", func(t *testing.T) {
		if err := forEach(t.Context(), 0, 4, func(context.Context, int) error { return errors.New("called") }); err != nil {
			t.Errorf("forEach of nothing = %v", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := forEach(ctx, 1000, 2, func(ctx context.Context, i int) error { return ctx.Err() })
		if !errors.Is(err, context.Canceled) {
			t.Errorf("forEach on a cancelled context = %v", err)
		}
	})
}

func TestUsageFromAVRefusesBadCounters(t *testing.T) {
	tests := []struct {
		name string
		av   map[string]types.AttributeValue
	}{
		{"a string", map[string]types.AttributeValue{usageInPrefix + "a": &types.AttributeValueMemberS{Value: "12"}}},
		{"not an integer", map[string]types.AttributeValue{usageOutPrefix + "a": &types.AttributeValueMemberN{Value: "1.5"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, err := usageFromAV(tt.av); err == nil {
				t.Errorf("usageFromAV = %v, want an error", got)
			} else if !strings.Contains(err.Error(), "_tokens@a") {
				t.Errorf("error %q does not name the attribute", err)
			}
		})
	}
}
