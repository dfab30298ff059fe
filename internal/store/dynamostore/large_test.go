package dynamostore

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/batchgen/batchgen/internal/store"
)

// fakeTable is an in-process stand-in for DynamoDB that serves exactly the
// calls PutRows and ListRows make (GetItem, conditional PutItem,
// TransactWriteItems of conditional puts, Query on the primary key with
// BETWEEN), with DynamoDB's 1 MB page limit, so that a
// 200,000-row sheet can be pushed through the adapter's real request code
// in seconds. The emulator suite checks semantics against moto; this checks
// scale: chunking, bounded concurrency and paging. Items are kept as raw
// JSON, sorted by sort key per partition.
type fakeTable struct {
	mu       sync.Mutex
	parts    map[string]*fakePartition
	inFlight atomic.Int64
	peak     atomic.Int64
	puts     atomic.Int64
	txs      atomic.Int64 // TransactWriteItems calls
	txItems  atomic.Int64 // puts inside them
	queries  atomic.Int64
}

// fakePartition holds one partition's items in sort key order.
type fakePartition struct {
	sks   []string
	items map[string]json.RawMessage
}

func newFakeTable() *fakeTable { return &fakeTable{parts: map[string]*fakePartition{}} }

// attrS is a string attribute in DynamoDB JSON.
type attrS struct {
	S string `json:"S"`
}

// keyAttrs decodes the primary key of an item or key.
type keyAttrs struct {
	PK attrS `json:"PK"`
	SK attrS `json:"SK"`
}

// fakeRequest holds the request fields the fake reads.
type fakeRequest struct {
	Key                       keyAttrs         `json:"Key"`
	Item                      json.RawMessage  `json:"Item"`
	ConditionExpression       string           `json:"ConditionExpression"`
	KeyConditionExpression    string           `json:"KeyConditionExpression"`
	ExpressionAttributeValues map[string]attrS `json:"ExpressionAttributeValues"`
	ExclusiveStartKey         *keyAttrs        `json:"ExclusiveStartKey"`
	Limit                     int              `json:"Limit"`
	TransactItems             []struct {
		Put *struct {
			Item                json.RawMessage `json:"Item"`
			ConditionExpression string          `json:"ConditionExpression"`
		} `json:"Put"`
	} `json:"TransactItems"`
}

// fail writes a DynamoDB error response.
func fail(w http.ResponseWriter, typ, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(http.StatusBadRequest)
	json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.dynamodb.v20120810#" + typ, "message": msg})
}

func (f *fakeTable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
	var req fakeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fail(w, "ValidationException", err.Error())
		return
	}
	var resp any
	switch op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810."); op {
	case "GetItem":
		f.mu.Lock()
		var item json.RawMessage
		if p := f.parts[req.Key.PK.S]; p != nil {
			item = p.items[req.Key.SK.S]
		}
		f.mu.Unlock()
		resp = map[string]any{}
		if item != nil {
			resp = map[string]any{"Item": item}
		}
	case "PutItem":
		f.puts.Add(1)
		var k keyAttrs
		if err := json.Unmarshal(req.Item, &k); err != nil {
			fail(w, "ValidationException", err.Error())
			return
		}
		if !f.put(k, req.Item, req.ConditionExpression != "") {
			fail(w, "ConditionalCheckFailedException", "The conditional request failed")
			return
		}
		resp = map[string]any{}
	case "TransactWriteItems":
		f.txs.Add(1)
		var ok bool
		if resp, ok = f.transact(w, req); !ok {
			return
		}
	case "Query":
		f.queries.Add(1)
		var err error
		if resp, err = f.query(req); err != nil {
			fail(w, "ValidationException", err.Error())
			return
		}
	default:
		fail(w, "UnknownOperationException", op)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	json.NewEncoder(w).Encode(resp)
}

// transact serves a transaction of puts, all or nothing: when a
// conditional put finds its key taken, nothing is written and the answer is
// DynamoDB's TransactionCanceledException with one reason per item. It
// reports whether it answered with success (resp) rather than an error.
func (f *fakeTable) transact(w http.ResponseWriter, req fakeRequest) (any, bool) {
	keys := make([]keyAttrs, len(req.TransactItems))
	for i, it := range req.TransactItems {
		if it.Put == nil {
			fail(w, "ValidationException", "the fake serves transactions of puts only")
			return nil, false
		}
		if err := json.Unmarshal(it.Put.Item, &keys[i]); err != nil {
			fail(w, "ValidationException", err.Error())
			return nil, false
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	reasons := make([]map[string]string, len(keys))
	cancelled := false
	for i, k := range keys {
		reasons[i] = map[string]string{"Code": "None"}
		if p := f.parts[k.PK.S]; p != nil && req.TransactItems[i].Put.ConditionExpression != "" {
			if _, exists := p.items[k.SK.S]; exists {
				reasons[i] = map[string]string{"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"}
				cancelled = true
			}
		}
	}
	if cancelled {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]any{
			"__type":              "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
			"message":             "Transaction cancelled, please refer cancellation reasons for specific reasons",
			"CancellationReasons": reasons,
		})
		return nil, false
	}
	for i, k := range keys {
		f.putLocked(k, req.TransactItems[i].Put.Item, false)
	}
	f.txItems.Add(int64(len(keys)))
	return map[string]any{}, true
}

// put stores item unless conditional and its key exists; it reports
// whether it stored.
func (f *fakeTable) put(k keyAttrs, item json.RawMessage, conditional bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.putLocked(k, item, conditional)
}

