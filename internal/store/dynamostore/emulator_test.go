//go:build emulator

package dynamostore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/dynamostore"
	"github.com/batchgen/batchgen/internal/store/storetest"
)

// templatePath is the deployment template the tables are provisioned from.
const templatePath = "../../../template.yaml"

// provision creates the template's resources on the emulator under a
// unique prefix and deletes them when the test ends.
func provision(t *testing.T) (aws.Config, *samstack.Resources) {
	t.Helper()
	cfg, err := samstack.Config(t.Context())
	if err != nil {
		t.Fatalf("emulator: %v", err)
	}
	res, err := samstack.Provision(t.Context(), cfg, templatePath, samstack.UniquePrefix("ddb"))
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		if err := res.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return cfg, res
}

// newStore returns a store on a freshly provisioned table.
func newStore(t *testing.T, opts dynamostore.Options) (*dynamostore.Store, *dynamodb.Client, *samstack.Resources) {
	t.Helper()
	cfg, res := provision(t)
	db := dynamodb.NewFromConfig(cfg)
	return dynamostore.New(db, res.TableName, opts), db, res
}

// overflowStore returns an S3 blob store in the provisioned bucket.
func overflowStore(t *testing.T, res *samstack.Resources) *s3blob.Store {
	t.Helper()
	cfg, err := samstack.Config(t.Context())
	if err != nil {
		t.Fatalf("emulator: %v", err)
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })
	return s3blob.New(client, res.BucketName, s3blob.Options{})
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, _, _ := newStore(t, dynamostore.Options{})
		return s
	})
}

func TestProviderBatchesConformance(t *testing.T) {
	storetest.RunProviderBatches(t, func(t *testing.T) store.ProviderBatches {
		s, _, _ := newStore(t, dynamostore.Options{})
		return s
	})
}

func TestAllowancesConformance(t *testing.T) {
	storetest.RunAllowances(t, func(t *testing.T) store.Allowances {
		s, _, _ := newStore(t, dynamostore.Options{})
		return s
	})
}

func TestCacheTTL(t *testing.T) {
	storetest.RunCacheTTL(t, func(t *testing.T, clk clock.Clock, ttl time.Duration) store.Cache {
		s, _, _ := newStore(t, dynamostore.Options{Clock: clk, CacheTTL: ttl})
		return s
	})
}

func TestCacheConformance(t *testing.T) {
	storetest.RunCache(t, func(t *testing.T) store.Cache {
		s, _, _ := newStore(t, dynamostore.Options{})
		return s
	})
}

var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// createTask creates a running task with the given header.
func createTask(t *testing.T, s store.Store, id string, header []string) store.Task {
	t.Helper()
	task := store.Task{ID: id, State: store.TaskRunning, Header: header, Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 100}, CreatedAt: base, UpdatedAt: base}
	if err := s.CreateTask(t.Context(), task); err != nil {
		t.Fatalf("create task: %v", err)
	}
	return task
}

// bigRow returns a row of 20 columns of 30,000 characters each: about
// 600 KB, over DynamoDB's 400 KB item limit.
func bigRow(taskID string, no int) store.Row {
	values := make([]string, 20)
	for i := range values {
		values[i] = strings.Repeat(string(rune('a'+i)), 30_000)
	}
	return store.Row{TaskID: taskID, No: no, SheetRow: no + 1, Values: values}
}

func TestOverflowRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, res := newStore(t, dynamostore.Options{})
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	blobs := overflowStore(t, res)
	s := dynamostore.New(dynamodb.NewFromConfig(cfg), res.TableName, dynamostore.Options{Overflow: blobs})
	task := createTask(t, s, "overflow", []string{"c"})
	rows := []store.Row{
		{TaskID: task.ID, No: 1, SheetRow: 2, Values: []string{"small"}},
		bigRow(task.ID, 2),
		{TaskID: task.ID, No: 3, SheetRow: 4, Values: []string{"small too"}},
	}
	if err := s.PutRows(ctx, rows); err != nil {
		t.Fatalf("put rows: %v", err)
	}
	// The cells are in S3 under the documented key.
	rc, err := blobs.Open(ctx, "overflow/overflow/2.json")
	if err != nil {
		t.Fatalf("open overflow blob: %v", err)
	}
	rc.Close()

	// A result saved on the big row keeps its cells.
	b := store.Batch{TaskID: task.ID, No: 1, FirstRow: 1, RowCount: 3, CreatedAt: base}
	if err := s.PutBatches(ctx, []store.Batch{b}); err != nil {
		t.Fatalf("put batches: %v", err)
	}
	claimed, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w", Now: base, LeaseUntil: base.Add(time.Minute)})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	result := store.RowResult{State: store.RowSucceeded, Output: "copy", Attempts: 1}
	if _, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: claimed.Attempt,
		Rows: []store.RowResultWrite{{RowNo: 2, Result: result}}, Now: base}); err != nil {
		t.Fatalf("save result: %v", err)
	}
	// Putting the rows again (a resumed split) changes nothing.
	again := bigRow(task.ID, 2)
	again.Values[0] = "changed"
	if err := s.PutRows(ctx, []store.Row{again}); err != nil {
		t.Fatalf("put rows again: %v", err)
	}

	got, err := s.ListRows(ctx, store.ListRowsParams{TaskID: task.ID})
	if err != nil {
		t.Fatalf("list rows: %v", err)
	}
	want := append([]store.Row(nil), rows...)
	for i := range want {
		want[i].State = store.RowPending
	}
	want[1].RowResult = result
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
}

func TestOverflowRowWithoutOverflowStore(t *testing.T) {
	t.Parallel()
	s, _, _ := newStore(t, dynamostore.Options{})
	task := createTask(t, s, "no-overflow", []string{"c"})
	err := s.PutRows(t.Context(), []store.Row{bigRow(task.ID, 7)})
	if !errors.Is(err, dynamostore.ErrItemTooLarge) {
		t.Fatalf("put big row: error = %v, want %v", err, dynamostore.ErrItemTooLarge)
	}
	for _, want := range []string{"row 7", "sheet row 8", "bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	rows, err := s.ListRows(t.Context(), store.ListRowsParams{TaskID: task.ID})
	if err != nil || len(rows) != 0 {
		t.Errorf("after the refused put: rows %v, error %v; want none", rows, err)
	}
}

// TestItemLayout checks the items against the table's design: the sparse
// open-batches index holds exactly the open batches, tasks carry the
// tasks-by-time keys and a TTL once final.
func TestItemLayout(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, db, res := newStore(t, dynamostore.Options{})
	task := createTask(t, s, "layout", []string{"c"})
	if err := s.PutRows(ctx, []store.Row{{TaskID: task.ID, No: 1, SheetRow: 2, Values: []string{"x"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutBatches(ctx, []store.Batch{
		{TaskID: task.ID, No: 1, FirstRow: 1, RowCount: 1, CreatedAt: base},
		{TaskID: task.ID, No: 2, FirstRow: 2, RowCount: 0, CreatedAt: base},
	}); err != nil {
		t.Fatal(err)
	}
	b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w", Now: base, LeaseUntil: base.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 1, Now: base}); err != nil {
		t.Fatal(err)
	}
	finished := base.Add(time.Hour)
	if _, err := s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskRunning}, To: store.TaskSucceeded, Now: finished}); err != nil {
		t.Fatal(err)
	}

	get := func(sk string) map[string]types.AttributeValue {
		t.Helper()
		out, err := db.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: aws.String(res.TableName),
			Key: map[string]types.AttributeValue{
				"PK": &types.AttributeValueMemberS{Value: "TASK#" + task.ID},
				"SK": &types.AttributeValueMemberS{Value: sk},
			},
			ConsistentRead: aws.Bool(true),
		})
		if err != nil || len(out.Item) == 0 {
			t.Fatalf("get item %s: %v (%d attributes)", sk, err, len(out.Item))
		}
		return out.Item
	}
	str := func(item map[string]types.AttributeValue, name string) string {
		if v, ok := item[name].(*types.AttributeValueMemberS); ok {
			return v.Value
		}
		if v, ok := item[name].(*types.AttributeValueMemberN); ok {
			return "N:" + v.Value
		}
		return "<absent>"
	}
	taskItem := get("TASK")
	row := get("ROW#000000001")
	done := get("BATCH#00000001")
	open := get("BATCH#00000002")
	got := map[string]string{
		"task list_pk":     str(taskItem, "list_pk"),
		"task created_at":  str(taskItem, "created_at"),
		"task expires_at":  str(taskItem, "expires_at"),
		"row state":        str(row, "state"),
		"done open_pk":     str(done, "open_pk"),
		"done open_sk":     str(done, "open_sk"),
		"open open_pk":     strings.TrimRight(str(open, "open_pk"), "0123"),
		"open open_sk":     str(open, "open_sk"),
		"open lease_until": str(open, "lease_until"),
	}
	want := map[string]string{
		"task list_pk":     "TASKS",
		"task created_at":  "2025-03-01T12:00:00.000000000Z",
		"task expires_at":  fmt.Sprintf("N:%d", finished.Add(dynamostore.DefaultResultTTL).Unix()),
		"row state":        "PENDING",
		"done open_pk":     "<absent>",
		"done open_sk":     "<absent>",
		"open open_pk":     "OPEN#",
		"open open_sk":     "2025-03-01T12:00:00.000000000Z#" + task.ID + "#00000002",
		"open lease_until": "<absent>",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("item attributes (-want +got):\n%s", d)
	}
}

