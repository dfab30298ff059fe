package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/store"
)

// sseEvent is one event (or comment) read from a stream.
type sseEvent struct {
	Name, ID string
	Data     api.TaskEvent
	Comment  string
	// Retry is set on the block that only gives the reconnection delay.
	Retry bool
}

// readEvents parses a text/event-stream body into events on a channel,
// closed at the end of the stream.
func readEvents(t *testing.T, body *bufio.Reader) <-chan sseEvent {
	t.Helper()
	ch := make(chan sseEvent, 16)
	go func() {
		defer close(ch)
		var ev sseEvent
		data, any := "", false
		for {
			line, err := body.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "":
				if any {
					if data != "" {
						if err := json.Unmarshal([]byte(data), &ev.Data); err != nil {
							t.Errorf("event data is not JSON: %v: %q", err, data)
						}
					}
					ch <- ev
				}
				ev, data, any = sseEvent{}, "", false
			case strings.HasPrefix(line, ":"):
				ev.Comment, any = strings.TrimSpace(line[1:]), true
			case strings.HasPrefix(line, "event: "):
				ev.Name, any = line[len("event: "):], true
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[len("id: "):]
			case strings.HasPrefix(line, "data: "):
				data += line[len("data: "):]
			case strings.HasPrefix(line, "retry: "):
				ev.Retry, any = true, true
			}
		}
	}()
	return ch
}

