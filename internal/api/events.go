package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// Event stream defaults (Config.EventInterval, Config.HeartbeatInterval).
const (
	defaultEventInterval     = time.Second
	defaultHeartbeatInterval = 15 * time.Second
	// rateWindow is how far back the rate of a progress event looks: long
	// enough to smooth a batch's burst, short enough to show a slowdown.
	rateWindow = 15 * time.Second
	// reconnectMillis is the reconnection delay the stream asks of clients.
	reconnectMillis = 2000
	// streamMargin is the time a stream leaves before its request's
	// deadline (the Lambda invocation's end).
	streamMargin = 3 * time.Second
)

// Event names of GET /api/tasks/{id}/events.
const (
	// EventSnapshot is the first event of a stream of an unfinished task:
	// the task as it is.
	EventSnapshot = "snapshot"
	// EventProgress is sent when the task changed, at most once per
	// Config.EventInterval.
	EventProgress = "progress"
	// EventDone is the last event: the task is finished (or failed, or
	// cancelled and exported), with the link to its result when it has
	// one. A stream of a finished task sends only this event.
	EventDone = "done"
)

// TaskEvent is the data of every event of a task's stream: the task as
// GET /api/tasks/{id} shows it, and what the stream measured.
type TaskEvent struct {
	TaskView
	// RowsDone counts rows with a final result (succeeded, failed or
	// skipped).
	RowsDone int `json:"rows_done"`
	// RatePerSecond is rows done per second over the last 15 seconds this
	// stream watched; 0 until it has seen rows finish.
	RatePerSecond float64 `json:"rate_per_second"`
	// ETASeconds is the time the rest would take at RatePerSecond; absent
	// while the rate is unknown or the task is finished.
	ETASeconds *float64 `json:"eta_seconds,omitempty"`
	// ResultURL downloads the result workbook; set on the done event of a
	// task that has one.
	ResultURL string `json:"result_url,omitempty"`
}

// taskEvents serves GET /api/tasks/{id}/events, a Server-Sent Events
// stream of the task's progress: a snapshot on connect, a progress event
// whenever the task changed (at most once per EventInterval, so a client
// sees rows finish while the job runs, not all at the end), and a done
// event when it is finished, after which the stream ends. A comment line
// every HeartbeatInterval keeps proxies from closing a quiet stream.
//
// Every event's id describes the task's progress (export generation, rows
// succeeded, failed and skipped, state). A client that reconnects with
// Last-Event-ID gets no snapshot when nothing changed since that event,
// and a 204 (which tells EventSource to stop reconnecting) when that event
// was the done event of the task as it still is.
//
// Where progress comes from: each stream reads the task from the store on
// a ticker (one GetTask per EventInterval per open stream, and while the
// task generates one listing of its batches, whose saved counts move with
// every group of rows: pipeline.LiveCounts). A broadcaster
// fed by the workers would save those reads in `batchgen serve`, but on AWS
// the stream is served by its own function (functions/events) that cannot
// hear the generator Lambdas, so it must read the table anyway; one path
// for both runtimes keeps them behaving alike and tested alike, and a
// strongly consistent GetItem a second per viewer (or a primary-key lookup
// in SQLite) is cheap next to the model calls it reports on.
func (s *server) taskEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !ValidTaskID(id) {
		writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
		return
	}
	ctx := r.Context()
	task, awaiting, err := s.loadForEvents(ctx, principal(r), id)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
		return
	}
	if err != nil {
		s.internalError(w, r, "get task", err)
		return
	}
	last := r.Header.Get("Last-Event-ID")
	if task.Settled() && last == eventID(task, awaiting) {
		// The client saw the end already; 204 stops EventSource.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	leave, ok, err := s.enterStream(ctx, principal(r))
	if err != nil {
		s.internalError(w, r, "count the open streams", err)
		return
	}
	if !ok {
		(&refusal{
			message: fmt.Sprintf("%s has %d event streams open, the most one principal may have (max streams); close one, or poll GET /api/tasks/%s",
				principal(r), s.cfg.Limits.MaxStreams, id),
			retryAfter: reconnectMillis * time.Millisecond,
		}).write(w)
		return
	}
	defer leave()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	// nginx buffers responses unless told not to.
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, rc: http.NewResponseController(w)}
	sse.retry(reconnectMillis)

	rate := &pipeline.RateMeter{Window: rateWindow}
	sentID := last
	name := EventSnapshot
	heartbeat := s.cfg.Clock.Now()
	if deadline, ok := ctx.Deadline(); ok {
		// A Lambda invocation's deadline: end the stream cleanly before
		// the runtime cuts it; the client reconnects with Last-Event-ID.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-streamMargin))
		defer cancel()
	}
	var streamEnd <-chan time.Time
	if s.cfg.StreamFor > 0 {
		streamEnd = s.cfg.Clock.After(s.cfg.StreamFor)
	}
	for {
		now := s.cfg.Clock.Now()
		rate.Add(now, rowsDone(task))
		if eid := s.progressID(task, awaiting); eid != sentID {
			ev := TaskEvent{TaskView: s.viewOf(task), RowsDone: rowsDone(task)}
			if awaiting {
				ev.TaskView = s.awaitingView(id, task)
			}
			if task.Settled() {
				name = EventDone
				if ev.ResultURL, err = s.resultURL(ctx, task); err != nil {
					s.cfg.Logger.Warn("events: no result link", "task_id", id, "error", err)
				}
			} else {
				ev.RatePerSecond, ev.ETASeconds = estimate(rate, task)
			}
			if err := sse.event(name, eid, ev); err != nil {
				return // the client went away
			}
			sentID, heartbeat, name = eid, now, EventProgress
		} else if now.Sub(heartbeat) >= s.cfg.HeartbeatInterval {
			if err := sse.comment("keepalive"); err != nil {
				return
			}
			heartbeat = now
		}
		if task.Settled() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-streamEnd:
			// A runtime with a time limit (a Lambda invocation) ends the
			// stream before it is cut; the client reconnects with
			// Last-Event-ID after the retry delay.
			return
		case <-s.cfg.Clock.After(s.cfg.EventInterval):
		}
		next, nextAwaiting, err := s.loadForEvents(ctx, principal(r), id)
		if err != nil {
			if ctx.Err() == nil {
				s.cfg.Logger.Warn("events: read task failed; the client will reconnect", "task_id", id, "error", err)
			}
			return
		}
		task, awaiting = next, nextAwaiting
	}
}