// TestListOpenBatchesAcrossShards spreads batches with distinct change
// times over the index shards and checks that a limited listing is the
// oldest ones overall, in order: the per-shard queries are merged, not
// concatenated.
func TestListOpenBatchesAcrossShards(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _, _ := newStore(t, dynamostore.Options{})
	task := createTask(t, s, "shards", []string{"c"})
	const n = 24
	var batches []store.Batch
	for no := 1; no <= n; no++ {
		batches = append(batches, store.Batch{TaskID: task.ID, No: no, FirstRow: no, RowCount: 1, CreatedAt: base})
	}
	if err := s.PutBatches(ctx, batches); err != nil {
		t.Fatal(err)
	}
	// Batch no is last changed at base + (n-no) seconds: the highest
	// numbers are the oldest.
	for no := 1; no <= n; no++ {
		at := base.Add(time.Duration(n-no) * time.Second)
		if err := s.TouchBatch(ctx, store.TouchBatchParams{TaskID: task.ID, BatchNo: no, Now: at}); err != nil {
			t.Fatalf("touch %d: %v", no, err)
		}
	}
	got, err := s.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: base.Add(time.Hour), Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	var nos []int
	for _, b := range got {
		nos = append(nos, b.No)
	}
	if d := cmp.Diff([]int{24, 23, 22, 21, 20}, nos); d != "" {
		t.Errorf("oldest open batches (-want +got):\n%s", d)
	}
	all, err := s.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: base.Add(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 10 {
		t.Fatalf("%d batches changed in the first 10 s, want 10", len(all))
	}
	if all[0].No != 24 || all[9].No != 15 {
		t.Errorf("batches changed in the first 10 s run from %d to %d, want 24 to 15", all[0].No, all[9].No)
	}
}

func TestPutRowsUnknownTask(t *testing.T) {
	t.Parallel()
	s, _, _ := newStore(t, dynamostore.Options{})
	err := s.PutRows(t.Context(), []store.Row{{TaskID: "missing", No: 1, Values: []string{"x"}}})
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("put rows of an unknown task: error = %v, want %v", err, store.ErrNotFound)
	}
	err = s.PutBatches(t.Context(), []store.Batch{{TaskID: "missing", No: 1, FirstRow: 1, RowCount: 1}})
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("put batches of an unknown task: error = %v, want %v", err, store.ErrNotFound)
	}
}