// openStream GETs a task's events with an optional Last-Event-ID.
func openStream(t *testing.T, url, lastID string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// nextEvent waits for the stream's next event.
func nextEvent(t *testing.T, ch <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the stream ended")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return sseEvent{}
}

// runningTask stores a RUNNING task of `batches` batches of two rows.
func runningTask(t *testing.T, st store.Store, id string, batches int) {
	t.Helper()
	ctx := context.Background()
	if err := st.CreateTask(ctx, store.Task{
		ID: id, State: store.TaskRunning, Source: "a.csv", Header: []string{"a"}, RowsTotal: 2 * batches, BatchesTotal: batches,
		Owner: "local", Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 2}, CreatedAt: now, UpdatedAt: now,
	}); err != nil {
		t.Fatal(err)
	}
	var rows []store.Row
	var bs []store.Batch
	for no := 1; no <= batches; no++ {
		bs = append(bs, store.Batch{TaskID: id, No: no, FirstRow: 2*no - 1, RowCount: 2, CreatedAt: now})
		for r := 2*no - 1; r <= 2*no; r++ {
			rows = append(rows, store.Row{TaskID: id, No: r, SheetRow: r + 1, Values: []string{"x"}})
		}
	}
	if err := st.PutRows(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := st.PutBatches(ctx, bs); err != nil {
		t.Fatal(err)
	}
}

// finishBatch answers both rows of a batch and finishes it, as a worker
// does.
func finishBatch(t *testing.T, st store.Store, id string, no int) {
	t.Helper()
	ctx := context.Background()
	b, err := st.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: no, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var rows []store.RowResultWrite
	for r := b.FirstRow; r < b.FirstRow+b.RowCount; r++ {
		rows = append(rows, store.RowResultWrite{RowNo: r, Result: store.RowResult{State: store.RowSucceeded, Output: "y", Attempts: 1}})
	}
	if _, err := st.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: id, BatchNo: no, Attempt: b.Attempt, Rows: rows, Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishBatch(ctx, store.FinishBatchParams{TaskID: id, BatchNo: no, Attempt: b.Attempt, Succeeded: b.RowCount, Now: now}); err != nil {
		t.Fatal(err)
	}
}

// tick waits until the stream waits on the clock, then moves it on.
func tick(t *testing.T, clk *clock.Fake, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for clk.Waiters() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stream never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
	clk.Advance(d)
}

// TestTaskEvents follows a task's event stream while its batches finish: a
// snapshot on connect, one progress event per interval however many
// changes it saw (with rate and ETA), a heartbeat comment when nothing
// changed for the heartbeat interval, and a done event with the result
// link, after which the stream ends; a reconnect with the done event's id
// gets 204, one with an older id gets the done event at once, and one with
// the current id gets no snapshot.
func TestTaskEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	clk := clock.NewFake(now)
	f.config.Clock = clk
	// The stream's requests carry no token: one principal, the task's owner.
	f.config.Auth = api.Fixed("local")
	srv := httptest.NewServer(api.New(f.config))
	t.Cleanup(srv.Close)
	const id = "0123456789abcdef0123456789abcdef"
	runningTask(t, f.store, id, 3)
	url := srv.URL + "/api/tasks/" + id + "/events"

	resp := openStream(t, url, "")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
		t.Fatalf("GET events: %d %q, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := readEvents(t, bufio.NewReader(resp.Body))
	type brief struct {
		Name          string
		State         string
		Done, Total   int
		HasRate       bool
		HasETA        bool
		ResultURL     string
		HeartbeatOnly bool
	}
	briefOf := func(ev sseEvent) brief {
		if ev.Retry {
			return brief{Name: "retry"}
		}
		if ev.Comment != "" && ev.Name == "" {
			return brief{HeartbeatOnly: true}
		}
		return brief{Name: ev.Name, State: ev.Data.Status, Done: ev.Data.RowsDone, Total: ev.Data.RowsTotal,
			HasRate: ev.Data.RatePerSecond > 0, HasETA: ev.Data.ETASeconds != nil, ResultURL: ev.Data.ResultURL}
	}
	// The reconnection hint comes first.
	if ev := nextEvent(t, events); !ev.Retry {
		t.Fatalf("first block = %+v, want the retry hint", ev)
	}
	snap := nextEvent(t, events)
	if diff := cmp.Diff(brief{Name: "snapshot", State: "RUNNING", Total: 6}, briefOf(snap)); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}

	// Two batches finish within one interval: one progress event.
	finishBatch(t, f.store, id, 1)
	finishBatch(t, f.store, id, 2)
	tick(t, clk, time.Second)
	progress := nextEvent(t, events)
	if diff := cmp.Diff(brief{Name: "progress", State: "RUNNING", Done: 4, Total: 6, HasRate: true, HasETA: true}, briefOf(progress)); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
	if got := progress.Data.RatePerSecond; got != 4 {
		t.Errorf("rate = %v rows/s, want 4 (4 rows in the 1s between the reads)", got)
	}
	if got := *progress.Data.ETASeconds; got != 0.5 {
		t.Errorf("ETA = %vs, want 0.5 (2 rows left at 4 rows/s)", got)
	}

	// Nothing changes for 15 one-second intervals: a heartbeat, no event.
	for range 15 {
		tick(t, clk, time.Second)
	}
	if diff := cmp.Diff(brief{HeartbeatOnly: true}, briefOf(nextEvent(t, events))); diff != "" {
		t.Errorf("after 15 quiet seconds (-want +got):\n%s", diff)
	}

	// A client that reconnects with the id of the current state gets no
	// snapshot; its next event is the next change.
	again := openStream(t, url, progress.ID)
	againEvents := readEvents(t, bufio.NewReader(again.Body))
	if ev := nextEvent(t, againEvents); !ev.Retry {
		t.Fatalf("reconnect with the current id: first event %+v, want only the retry hint", ev)
	}

	finishBatch(t, f.store, id, 3)
	for _, step := range [][2]store.TaskState{{store.TaskRunning, store.TaskExporting}, {store.TaskExporting, store.TaskSucceeded}} {
		if _, err := f.store.TransitionTask(context.Background(), store.TransitionTaskParams{ID: id, From: []store.TaskState{step[0]}, To: step[1], ResultKey: "results/" + id + ".xlsx", Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	// Both streams wait on the clock now.
	deadline := time.Now().Add(10 * time.Second)
	for clk.Waiters() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(time.Second)
	want := brief{Name: "done", State: "SUCCEEDED", Done: 6, Total: 6, ResultURL: "https://bucket.test/results/" + id + ".xlsx?method=GET&ttl=1h0m0s"}
	done := nextEvent(t, events)
	if diff := cmp.Diff(want, briefOf(done)); diff != "" {
		t.Errorf("done (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, briefOf(nextEvent(t, againEvents))); diff != "" {
		t.Errorf("done on the reconnected stream (-want +got):\n%s", diff)
	}
	for _, ch := range []<-chan sseEvent{events, againEvents} {
		select {
		case ev, ok := <-ch:
			if ok {
				t.Errorf("an event after done: %+v", ev)
			}
		case <-time.After(10 * time.Second):
			t.Error("the stream did not end after done")
		}
	}

	// Reconnects after the end.
	if r := openStream(t, url, done.ID); r.StatusCode != http.StatusNoContent {
		t.Errorf("reconnect with the done event's id: %d, want 204", r.StatusCode)
	}
	late := readEvents(t, bufio.NewReader(openStream(t, url, snap.ID).Body))
	nextEvent(t, late) // the retry hint
	if diff := cmp.Diff(want, briefOf(nextEvent(t, late))); diff != "" {
		t.Errorf("reconnect with an old id (-want +got):\n%s", diff)
	}
}

// TestTaskEventsNotFound: a stream of an unknown or malformed task id is a
// JSON 404, like every other task route.
func TestTaskEventsNotFound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := api.New(f.config)
	for _, target := range []string{"/api/tasks/fedcba9876543210fedcba9876543210/events", "/api/tasks/..%2f/events"} {
		if r := do(t, h, "GET", target, ""); r.status != http.StatusNotFound || errorCode(r) != "not_found" {
			t.Errorf("GET %s: %d %v, want 404 not_found", target, r.status, r.body)
		}
	}
	if r := do(t, h, "POST", "/api/tasks/fedcba9876543210fedcba9876543210/events", ""); r.status != http.StatusMethodNotAllowed {
		t.Errorf("POST events: %d, want 405", r.status)
	}
}

// TestEventsLinkToStreamingFunction: with EventsURL set (the events
// function's Function URL on AWS, where API Gateway cannot stream), a
// task's links.events points there; without it, at the API's own route.
func TestEventsLinkToStreamingFunction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const id = "0123456789abcdef0123456789abcdef"
	runningTask(t, f.store, id, 1)
	for _, tc := range []struct{ base, want string }{
		{"", "/api/tasks/" + id + "/events"},
		{"https://abc.lambda-url.eu-west-1.on.aws/", "https://abc.lambda-url.eu-west-1.on.aws/api/tasks/" + id + "/events"},
	} {
		cfg := f.config
		cfg.EventsURL, cfg.Auth = tc.base, api.Fixed("local")
		r := do(t, api.New(cfg), "GET", "/api/tasks/"+id, "")
		links, _ := r.body["links"].(map[string]any)
		if r.status != http.StatusOK || links["events"] != tc.want {
			t.Errorf("EventsURL %q: %d links %v, want events %q", tc.base, r.status, links, tc.want)
		}
	}
}