// loadForEvents returns owner's task, or for their API upload whose sheet
// has not arrived yet a placeholder with awaiting set; store.ErrNotFound
// when there is neither (another principal's task included).
func (s *server) loadForEvents(ctx context.Context, owner, id string) (store.Task, bool, error) {
	task, err := pipeline.OwnedTask(ctx, s.cfg.Store, owner, id)
	if !errors.Is(err, store.ErrNotFound) {
		if err == nil {
			task = s.live(ctx, task)
		}
		return task, false, err
	}
	rec, lerr := pipeline.LoadUpload(ctx, s.cfg.Blobs, id)
	if errors.Is(lerr, blob.ErrNotFound) || (lerr == nil && rec.Owner != owner) {
		return store.Task{}, false, err
	}
	if lerr != nil {
		return store.Task{}, false, lerr
	}
	return store.Task{ID: id, Source: rec.Filename, Spec: rec.Spec, CreatedAt: rec.CreatedAt}, true, nil
}

// awaitingView is the view of a task whose sheet has not arrived.
func (s *server) awaitingView(id string, placeholder store.Task) TaskView {
	return s.recordView(pipeline.UploadRecord{TaskID: id, Filename: placeholder.Source, Spec: placeholder.Spec, CreatedAt: placeholder.CreatedAt})
}

func rowsDone(t store.Task) int { return t.RowsSucceeded + t.RowsFailed + t.RowsSkipped }

// eventID names a task's progress: two events with the same id report the
// same task.
// progressID is eventID with, for an economy or auto task running here,
// what it waits for: so that the provider's progress on its batches is an
// event too, though no row is done meanwhile.
func (s *server) progressID(t store.Task, awaiting bool) string {
	id := eventID(t, awaiting)
	if t.Mode.Batched() && !t.State.Final() && s.cfg.WaitingOn != nil {
		if w := s.cfg.WaitingOn(t.ID); w != "" {
			h := fnv.New32a()
			h.Write([]byte(w))
			id += fmt.Sprintf(".%08x", h.Sum32())
		}
	}
	return id
}

func eventID(t store.Task, awaiting bool) string {
	state := string(t.State)
	if awaiting {
		state = StateAwaitingUpload
	}
	if t.State == store.TaskCancelled && t.ResultKey != "" {
		state += "-EXPORTED"
	}
	return fmt.Sprintf("%d.%d.%d.%d.%s", t.ExportGen, t.RowsSucceeded, t.RowsFailed, t.RowsSkipped, state)
}

// resultURL is where the result of a finished task is downloaded: a
// presigned link where the API can presign, else the API's own route.
func (s *server) resultURL(ctx context.Context, t store.Task) (string, error) {
	if t.ResultKey == "" {
		return "", nil
	}
	if s.cfg.Presigner != nil {
		return s.cfg.Presigner.PresignGet(ctx, t.ResultKey, s.cfg.DownloadTTL)
	}
	return "/api/tasks/" + t.ID + "/result", nil
}

// estimate is the rate of a progress event and, while it is known, the
// time the rest of task takes at it.
func estimate(m *pipeline.RateMeter, t store.Task) (float64, *float64) {
	rate := m.Rate()
	if rate <= 0 {
		return 0, nil
	}
	eta, _ := m.ETA(t.RowsTotal)
	secs := eta.Seconds()
	return rate, &secs
}

// sseWriter writes Server-Sent Events and flushes each one.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (s *sseWriter) flush() error {
	// A writer that cannot flush is unbuffered (lambdaurl's pipe): what
	// was written is on its way already.
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

func (s *sseWriter) retry(millis int) {
	fmt.Fprintf(s.w, "retry: %d\n\n", millis)
	_ = s.flush()
}

func (s *sseWriter) event(name, id string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\nid: %s\ndata: %s\n\n", name, id, b); err != nil {
		return err
	}
	return s.flush()
}

func (s *sseWriter) comment(text string) error {
	if _, err := fmt.Fprintf(s.w, ": %s\n\n", strings.ReplaceAll(text, "\n", " ")); err != nil {
		return err
	}
	return s.flush()
}