// TestEveryItemExpires walks a task through its life and checks that every
// item it leaves in the table carries the TTL attribute: rows (the overflow
// row's pointer item included) and batches expire at the task's horizon,
// the finished task item at FinishedAt + ResultTTL, no later than its rows.
func TestEveryItemExpires(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, res := newStore(t, dynamostore.Options{})
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db := dynamodb.NewFromConfig(cfg)
	s := dynamostore.New(db, res.TableName, dynamostore.Options{Overflow: overflowStore(t, res)})
	task := createTask(t, s, "ttl", make([]string, 20))
	horizon := base.Add(dynamostore.DefaultMaxTaskAge + dynamostore.DefaultResultTTL).Unix()

	small := store.Row{TaskID: task.ID, No: 1, SheetRow: 2, Values: make([]string, 20)}
	if err := s.PutRows(ctx, []store.Row{small, bigRow(task.ID, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutBatches(ctx, []store.Batch{
		{TaskID: task.ID, No: 1, FirstRow: 1, RowCount: 2, CreatedAt: base},
		{TaskID: task.ID, No: 2, FirstRow: 3, RowCount: 0, CreatedAt: base},
	}); err != nil {
		t.Fatal(err)
	}
	b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w", Now: base, LeaseUntil: base.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	ok := store.RowResult{State: store.RowSucceeded, Output: "ok"}
	if _, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt,
		Rows: []store.RowResultWrite{{RowNo: 1, Result: ok}, {RowNo: 2, Result: ok}}, Cache: []store.CacheEntry{{Key: "ttl-riding", Output: "ok"}}, Now: base}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 2, Now: base}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutCached(ctx, "ttl-key", "cached output"); err != nil {
		t.Fatal(err)
	}

	expiry := func() map[string]string {
		t.Helper()
		got := map[string]string{}
		pages := dynamodb.NewScanPaginator(db, &dynamodb.ScanInput{TableName: aws.String(res.TableName), ConsistentRead: aws.Bool(true)})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range page.Items {
				pk := it["PK"].(*types.AttributeValueMemberS).Value
				sk := it["SK"].(*types.AttributeValueMemberS).Value
				name := sk
				if !strings.HasPrefix(pk, "TASK#") {
					name = "cache " + pk
				}
				v, ok := it["expires_at"].(*types.AttributeValueMemberN)
				if !ok {
					got[name] = "<absent>"
					continue
				}
				got[name] = v.Value
			}
		}
		return got
	}
	h := fmt.Sprint(horizon)
	want := map[string]string{
		"TASK": h, "ROW#000000001": h, "ROW#000000002": h, "BATCH#00000001": h, "BATCH#00000002": h,
	}
	got := expiry()
	caches := 0
	for name, v := range got {
		if strings.HasPrefix(name, "cache ") {
			caches++
			if v == "<absent>" {
				t.Errorf("%s has no expires_at", name)
			}
			delete(got, name)
		}
	}
	if caches != 2 {
		t.Errorf("found %d cache items, want 2 (one put, one riding with the row results)", caches)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("expires_at of a running task's items (-want +got):\n%s", d)
	}

	finished := base.Add(2 * time.Hour)
	if _, err := s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskRunning}, To: store.TaskSucceeded, Now: finished}); err != nil {
		t.Fatal(err)
	}
	want["TASK"] = fmt.Sprint(finished.Add(dynamostore.DefaultResultTTL).Unix())
	got = expiry()
	for name := range got {
		if strings.HasPrefix(name, "cache ") {
			delete(got, name)
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("expires_at of a finished task's items (-want +got):\n%s", d)
	}
}

