package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

// Per-principal limits: a shared deployment's one principal must not take
// every task slot, the day's rows or every open stream. Each refusal is a
// 429 with Retry-After and a message naming the limit.

// limitWindow is the span MaxRowsPerDay counts over.
const limitWindow = 24 * time.Hour

// maxTasksRead bounds how many of a principal's tasks, newest first, the
// limits read: every unfinished task and the last day's are among them but
// for a principal who made more in a day.
const maxTasksRead = 1000

// activeRetry is the Retry-After of a refusal for too many unfinished
// tasks: when one ends is not known.
const activeRetry = time.Minute

// refusal is a request a principal limit turns away.
type refusal struct {
	message    string
	retryAfter time.Duration
}

// uploading counts an upload of r's principal, or answers the refusal when
// it has MaxUploads in progress.
func (s *server) uploading(w http.ResponseWriter, r *http.Request) (leave func(), ok bool) {
	leave, ok = s.uploads.enter(principal(r), s.cfg.Limits.MaxUploads)
	if !ok {
		(&refusal{
			message:    fmt.Sprintf("%s is sending %d sheets already, the most one principal may send at once (max uploads); send this one when one has arrived", principal(r), s.cfg.Limits.MaxUploads),
			retryAfter: 10 * time.Second,
		}).write(w)
	}
	return leave, ok
}

// write answers r's 429.
func (f *refusal) write(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(max(int(f.retryAfter.Round(time.Second)/time.Second), 1)))
	writeError(w, http.StatusTooManyRequests, "principal_limit", f.message)
}

// admit checks a new task of owner with rows rows (0 when the sheet is not
// here yet: a task whose sheet comes to its upload URL) against the
// principal limits: its unfinished tasks, and the rows of the tasks it
// created in the last 24 hours. nil admits it.
func (s *server) admit(ctx context.Context, owner string, rows int) (*refusal, error) {
	l := s.cfg.Limits
	if l.MaxActiveTasks <= 0 && l.MaxRowsPerDay <= 0 {
		return nil, nil
	}
	tasks, err := s.cfg.Store.ListTasksByOwner(ctx, store.ListTasksByOwnerParams{Owner: owner, Limit: maxTasksRead})
	if err != nil {
		return nil, fmt.Errorf("list the tasks of %s: %w", owner, err)
	}
	now := s.cfg.Clock.Now()
	active, used := 0, 0
	var window []store.Task // newest first
	for _, t := range tasks {
		if !t.State.Final() {
			active++
		}
		if now.Sub(t.CreatedAt) < limitWindow {
			used += t.RowsTotal
			window = append(window, t)
		}
	}
	if l.MaxActiveTasks > 0 && active >= l.MaxActiveTasks {
		return &refusal{
			message: fmt.Sprintf("%s has %d unfinished tasks, the most this deployment runs for one principal (max active tasks %d); send this one when one of them has finished, or cancel one",
				owner, active, l.MaxActiveTasks),
			retryAfter: activeRetry,
		}, nil
	}
	if l.MaxRowsPerDay > 0 && (used+rows > l.MaxRowsPerDay || (rows == 0 && used >= l.MaxRowsPerDay)) {
		// When enough of the day's rows leave the window, oldest first.
		wait := limitWindow
		over := used + max(rows, 1) - l.MaxRowsPerDay
		for i := len(window) - 1; i >= 0 && over > 0; i-- {
			over -= window[i].RowsTotal
			wait = window[i].CreatedAt.Add(limitWindow).Sub(now)
		}
		what := fmt.Sprintf("this sheet's %d rows", rows)
		if rows == 0 {
			what = "another sheet"
		}
		return &refusal{
			message: fmt.Sprintf("%s sent %d rows in the last 24 hours; %s would pass the %d rows a day this deployment runs for one principal (max rows per day)",
				owner, used, what, l.MaxRowsPerDay),
			retryAfter: wait,
		}, nil
	}
	return nil, nil
}

// StreamGate admits a principal's event streams, at most max open at once
// (max <= 0: no cap), each ending by until; leave ends an admitted one.
// dynamostore.Store is one.
type StreamGate interface {
	EnterStream(ctx context.Context, owner string, max int, until time.Time) (leave func(context.Context) error, ok bool, err error)
}

// streamLease is how long a stream is counted when its request has no
// deadline (a server's, not a Lambda invocation's).
const streamLease = time.Hour

// enterStream admits a stream of owner's through the StreamGate, or the
// server's own count without one; the returned func ends it.
func (s *server) enterStream(ctx context.Context, owner string) (leave func(), ok bool, err error) {
	max := s.cfg.Limits.MaxStreams
	if max <= 0 {
		return func() {}, true, nil
	}
	if s.cfg.StreamGate == nil {
		leave, ok = s.streams.enter(owner, max)
		return leave, ok, nil
	}
	until, has := ctx.Deadline()
	if !has {
		until = s.cfg.Clock.Now().Add(streamLease)
	}
	end, ok, err := s.cfg.StreamGate.EnterStream(ctx, owner, max, until)
	if err != nil || !ok {
		return nil, false, err
	}
	return func() {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := end(lctx); err != nil {
			s.cfg.Logger.Warn("close a stream", "owner", owner, "error", err)
		}
	}, true, nil
}

// counter counts each principal's requests of a kind in progress.
type counter struct {
	mu   sync.Mutex
	open map[string]int
}

// enter counts a request of owner's, unless owner has max in progress
// (max <= 0: no cap); the returned func ends it.
func (s *counter) enter(owner string, max int) (leave func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if max > 0 && s.open[owner] >= max {
		return nil, false
	}
	if s.open == nil {
		s.open = map[string]int{}
	}
	s.open[owner]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.open[owner]--; s.open[owner] <= 0 {
			delete(s.open, owner)
		}
	}, true
}
