package mockserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Anthropic's Message Batches, on the same batch engine as OpenAI's Batch
// API (batch.go):
//
//	POST /v1/messages/batches               {"requests": [{"custom_id", "params": {a Messages request}}]}
//	GET  /v1/messages/batches               the batches, newest first (?limit, ?after_id, ?before_id)
//	GET  /v1/messages/batches/{id}          the batch, as it stands now
//	POST /v1/messages/batches/{id}/cancel   cancel it: the lines finished are kept
//	GET  /v1/messages/batches/{id}/results  JSONL, once it has ended: each line's
//	                                        result, succeeded, errored, canceled or expired
//
// At most 100,000 requests or 256 MB a batch, as Anthropic takes them.
const (
	maxMessageBatchRequests = 100_000
	maxMessageBatchBytes    = 256 << 20
)

// serveMessageBatches routes the Message Batches paths; false when path
// is not one.
func (s *Server) serveMessageBatches(w http.ResponseWriter, r *http.Request) bool {
	const root = "/v1/messages/batches"
	path := r.URL.Path
	if path != root && !strings.HasPrefix(path, root+"/") {
		return false
	}
	if key := s.cfg.RequireAPIKey; key != "" && !(anthropic{}).authorized(r, key) {
		anthropic{}.writeError(w, http.StatusUnauthorized, apiError{Type: "invalid_request_error"})
		return true
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(path, root), "/")
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case rest == "" && r.Method == http.MethodPost:
		s.createMessageBatch(w, r)
	case rest == "" && r.Method == http.MethodGet:
		s.listMessageBatches(w, r)
	case id != "" && action == "" && r.Method == http.MethodGet:
		s.messageBatch(w, id, "")
	case id != "" && (action == "cancel" && r.Method == http.MethodPost || action == "results" && r.Method == http.MethodGet):
		s.messageBatch(w, id, action)
	default:
		anthropic{}.writeError(w, http.StatusNotFound, apiError{Message: fmt.Sprintf("%s %s is not served", r.Method, path), Type: "not_found_error"})
	}
	return true
}