// loseFirstAnswer sends requests on, and drops the answer of the first
// call of operation (an X-Amz-Target suffix such as ".UpdateItem") whose
// body holds marker: DynamoDB applied it, the client sees a reset
// connection and re-sends it, as the SDK does.
type loseFirstAnswer struct {
	next              http.RoundTripper
	operation, marker string
	lost              atomic.Bool
}

func (l *loseFirstAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil && strings.HasSuffix(r.Header.Get("X-Amz-Target"), l.operation) {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := l.next.RoundTrip(r)
	if err == nil && body != nil && bytes.Contains(body, []byte(l.marker)) && l.lost.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return resp, err
}

// losingStore is a store on a fresh table whose client loses the answer
// of the first operation call holding marker (see loseFirstAnswer).
func losingStore(t *testing.T, operation, marker string) (*dynamostore.Store, *loseFirstAnswer) {
	t.Helper()
	cfg, res := provision(t)
	lose := &loseFirstAnswer{next: http.DefaultTransport, operation: operation, marker: marker}
	db := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.HTTPClient = &http.Client{Transport: lose} })
	return dynamostore.New(db, res.TableName, dynamostore.Options{}), lose
}

// TestClaimWhoseAnswerWasLost: a claim DynamoDB applied whose answer was
// lost is re-sent by the SDK and fails its condition; it finds its own
// token and is the claim, once (attempt 1), not a conflict that would
// leave the batch lost until its lease ran out.
func TestClaimWhoseAnswerWasLost(t *testing.T) {
	s, lose := losingStore(t, ".UpdateItem", "claim_token")
	ctx := t.Context()
	task := createTask(t, s, "lost-claim", []string{"c"})
	if err := s.PutBatches(ctx, []store.Batch{{TaskID: task.ID, No: 1, FirstRow: 1, RowCount: 1, CreatedAt: base}}); err != nil {
		t.Fatal(err)
	}
	now := base.Add(time.Hour)
	b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w1", Now: now, LeaseUntil: now.Add(time.Minute)})
	if !lose.lost.Load() {
		t.Fatal("no claim's answer was lost: the test lost nothing")
	}
	if err != nil || b.Attempt != 1 || b.Owner != "w1" || b.State != store.BatchRunning {
		t.Fatalf("claim whose first answer was lost: %+v %v, want attempt 1 held by w1", b, err)
	}
	if _, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w2", Now: now, LeaseUntil: now.Add(time.Minute)}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("another worker's claim of the held batch: %v, want a conflict", err)
	}
}

// TestSaveWhoseAnswerWasLost: a SaveRowResults transaction DynamoDB
// applied whose answer was lost is re-sent and fails on its own rows, now
// final. It is the save, not a conflict: the worker took that for a newer
// claim and abandoned a batch no one held (seen in a clean-clone run as a
// task stuck at 7 of 8 batches).
func TestSaveWhoseAnswerWasLost(t *testing.T) {
	s, lose := losingStore(t, ".TransactWriteItems", "saved_succeeded")
	ctx := t.Context()
	task := createTask(t, s, "lost-save", []string{"c"})
	if err := s.PutBatches(ctx, []store.Batch{{TaskID: task.ID, No: 1, FirstRow: 1, RowCount: 2, CreatedAt: base}}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutRows(ctx, []store.Row{{TaskID: task.ID, No: 1, SheetRow: 2, Values: []string{"a"}}, {TaskID: task.ID, No: 2, SheetRow: 3, Values: []string{"b"}}}); err != nil {
		t.Fatal(err)
	}
	now := base.Add(time.Hour)
	b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w1", Now: now, LeaseUntil: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	save := store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Now: now.Add(time.Second), Rows: []store.RowResultWrite{
		{RowNo: 1, Result: store.RowResult{State: store.RowSucceeded, Output: "one", Attempts: 1}},
		{RowNo: 2, Result: store.RowResult{State: store.RowPending, Error: "try again", Attempts: 1}},
	}}
	if _, err := s.SaveRowResults(ctx, save); err != nil {
		t.Fatalf("save whose first answer was lost: %v, want it saved", err)
	}
	if !lose.lost.Load() {
		t.Fatal("no save's answer was lost: the test lost nothing")
	}
	got, err := s.GetBatch(ctx, task.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Saved.Succeeded != 1 || got.State != store.BatchRunning {
		t.Errorf("batch after the save: %+v, want RUNNING with 1 row saved once", got)
	}
	// A different result on a final row is still a conflict: only an echo
	// of the very write is taken as applied.
	other := save
	other.Rows = []store.RowResultWrite{{RowNo: 1, Result: store.RowResult{State: store.RowSucceeded, Output: "another", Attempts: 1}}}
	if _, err := s.SaveRowResults(ctx, other); !errors.Is(err, store.ErrConflict) {
		t.Errorf("another result for the final row 1: %v, want a conflict", err)
	}
}