// putLocked is put with f.mu held.
func (f *fakeTable) putLocked(k keyAttrs, item json.RawMessage, conditional bool) bool {
	p := f.parts[k.PK.S]
	if p == nil {
		p = &fakePartition{items: map[string]json.RawMessage{}}
		f.parts[k.PK.S] = p
	}
	if _, exists := p.items[k.SK.S]; exists {
		if conditional {
			return false
		}
	} else {
		i, _ := slices.BinarySearch(p.sks, k.SK.S)
		p.sks = slices.Insert(p.sks, i, k.SK.S)
	}
	p.items[k.SK.S] = item
	return true
}

// query serves "#pk = :pk AND #sk BETWEEN :lo AND :hi", ascending, after
// ExclusiveStartKey, up to Limit items or 1 MB.
func (f *fakeTable) query(req fakeRequest) (any, error) {
	var pkName, pkVal, skName, lo, hi string
	if _, err := fmt.Sscanf(req.KeyConditionExpression, "%s = %s AND %s BETWEEN %s AND %s", &pkName, &pkVal, &skName, &lo, &hi); err != nil {
		return nil, fmt.Errorf("unsupported key condition %q: %w", req.KeyConditionExpression, err)
	}
	vals := req.ExpressionAttributeValues
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]any{"Items": []json.RawMessage{}, "Count": 0}
	p := f.parts[vals[pkVal].S]
	if p == nil {
		return out, nil
	}
	i, _ := slices.BinarySearch(p.sks, vals[lo].S)
	if req.ExclusiveStartKey != nil {
		j, found := slices.BinarySearch(p.sks, req.ExclusiveStartKey.SK.S)
		if found {
			j++
		}
		i = max(i, j)
	}
	var items []json.RawMessage
	size := 0
	for ; i < len(p.sks) && p.sks[i] <= vals[hi].S; i++ {
		if (req.Limit > 0 && len(items) == req.Limit) || size > 1<<20 {
			last := p.sks[i-1]
			out["LastEvaluatedKey"] = keyAttrs{PK: attrS{vals[pkVal].S}, SK: attrS{last}}
			break
		}
		size += len(p.items[p.sks[i]])
		items = append(items, p.items[p.sks[i]])
	}
	out["Items"], out["Count"] = items, len(items)
	return out, nil
}

// fakeStore returns a Store whose client talks to a fakeTable.
func fakeStore(t *testing.T, opts Options) (*Store, *fakeTable) {
	t.Helper()
	f := newFakeTable()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
	})
	return New(client, "fake", opts), f
}

// TestPutRowsLarge pushes a 200,000-row sheet through PutRows in the
// splitter's chunks of 500 and reads it back the way the export does, in
// pages. Under the race detector it checks 20,000 rows.
func TestPutRowsLarge(t *testing.T) {
	n := 200_000
	if raceEnabled {
		n = 20_000
	}
	s, f := fakeStore(t, Options{WriteConcurrency: 8})
	ctx := t.Context()
	if err := s.CreateTask(ctx, store.Task{ID: "big", State: store.TaskRunning, CreatedAt: time.Now()}); err != nil {
		t.Fatalf("create task: %v", err)
	}

	start := time.Now()
	const chunk = 500
	for from := 1; from <= n; from += chunk {
		rows := make([]store.Row, 0, chunk)
		for no := from; no < from+chunk && no <= n; no++ {
			rows = append(rows, store.Row{TaskID: "big", No: no, SheetRow: no + 1, Values: []string{fmt.Sprintf("product %d", no), "toys", "9.99"}})
		}
		if err := s.PutRows(ctx, rows); err != nil {
			t.Fatalf("put rows %d..: %v", from, err)
		}
	}
	t.Logf("PutRows of %d rows: %v, %d transactions, peak %d in flight", n, time.Since(start), f.txs.Load(), f.peak.Load())
	if got := f.txItems.Load(); got != int64(n) {
		t.Errorf("%d rows put in transactions, want every row (%d)", got, n)
	}
	// Small rows: full transactions of maxTxItems, never a call per row.
	if got, want := f.txs.Load(), int64((n+maxTxItems-1)/maxTxItems); got != want {
		t.Errorf("%d TransactWriteItems calls for %d rows, want %d (%d rows each)", got, n, want, maxTxItems)
	}
	if got := f.puts.Load(); got != 1 {
		t.Errorf("%d PutItem calls, want 1 (the task): rows go in transactions", got)
	}
	if p := f.peak.Load(); p < 2 || p > 8 {
		t.Errorf("peak of %d requests in flight, want parallel calls bounded by WriteConcurrency (2..8)", p)
	}

	// Page through like the export: FromNo and a Limit per call.
	start = time.Now()
	next, pages := 1, 0
	for {
		rows, err := s.ListRows(ctx, store.ListRowsParams{TaskID: "big", FromNo: next, Limit: 5000})
		if err != nil {
			t.Fatalf("list rows from %d: %v", next, err)
		}
		if len(rows) == 0 {
			break
		}
		pages++
		for _, r := range rows {
			if r.No != next || r.Values[0] != fmt.Sprintf("product %d", next) || r.State != store.RowPending {
				t.Fatalf("row %+v, want row %d, PENDING", r, next)
			}
			next++
		}
	}
	t.Logf("ListRows of %d rows: %v in %d pages, %d Query calls", n, time.Since(start), pages, f.queries.Load())
	if next != n+1 {
		t.Errorf("listed rows 1..%d, want 1..%d", next-1, n)
	}

	// One call for everything follows DynamoDB's 1 MB pages.
	f.queries.Store(0)
	all, err := s.ListRows(ctx, store.ListRowsParams{TaskID: "big"})
	if err != nil || len(all) != n || all[n-1].No != n {
		t.Fatalf("list all rows: %d rows, %v; want %d", len(all), err, n)
	}
	if q := f.queries.Load(); q < 2 {
		t.Errorf("listing %d rows took %d Query calls; want the 1 MB pages followed", n, q)
	}
}