// createMessageBatch starts a batch of requests. A request's params are
// read when its turn comes, as Anthropic does: a bad one is an errored
// result, not a refused batch.
func (s *Server) createMessageBatch(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxMessageBatchBytes+1))
	if err != nil || len(body) > maxMessageBatchBytes {
		anthropic{}.writeError(w, http.StatusRequestEntityTooLarge, apiError{Message: fmt.Sprintf("a batch is at most %d bytes", maxMessageBatchBytes)})
		return
	}
	var req struct {
		Requests []struct {
			CustomID string          `json:"custom_id"`
			Params   json.RawMessage `json:"params"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		anthropic{}.writeError(w, http.StatusBadRequest, apiError{Message: "invalid JSON body: " + err.Error()})
		return
	}
	if n := len(req.Requests); n == 0 || n > maxMessageBatchRequests {
		anthropic{}.writeError(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("requests: a batch takes 1 to %d, not %d", maxMessageBatchRequests, n)})
		return
	}
	lines := make([]batchLine, len(req.Requests))
	seen := map[string]bool{}
	for i, q := range req.Requests {
		switch {
		case q.CustomID == "" || seen[q.CustomID]:
			anthropic{}.writeError(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("requests.%d.custom_id: %q is empty or used twice; each must be unique", i, q.CustomID)})
			return
		case len(q.Params) == 0:
			anthropic{}.writeError(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("requests.%d.params: Field required", i)})
			return
		}
		seen[q.CustomID] = true
		lines[i] = batchLine{customID: q.CustomID, body: q.Params}
	}
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	if s.overJobsLocked() {
		anthropic{}.writeError(w, http.StatusTooManyRequests, apiError{Message: fmt.Sprintf("Too many message batches in progress: at most %d at once.", s.cfg.BatchJobsLimit), Type: "rate_limit_error", Code: "rate_limit_exceeded"})
		return
	}
	b := s.newBatchLocked("msgbatch", anthropicBatch{}, lines)
	s.advanceLocked(b)
	if s.answerLost(w) {
		return
	}
	writeJSON(w, http.StatusOK, anthropicBatchObject(b))
}

// listMessageBatches answers a page of the Message Batches, newest first:
// after_id pages on to older ones, before_id back to newer ones.
func (s *Server) listMessageBatches(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := strconv.Atoi(cmpOrString(q.Get("limit"), "20"))
	if err != nil || limit < 1 || limit > 1000 {
		anthropic{}.writeError(w, http.StatusBadRequest, apiError{Message: "limit: must be 1 to 1000"})
		return
	}
	after, before := q.Get("after_id"), q.Get("before_id")
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	var all []*mockBatch
	for _, b := range s.batch.batches {
		if _, ok := b.format.(anthropicBatch); ok && (after == "" || b.id < after) && (before == "" || b.id > before) {
			all = append(all, b)
		}
	}
	// Newest first; ids grow with time. A page before before_id is the
	// one just above it.
	slices.SortFunc(all, func(a, b *mockBatch) int { return strings.Compare(b.id, a.id) })
	more := len(all) > limit
	if more && before != "" {
		all = all[len(all)-limit:]
	} else if more {
		all = all[:limit]
	}
	data := make([]map[string]any, len(all))
	for i, b := range all {
		s.advanceLocked(b)
		data[i] = anthropicBatchObject(b)
	}
	first, last := "", ""
	if len(all) > 0 {
		first, last = all[0].id, all[len(all)-1].id
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": data, "has_more": more, "first_id": first, "last_id": last})
}

// messageBatch answers a batch as it stands now; action "cancel" cancels
// it first, "results" answers its results instead.
func (s *Server) messageBatch(w http.ResponseWriter, id, action string) {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	b, ok := batchOf[anthropicBatch](&s.batch, id)
	if !ok {
		anthropic{}.writeError(w, http.StatusNotFound, apiError{Message: "message batch " + id + " not found"})
		return
	}
	s.advanceLocked(b)
	switch action {
	case "cancel":
		if !final(b.status) {
			b.cancelling, b.status = true, "cancelling"
		}
	case "results":
		if !final(b.status) {
			anthropic{}.writeError(w, http.StatusBadRequest, apiError{Message: "message batch " + id + " has not ended; its results are not ready"})
			return
		}
		w.Header().Set("Content-Type", "application/x-jsonl")
		var out bytes.Buffer
		for _, r := range b.results {
			out.Write(append(r.line, '\n'))
		}
		_, _ = w.Write(out.Bytes())
		return
	}
	writeJSON(w, http.StatusOK, anthropicBatchObject(b))
}

// anthropicBatchObject is b as Message Batches shows it.
func anthropicBatchObject(b *mockBatch) map[string]any {
	status := "in_progress"
	switch {
	case final(b.status):
		status = "ended"
	case b.cancelling:
		status = "canceling"
	}
	counts := map[string]int{"processing": 0, "succeeded": b.answered, "errored": b.errored, "canceled": 0, "expired": 0}
	switch b.status {
	case "cancelled":
		counts["canceled"] = b.unfinished
	case "expired":
		counts["expired"] = b.unfinished
	default:
		counts["processing"] = len(b.lines) - b.done
	}
	o := map[string]any{
		"id": b.id, "type": "message_batch", "processing_status": status, "request_counts": counts,
		"created_at": b.createdAt.UTC().Format(time.RFC3339Nano), "expires_at": b.createdAt.Add(24 * time.Hour).UTC().Format(time.RFC3339Nano),
		"ended_at": nil, "cancel_initiated_at": nil, "archived_at": nil, "results_url": nil,
	}
	if status == "ended" {
		o["ended_at"] = b.finishedAt.UTC().Format(time.RFC3339)
		o["results_url"] = "/v1/messages/batches/" + b.id + "/results"
	}
	return o
}

// anthropicBatch is the Message Batches format.
type anthropicBatch struct{}

func (anthropicBatch) parse(s *Server, body json.RawMessage) (chatRequest, *apiError, int) {
	return anthropic{}.parse(s, body)
}

func (anthropicBatch) line(b *mockBatch, i int, result map[string]any) []byte {
	line, _ := json.Marshal(map[string]any{"custom_id": b.lines[i].customID, "result": result})
	return line
}

func (f anthropicBatch) answer(b *mockBatch, i int, id int64, _ time.Time, req chatRequest, text, finish string) []byte {
	return f.line(b, i, map[string]any{"type": "succeeded", "message": anthropicMessage(id, req, text, finish)})
}

func (f anthropicBatch) failure(b *mockBatch, i int, status int, e apiError) []byte {
	_, body := anthropicError(status, e)
	return f.line(b, i, map[string]any{"type": "errored", "error": body})
}

func (f anthropicBatch) unfinished(b *mockBatch, i int, final string) []byte {
	typ := "expired"
	if final == "cancelled" {
		typ = "canceled"
	}
	return f.line(b, i, map[string]any{"type": typ})
}