// TestFinishWhoseAnswerWasLost: a FinishBatch DynamoDB applied whose answer
// was lost is re-sent and finds its batch DONE. It is the finish, once (the
// task counts the batch and its rows one time), not a conflict that would
// keep the worker from starting the export after the task's last batch.
func TestFinishWhoseAnswerWasLost(t *testing.T) {
	s, lose := losingStore(t, ".TransactWriteItems", "batches_done")
	ctx := t.Context()
	task := createTask(t, s, "lost-finish", []string{"c"})
	if err := s.PutBatches(ctx, []store.Batch{{TaskID: task.ID, No: 1, FirstRow: 1, RowCount: 3, CreatedAt: base}}); err != nil {
		t.Fatal(err)
	}
	now := base.Add(time.Hour)
	b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w1", Now: now, LeaseUntil: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	finish := store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 2, Failed: 1, Now: now.Add(time.Second)}
	got, err := s.FinishBatch(ctx, finish)
	if !lose.lost.Load() {
		t.Fatal("no finish's answer was lost: the test lost nothing")
	}
	if err != nil {
		t.Fatalf("finish whose first answer was lost: %v, want it finished", err)
	}
	if got.BatchesDone != 1 || got.RowsSucceeded != 2 || got.RowsFailed != 1 {
		t.Errorf("task after the finish: %d batches done, %d succeeded, %d failed; want 1, 2, 1 (counted once)",
			got.BatchesDone, got.RowsSucceeded, got.RowsFailed)
	}
	// Another attempt's finish of the DONE batch is still a conflict.
	again := finish
	again.Attempt++
	if _, err := s.FinishBatch(ctx, again); !errors.Is(err, store.ErrConflict) {
		t.Errorf("finish by attempt %d of a batch attempt %d finished: %v, want a conflict", again.Attempt, finish.Attempt, err)
	}
}

