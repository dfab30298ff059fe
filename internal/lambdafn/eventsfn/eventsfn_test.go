package eventsfn_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/lambdafn/eventsfn"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

const taskID = "0123456789abcdef0123456789abcdef"

var now = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

// request is the recorded Function URL event of GET
// /api/tasks/{taskID}/events.
func request(t *testing.T) *events.LambdaFunctionURLRequest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "function-url-get-events.json"))
	if err != nil {
		t.Fatal(err)
	}
	var req events.LambdaFunctionURLRequest
	if err := json.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	return &req
}

type fixture struct {
	store *sqlitestore.Store
	clock *clock.Fake
	cfg   api.Config
}

// newFixture stores a RUNNING task of owner "alice" with two batches of
// two rows.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlitestore.Open(filepath.Join(dir, "db.sqlite"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := fileblob.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.CreateTask(ctx, store.Task{
		ID: taskID, State: store.TaskRunning, Source: "a.csv", Header: []string{"a"}, RowsTotal: 4, BatchesTotal: 2, Owner: "alice",
		Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 2}, CreatedAt: now, UpdatedAt: now,
	}); err != nil {
		t.Fatal(err)
	}
	var rows []store.Row
	for no := 1; no <= 4; no++ {
		rows = append(rows, store.Row{TaskID: taskID, No: no, SheetRow: no + 1, Values: []string{"x"}})
	}
	if err := st.PutRows(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := st.PutBatches(ctx, []store.Batch{{TaskID: taskID, No: 1, FirstRow: 1, RowCount: 2, CreatedAt: now}, {TaskID: taskID, No: 2, FirstRow: 3, RowCount: 2, CreatedAt: now}}); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(now)
	return &fixture{store: st, clock: clk, cfg: api.Config{Store: st, Blobs: blobs, Clock: clk, Auth: api.Fixed("alice")}}
}

func (f *fixture) finishBatch(t *testing.T, no int) {
	t.Helper()
	ctx := context.Background()
	b, err := f.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: taskID, BatchNo: no, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var rows []store.RowResultWrite
	for r := b.FirstRow; r < b.FirstRow+b.RowCount; r++ {
		rows = append(rows, store.RowResultWrite{RowNo: r, Result: store.RowResult{State: store.RowSucceeded, Output: "y", Attempts: 1}})
	}
	if _, err := f.store.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: taskID, BatchNo: no, Attempt: b.Attempt, Rows: rows, Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.FinishBatch(ctx, store.FinishBatchParams{TaskID: taskID, BatchNo: no, Attempt: b.Attempt, Succeeded: b.RowCount, Now: now}); err != nil {
		t.Fatal(err)
	}
}

// tick waits until the stream waits on the clock, then moves it on.
func (f *fixture) tick(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.clock.Waiters() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stream never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
	f.clock.Advance(time.Second)
}

// nextEvent reads the stream up to the next event and returns its name
// and data.
func nextEvent(t *testing.T, body *bufio.Reader) (string, api.TaskEvent) {
	t.Helper()
	type result struct {
		name string
		ev   api.TaskEvent
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		for {
			line, err := body.ReadString('\n')
			if err != nil {
				r.err = err
				ch <- r
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "event: "):
				r.name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				r.err = json.Unmarshal([]byte(line[len("data: "):]), &r.ev)
			case line == "" && r.name != "":
				ch <- r
				return
			}
		}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("read the stream: %v", r.err)
		}
		return r.name, r.ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return "", api.TaskEvent{}
}

// TestStreamThroughFunctionURL runs the event stream through the Function
// URL adapter (lambdaurl) as the events Lambda does: the response starts
// with its status and headers while the task runs, each event reaches the
// body as it is written (the progress event is read while the handler is
// still running, before the task finishes), and the body ends after the
// done event.
func TestStreamThroughFunctionURL(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := &eventsfn.Handler{Handler: api.NewEvents(f.cfg)}
	resp, err := h.Handle(context.Background(), request(t))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Headers["Content-Type"], "text/event-stream") {
		t.Fatalf("response %d %v, want 200 text/event-stream", resp.StatusCode, resp.Headers)
	}
	body := bufio.NewReader(resp.Body)
	if name, ev := nextEvent(t, body); name != "snapshot" || ev.RowsDone != 0 || ev.Status != "RUNNING" {
		t.Fatalf("first event %s %+v, want a snapshot of the running task", name, ev)
	}
	f.finishBatch(t, 1)
	f.tick(t)
	if name, ev := nextEvent(t, body); name != "progress" || ev.RowsDone != 2 || ev.Status != "RUNNING" {
		t.Fatalf("after a batch: %s %+v, want progress with 2 rows done while running", name, ev)
	}
	f.finishBatch(t, 2)
	for _, step := range [][2]store.TaskState{{store.TaskRunning, store.TaskExporting}, {store.TaskExporting, store.TaskSucceeded}} {
		if _, err := f.store.TransitionTask(context.Background(), store.TransitionTaskParams{ID: taskID, From: []store.TaskState{step[0]}, To: step[1], ResultKey: "results/" + taskID + ".xlsx", Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	f.tick(t)
	if name, ev := nextEvent(t, body); name != "done" || ev.RowsDone != 4 || ev.ResultURL != "/api/tasks/"+taskID+"/result" {
		t.Fatalf("at the end: %s %+v, want done with the result link", name, ev)
	}
	if rest, err := io.ReadAll(body); err != nil || len(rest) != 0 {
		t.Errorf("after done: %q, %v; want the end of the body", rest, err)
	}
}

// TestFunctionURLIsolationAndErrors: through the adapter, another
// principal's task is a JSON 404 (as every API route answers it), a
// request without valid credentials is 401, any other path is 404 (the
// Function URL serves the event stream only), and an event that is no
// HTTP request is a JSON 400, not a failed invocation.
func TestFunctionURLIsolationAndErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	call := func(auth api.Authenticator, edit func(*events.LambdaFunctionURLRequest)) (int, string) {
		t.Helper()
		cfg := f.cfg
		cfg.Auth = auth
		req := request(t)
		if edit != nil {
			edit(req)
		}
		resp, err := (&eventsfn.Handler{Handler: api.NewEvents(cfg)}).Handle(context.Background(), req)
		if err != nil {
			t.Fatalf("Handle: %v", err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := call(api.Fixed("mallory"), nil); code != http.StatusNotFound || !strings.Contains(body, `"not_found"`) {
		t.Errorf("another principal: %d %s, want a JSON 404", code, body)
	}
	deny := api.AuthenticatorFunc(func(*http.Request) (string, error) { return "", api.ErrUnauthenticated })
	if code, body := call(deny, nil); code != http.StatusUnauthorized || !strings.Contains(body, `"unauthenticated"`) {
		t.Errorf("a bad token: %d %s, want a JSON 401", code, body)
	}
	if code, _ := call(api.Fixed("alice"), func(r *events.LambdaFunctionURLRequest) {
		r.RawPath = "/api/tasks/" + taskID
		r.RequestContext.HTTP.Path = r.RawPath
	}); code != http.StatusNotFound {
		t.Errorf("GET /api/tasks/{id} on the events function: %d, want 404", code)
	}
	if code, body := call(api.Fixed("alice"), func(r *events.LambdaFunctionURLRequest) {
		r.RequestContext.HTTP.Method = "BAD METHOD"
	}); code != http.StatusBadRequest || !strings.Contains(body, `"bad_request"`) {
		t.Errorf("a malformed event: %d %s, want a JSON 400", code, body)
	}
}