// TestEmulatorTransactionsAreAllOrNothing holds the emulator to what the
// store builds on: a transaction one of whose checks fails writes nothing,
// whatever its other items did (an update, a put, a delete), and one whose
// checks all pass writes everything. infra/emulator/moto_server_serialized.py
// gives moto a cheaper rollback than its own; this is that rollback's test.
func TestEmulatorTransactionsAreAllOrNothing(t *testing.T) {
	t.Parallel()
	_, db, res := newStore(t, dynamostore.Options{})
	ctx := t.Context()
	table := aws.String(res.TableName)
	key := func(sk string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"PK": &types.AttributeValueMemberS{Value: "TX#1"}, "SK": &types.AttributeValueMemberS{Value: sk}}
	}
	item := func(sk, v string) map[string]types.AttributeValue {
		it := key(sk)
		it["v"] = &types.AttributeValueMemberS{Value: v}
		return it
	}
	for _, sk := range []string{"a", "d", "e"} {
		if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item(sk, "before")}); err != nil {
			t.Fatal(err)
		}
	}
	writes := func(check string) []types.TransactWriteItem {
		return []types.TransactWriteItem{
			{Update: &types.Update{TableName: table, Key: key("a"), UpdateExpression: aws.String("SET v = :v"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":v": &types.AttributeValueMemberS{Value: "after"}}}},
			{Put: &types.Put{TableName: table, Item: item("c", "after")}},
			{Delete: &types.Delete{TableName: table, Key: key("d")}},
			{ConditionCheck: &types.ConditionCheck{TableName: table, Key: key(check), ConditionExpression: aws.String("attribute_not_exists(PK)")}},
		}
	}
	state := func() map[string]string {
		out, err := db.Query(ctx, &dynamodb.QueryInput{TableName: table, ConsistentRead: aws.Bool(true),
			KeyConditionExpression:    aws.String("PK = :pk"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: "TX#1"}}})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, it := range out.Items {
			got[it["SK"].(*types.AttributeValueMemberS).Value] = it["v"].(*types.AttributeValueMemberS).Value
		}
		return got
	}
	// The check names item e, which exists: the transaction is cancelled.
	_, err := db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: writes("e")})
	var cancelled *types.TransactionCanceledException
	if !errors.As(err, &cancelled) {
		t.Fatalf("TransactWriteItems with a failing check = %v, want TransactionCanceledException", err)
	}
	if diff := cmp.Diff(map[string]string{"a": "before", "d": "before", "e": "before"}, state()); diff != "" {
		t.Fatalf("a cancelled transaction wrote (-want +got):\n%s", diff)
	}
	// The check names item b, which does not exist: everything is written.
	if _, err := db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: writes("b")}); err != nil {
		t.Fatalf("TransactWriteItems: %v", err)
	}
	if diff := cmp.Diff(map[string]string{"a": "after", "c": "after", "e": "before"}, state()); diff != "" {
		t.Fatalf("a transaction that passed (-want +got):\n%s", diff)
	}
}

// TestTransitionWhoseAnswerWasLost: a task transition DynamoDB applied
// whose answer was lost is re-sent by the SDK and fails its condition on
// the state it set itself. It finds its own token and is the transition,
// applied once (a re-export's generation grows by one), not a conflict:
// the caller that marks a task EXPORTING took a conflict for someone
// else's export and started none, leaving the task to the sweeper.
func TestTransitionWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	tests := []struct {
		event   store.TaskEvent
		from    store.TaskState
		wantGen int
	}{
		{store.EventExport, store.TaskRunning, 0},
		{store.EventReexport, store.TaskSucceeded, 1},
	}
	for _, tt := range tests {
		t.Run(string(tt.event), func(t *testing.T) {
			t.Parallel()
			s, lose := losingStore(t, ".UpdateItem", "transition_token")
			ctx := t.Context()
			task := store.Task{ID: "lost-" + string(tt.event), State: tt.from, Header: []string{"c"}, Spec: store.TaskSpec{Prompt: "{{c}}", Provider: "sim", BatchSize: 100}, CreatedAt: base, UpdatedAt: base}
			if err := s.CreateTask(ctx, task); err != nil {
				t.Fatal(err)
			}
			now := base.Add(time.Hour)
			got, err := s.TransitionTask(ctx, tt.event.Params(task.ID, now))
			if !lose.lost.Load() {
				t.Fatal("no transition's answer was lost: the test lost nothing")
			}
			if err != nil || got.State != store.TaskExporting || got.ExportGen != tt.wantGen {
				t.Fatalf("transition whose first answer was lost: %s, export generation %d, %v; want EXPORTING at generation %d", got.State, got.ExportGen, err, tt.wantGen)
			}
			if _, err := s.TransitionTask(ctx, tt.event.Params(task.ID, now.Add(time.Second))); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("another caller's %s of the exporting task: %v, want a conflict", tt.event, err)
			}
		})
	}
}
