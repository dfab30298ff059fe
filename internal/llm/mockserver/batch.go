package mockserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// OpenAI's Batch API, for the tests and benchmarks of provider batch jobs:
//
//	POST /v1/files                 multipart: purpose "batch", file a JSONL of requests
//	GET  /v1/files/{id}            the file's object
//	GET  /v1/files/{id}/content    its bytes
//	POST /v1/batches               {input_file_id, endpoint, completion_window, metadata}
//	GET  /v1/batches               the batches, newest first (?limit, ?after)
//	GET  /v1/batches/{id}          one batch, as it stands now
//	POST /v1/batches/{id}/cancel   cancel it: the lines finished are kept
//
// A batch's lines finish one at a time, in a shuffled order, spread evenly
// over Config.BatchDelay; each is answered as a call to /v1/chat/completions
// would be (its markers, its columns), without the request quota, and a
// Config.BatchErrorRate share of them fail with a 500. With
// Config.BatchExpire the batch expires at its delay with half its lines
// done. Finished lines go to the output file (answers) or the error file
// (error answers; lines expired or cancelled unfinished, with their error
// code), each in the order it finished, never the input's. A line answered
// is written to the paid log as {"prompt": ..., "batch": true} (billed at
// half the online price), before the batch reports it.

// Limits of OpenAI's Batch API.
const (
	maxBatchLines     = 50_000
	maxBatchFileBytes = 200 << 20
)

// DefaultBatchDelay is how long a batch takes unless Config.BatchDelay says.
const DefaultBatchDelay = time.Minute

// mockFile is an uploaded file.
type mockFile struct {
	id, filename, purpose string
	bytes                 []byte
	createdAt             time.Time
}

// batchLine is one request of a batch's input file.
type batchLine struct {
	customID string
	body     json.RawMessage
}

// mockBatch is a batch job and how far it has come.
type mockBatch struct {
	id, inputFileID, endpoint, window string
	metadata                          map[string]string
	createdAt                         time.Time
	lines                             []batchLine
	// format words the batch's lines and object: OpenAI's or Anthropic's.
	format batchFormat
	// order is the line indexes in the order they finish; done is how
	// many of them have.
	order []int
	done  int
	// results are the finished lines' results, in the order they
	// finished, and answered, errored and unfinished count them.
	results                       []batchRecord
	answered, errored, unfinished int
	status                        string
	// cancelling is set by a cancel; the next read finalizes the batch.
	cancelling bool
	// finishedAt and the files are set when the batch reaches a final
	// status.
	finishedAt                time.Time
	outputFileID, errorFileID string
	// failure is why a failed batch failed as a whole (its errors).
	failure map[string]any
	// bedrock is set for a Bedrock batch inference job.
	bedrock *bedrockJob
}

// batchRecord is one finished line's result as the batch's format words
// it; ok for an answer.
type batchRecord struct {
	ok   bool
	line []byte
}

// batchFormat is what differs between OpenAI's Batch API and Anthropic's
// Message Batches: how a line is read and how its result is worded.
type batchFormat interface {
	// parse reads a line's request.
	parse(s *Server, body json.RawMessage) (chatRequest, *apiError, int)
	// answer, failure and unfinished word a line's result: an answer, an
	// error answer (in the server's terms), or a line the batch did not
	// run because it expired or was cancelled (final is the batch's
	// final status).
	answer(b *mockBatch, i int, id int64, now time.Time, req chatRequest, text, finish string) []byte
	failure(b *mockBatch, i int, status int, e apiError) []byte
	unfinished(b *mockBatch, i int, final string) []byte
}

// batches holds the Batch API's files and jobs.
type batches struct {
	mu      sync.Mutex
	files   map[string]*mockFile
	batches map[string]*mockBatch
	seq     int
	// lost counts the creates answered 502 for Config.BatchAnswersLost.
	lost int
}

// batchOf returns the batch id if it exists and was created through API
// F's routes (openAIBatch, anthropicBatch): each API sees only its own
// jobs, as each provider does. The caller holds mu.
func batchOf[F any](b *batches, id string) (*mockBatch, bool) {
	mb, ok := b.batches[id]
	if !ok {
		return nil, false
	}
	_, ok = mb.format.(F)
	return mb, ok
}

func (b *batches) nextID(prefix string) string {
	b.seq++
	return fmt.Sprintf("%s-mock-%08d", prefix, b.seq)
}

// serveBatchAPI routes the Batch API's paths; false when path is not one.
func (s *Server) serveBatchAPI(w http.ResponseWriter, r *http.Request) bool {
	if s.serveMessageBatches(w, r) || s.serveBedrockJobs(w, r) {
		return true
	}
	path := r.URL.Path
	switch {
	case path == "/v1/files" && r.Method == http.MethodPost:
		s.uploadFile(w, r)
	case strings.HasPrefix(path, "/v1/files/") && r.Method == http.MethodGet:
		id, content := strings.CutSuffix(strings.TrimPrefix(path, "/v1/files/"), "/content")
		s.getFile(w, id, content)
	case path == "/v1/batches" && r.Method == http.MethodPost:
		s.createBatch(w, r)
	case path == "/v1/batches" && r.Method == http.MethodGet:
		s.listBatches(w, r)
	case strings.HasPrefix(path, "/v1/batches/") && r.Method == http.MethodGet:
		s.getBatch(w, strings.TrimPrefix(path, "/v1/batches/"), false)
	case strings.HasPrefix(path, "/v1/batches/") && strings.HasSuffix(path, "/cancel") && r.Method == http.MethodPost:
		s.getBatch(w, strings.TrimSuffix(strings.TrimPrefix(path, "/v1/batches/"), "/cancel"), true)
	case path == "/v1/files" || strings.HasPrefix(path, "/v1/files/") || path == "/v1/batches" || strings.HasPrefix(path, "/v1/batches/"):
		writeError(w, http.StatusMethodNotAllowed, apiError{Message: fmt.Sprintf("%s is not served for %s", r.Method, path), Type: "invalid_request_error"})
	default:
		return false
	}
	return true
}

// uploadFile stores a batch input file, checking every line as OpenAI
// does: a JSON request with a unique custom_id, to /v1/chat/completions.
func (s *Server) uploadFile(w http.ResponseWriter, r *http.Request) {
	if key := s.cfg.RequireAPIKey; key != "" && !(openAI{}).authorized(r, key) {
		writeError(w, http.StatusUnauthorized, apiError{Message: "Incorrect API key provided.", Type: "invalid_request_error", Code: "invalid_api_key"})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBatchFileBytes+1<<20)
	if err := r.ParseMultipartForm(32 << 20); err != nil {
		writeError(w, http.StatusBadRequest, apiError{Message: "send multipart/form-data with purpose and file: " + err.Error(), Type: "invalid_request_error"})
		return
	}
	defer r.MultipartForm.RemoveAll()
	purpose := r.FormValue("purpose")
	if purpose != "batch" {
		writeError(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("purpose %q: the mock takes batch files only", purpose), Type: "invalid_request_error", Code: "invalid_purpose"})
		return
	}
	f, hdr, err := r.FormFile("file")
	if err != nil {
		writeError(w, http.StatusBadRequest, apiError{Message: "field file is required", Type: "invalid_request_error"})
		return
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxBatchFileBytes+1))
	if err != nil || len(data) > maxBatchFileBytes {
		writeError(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("the file is over %d bytes", maxBatchFileBytes), Type: "invalid_request_error", Code: "file_too_large"})
		return
	}
	if _, err := parseBatchFile(data); err != nil {
		writeError(w, http.StatusBadRequest, apiError{Message: err.Error(), Type: "invalid_request_error", Code: "invalid_file"})
		return
	}
	s.batch.mu.Lock()
	mf := &mockFile{id: s.batch.nextID("file"), filename: hdr.Filename, purpose: purpose, bytes: data, createdAt: s.cfg.Clock.Now()}
	s.batch.files[mf.id] = mf
	s.batch.mu.Unlock()
	writeJSON(w, http.StatusOK, fileObject(mf))
}

// parseBatchFile reads a batch input file's lines.
func parseBatchFile(data []byte) ([]batchLine, error) {
	var lines []batchLine
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), maxBatchFileBytes)
	for n := 1; sc.Scan(); n++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var l struct {
			CustomID string          `json:"custom_id"`
			Method   string          `json:"method"`
			URL      string          `json:"url"`
			Body     json.RawMessage `json:"body"`
		}
		switch err := json.Unmarshal(text, &l); {
		case err != nil:
			return nil, fmt.Errorf("line %d: not a JSON request: %v", n, err)
		case l.CustomID == "":
			return nil, fmt.Errorf("line %d: custom_id is required", n)
		case seen[l.CustomID]:
			return nil, fmt.Errorf("line %d: custom_id %q is used twice; each must be unique", n, l.CustomID)
		case l.Method != http.MethodPost || l.URL != "/v1/chat/completions":
			return nil, fmt.Errorf("line %d: want method POST and url /v1/chat/completions, got %s %s", n, l.Method, l.URL)
		case len(l.Body) == 0:
			return nil, fmt.Errorf("line %d: body is required", n)
		}
		seen[l.CustomID] = true
		lines = append(lines, batchLine{customID: l.CustomID, body: l.Body})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read the file: %v", err)
	}
	if len(lines) == 0 || len(lines) > maxBatchLines {
		return nil, fmt.Errorf("the file has %d requests; a batch takes 1 to %d", len(lines), maxBatchLines)
	}
	return lines, nil
}

func fileObject(f *mockFile) map[string]any {
	return map[string]any{"id": f.id, "object": "file", "bytes": len(f.bytes), "created_at": f.createdAt.Unix(), "filename": f.filename, "purpose": f.purpose}
}

func (s *Server) getFile(w http.ResponseWriter, id string, content bool) {
	s.batch.mu.Lock()
	f, ok := s.batch.files[id]
	s.batch.mu.Unlock()
	switch {
	case !ok:
		writeError(w, http.StatusNotFound, apiError{Message: fmt.Sprintf("No such File object: %s", id), Type: "invalid_request_error"})
	case content:
		w.Header().Set("Content-Type", "application/jsonl")
		_, _ = w.Write(f.bytes)
	default:
		writeJSON(w, http.StatusOK, fileObject(f))
	}
}

// createBatch starts a batch over an uploaded file.
func (s *Server) createBatch(w http.ResponseWriter, r *http.Request) {
	if key := s.cfg.RequireAPIKey; key != "" && !(openAI{}).authorized(r, key) {
		writeError(w, http.StatusUnauthorized, apiError{Message: "Incorrect API key provided.", Type: "invalid_request_error", Code: "invalid_api_key"})
		return
	}
	var req struct {
		InputFileID      string            `json:"input_file_id"`
		Endpoint         string            `json:"endpoint"`
		CompletionWindow string            `json:"completion_window"`
		Metadata         map[string]string `json:"metadata"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, apiError{Message: "body: " + err.Error(), Type: "invalid_request_error"})
		return
	}
	if req.Endpoint != "/v1/chat/completions" || req.CompletionWindow != "24h" {
		writeError(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("endpoint %q, completion_window %q: the mock takes /v1/chat/completions and 24h", req.Endpoint, req.CompletionWindow), Type: "invalid_request_error"})
		return
	}
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	f, ok := s.batch.files[req.InputFileID]
	if !ok || f.purpose != "batch" {
		writeError(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("input_file_id %q: no batch file has it", req.InputFileID), Type: "invalid_request_error", Code: "invalid_file"})
		return
	}
	lines, _ := parseBatchFile(f.bytes) // checked at upload
	if s.overJobsLocked() {
		writeError(w, http.StatusTooManyRequests, apiError{Message: fmt.Sprintf("Too many batches in progress: at most %d at once.", s.cfg.BatchJobsLimit), Type: "rate_limit_error", Code: "rate_limit_exceeded"})
		return
	}
	enqueued := 0
	for _, o := range s.batch.batches {
		if _, ok := o.format.(openAIBatch); ok {
			s.advanceLocked(o)
			if !final(o.status) {
				enqueued += len(o.lines) - o.done
			}
		}
	}
	b := s.newBatchLocked("batch", openAIBatch{}, lines)
	b.inputFileID, b.endpoint, b.window, b.metadata = f.id, req.Endpoint, req.CompletionWindow, req.Metadata
	if limit := s.cfg.BatchQueueLimit; limit > 0 && enqueued+len(lines) > limit {
		b.status, b.finishedAt = "failed", s.cfg.Clock.Now()
		b.failure = map[string]any{"object": "list", "data": []map[string]any{{
			"code": "token_limit_exceeded", "param": nil, "line": nil,
			"message": fmt.Sprintf("Enqueued token limit reached for this model in organization org-mock. Limit: %d enqueued lines, %d in flight. Please try again once some in_progress batches have been completed.", limit, enqueued),
		}}}
		s.count(func(st *Stats) { st.BatchesRefused++ })
	}
	if s.answerLost(w) {
		return
	}
	writeJSON(w, http.StatusOK, s.batchObject(b))
}

// overJobsLocked reports whether Config.BatchJobsLimit refuses a create
// now, counting it, and keeps Stats.MostJobsInProgress; the caller holds
// s.batch.mu.
func (s *Server) overJobsLocked() bool {
	running := int64(0)
	for _, o := range s.batch.batches {
		s.advanceLocked(o)
		if !final(o.status) {
			running++
		}
	}
	if limit := s.cfg.BatchJobsLimit; limit > 0 && running >= int64(limit) {
		s.count(func(st *Stats) { st.CreatesOverJobs++ })
		return true
	}
	s.count(func(st *Stats) { st.MostJobsInProgress = max(st.MostJobsInProgress, running+1) })
	return false
}

// newBatchLocked starts a batch of lines in format; the caller holds
// s.batch.mu.
func (s *Server) newBatchLocked(prefix string, format batchFormat, lines []batchLine) *mockBatch {
	b := &mockBatch{id: s.batch.nextID(prefix), format: format, createdAt: s.cfg.Clock.Now(), lines: lines, status: "validating"}
	// The order the lines finish in: seeded, so a run can be repeated.
	rng := rand.New(rand.NewPCG(uint64(s.cfg.Seed), uint64(s.batch.seq)))
	b.order = rng.Perm(len(lines))
	s.batch.batches[b.id] = b
	return b
}

// answerLost answers 502 in place of a batch just created while
// Config.BatchAnswersLost lasts; the caller holds s.batch.mu.
func (s *Server) answerLost(w http.ResponseWriter) bool {
	s.count(func(st *Stats) { st.BatchesCreated++ })
	if s.batch.lost >= s.cfg.BatchAnswersLost {
		return false
	}
	s.batch.lost++
	http.Error(w, "502 Bad Gateway: the upstream went away", http.StatusBadGateway)
	return true
}

func (s *Server) listBatches(w http.ResponseWriter, r *http.Request) {
	limit, err := strconv.Atoi(cmpOrString(r.URL.Query().Get("limit"), "20"))
	if err != nil || limit < 1 || limit > 100 {
		writeError(w, http.StatusBadRequest, apiError{Message: "limit must be 1 to 100", Type: "invalid_request_error"})
		return
	}
	after := r.URL.Query().Get("after")
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	all := make([]*mockBatch, 0, len(s.batch.batches))
	for _, b := range s.batch.batches {
		if _, ok := b.format.(openAIBatch); ok {
			all = append(all, b)
		}
	}
	// Newest first; ids grow with time.
	slices.SortFunc(all, func(a, b *mockBatch) int { return strings.Compare(b.id, a.id) })
	var data []map[string]any
	for _, b := range all {
		if after != "" && b.id >= after {
			continue
		}
		if len(data) == limit {
			break
		}
		s.advanceLocked(b)
		data = append(data, s.batchObject(b))
	}
	more := len(data) == limit && len(all) > 0 && data[len(data)-1]["id"] != all[len(all)-1].id
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data, "has_more": more})
}

// getBatch answers a batch as it stands now, after cancelling it when
// cancel is set.
func (s *Server) getBatch(w http.ResponseWriter, id string, cancel bool) {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	b, ok := batchOf[openAIBatch](&s.batch, id)
	if !ok {
		writeError(w, http.StatusNotFound, apiError{Message: fmt.Sprintf("No such Batch object: %s", id), Type: "invalid_request_error"})
		return
	}
	s.advanceLocked(b)
	if cancel {
		if final(b.status) {
			writeError(w, http.StatusConflict, apiError{Message: fmt.Sprintf("Cannot cancel a batch with status %s.", b.status), Type: "invalid_request_error"})
			return
		}
		b.cancelling, b.status = true, "cancelling"
	}
	writeJSON(w, http.StatusOK, s.batchObject(b))
}

// final reports whether a batch status is one it never leaves.
func final(status string) bool {
	return status == "completed" || status == "failed" || status == "expired" || status == "cancelled"
}

// advanceLocked brings b to now: the lines due finish (answered, their
// results filed), and the batch completes, expires or is cancelled. The
// caller holds s.batch.mu.
func (s *Server) advanceLocked(b *mockBatch) {
	if final(b.status) {
		return
	}
	now := s.cfg.Clock.Now()
	delay := cmpOrDuration(s.cfg.BatchDelay, DefaultBatchDelay)
	elapsed := now.Sub(b.createdAt)
	if b.status == "validating" {
		b.status = "in_progress"
	}
	span := delay
	if s.cfg.BatchExpire {
		span = 2 * delay // half the lines are done when it expires
	}
	due := len(b.lines)
	if elapsed < span {
		due = int(float64(len(b.lines)) * float64(elapsed) / float64(span))
	}
	if b.cancelling {
		due = b.done // a cancel stops the lines not started
	}
	for b.done < due {
		s.finishLine(b, b.order[b.done])
		b.done++
	}
	switch {
	case b.cancelling:
		s.finalize(b, "cancelled")
	case b.done == len(b.lines):
		s.finalize(b, "completed")
	case s.cfg.BatchExpire && elapsed >= delay:
		s.finalize(b, "expired")
	}
}

// finishLine answers line i of b and files its result.
func (s *Server) finishLine(b *mockBatch, i int) {
	l := b.lines[i]
	fail := func(status int, e apiError) {
		s.count(func(st *Stats) { st.BatchLines++; st.BatchFailed++ })
		b.results = append(b.results, batchRecord{line: b.format.failure(b, i, status, e)})
		b.errored++
	}
	req, aerr, status := b.format.parse(s, l.body)
	if aerr != nil {
		fail(status, *aerr)
		return
	}
	s.mu.Lock()
	calls := s.trackCallLocked(req.prompt)
	s.seq++
	id := s.seq
	s.mu.Unlock()
	roll := s.roll(req.prompt, calls)
	out := s.decide(req.text, calls, roll)
	switch {
	case strings.Contains(req.text, s.cfg.QuotaMarker):
		out = failServer
	case out == hang || out == resetConn:
		out = failServer
	case out == succeed && s.cfg.BatchErrorRate > 0 && s.roll(req.prompt+"\x00batch", calls) < s.cfg.BatchErrorRate:
		out = failServer
	}
	switch out {
	case failServer, failUnavailable, failFilter, failTooLong:
		fail(s.failure(out))
		return
	}
	text, finish := "", "content_filter"
	if out != failOutputFilter {
		text, finish = s.answerText(req, calls)
	}
	used := req.inTokens + estimateTokens(text)
	s.mu.Lock()
	s.stats.BatchLines++
	s.stats.Tokens += int64(used)
	s.stats.Succeeded++
	if p, ok := s.prompt[req.prompt]; ok {
		p.Succeeded++
	}
	if s.cfg.PaidLog != nil {
		line, _ := json.Marshal(map[string]any{"prompt": req.prompt, "batch": true})
		_, _ = s.cfg.PaidLog.Write(append(line, '\n'))
	}
	s.mu.Unlock()
	b.results = append(b.results, batchRecord{ok: true, line: b.format.answer(b, i, id, s.cfg.Clock.Now(), req, text, finish)})
	b.answered++
}

// finalize ends b in status final: the lines left unfinished are filed as
// such, and an OpenAI batch gets its output and error files.
func (s *Server) finalize(b *mockBatch, final string) {
	for _, i := range b.order[b.done:] {
		if line := b.format.unfinished(b, i, final); line != nil {
			b.results = append(b.results, batchRecord{line: line})
		}
		b.unfinished++
	}
	now := s.cfg.Clock.Now()
	if _, ok := b.format.(openAIBatch); ok {
		var out, failed [][]byte
		for _, r := range b.results {
			if r.ok {
				out = append(out, r.line)
			} else {
				failed = append(failed, r.line)
			}
		}
		write := func(lines [][]byte) string {
			if len(lines) == 0 {
				return ""
			}
			f := &mockFile{id: s.batch.nextID("file"), filename: b.id + ".jsonl", purpose: "batch_output", createdAt: now,
				bytes: append(bytes.Join(lines, []byte("\n")), '\n')}
			s.batch.files[f.id] = f
			return f.id
		}
		b.outputFileID, b.errorFileID = write(out), write(failed)
	}
	b.status, b.finishedAt = final, now
}

// openAIBatch is the OpenAI Batch API's format.
type openAIBatch struct{}

func (openAIBatch) parse(s *Server, body json.RawMessage) (chatRequest, *apiError, int) {
	return openAI{}.parse(s, body)
}

func (openAIBatch) line(b *mockBatch, i int, response, errObj any) []byte {
	reqID := fmt.Sprintf("batch_req_%s_%d", b.id, i)
	if r, ok := response.(map[string]any); ok {
		r["request_id"] = reqID
	}
	line, _ := json.Marshal(map[string]any{"id": reqID, "custom_id": b.lines[i].customID, "response": response, "error": errObj})
	return line
}

func (f openAIBatch) answer(b *mockBatch, i int, id int64, now time.Time, req chatRequest, text, finish string) []byte {
	return f.line(b, i, map[string]any{"status_code": http.StatusOK, "body": newCompletion(id, now, req, text, finish)}, nil)
}

func (f openAIBatch) failure(b *mockBatch, i int, status int, e apiError) []byte {
	return f.line(b, i, map[string]any{"status_code": status, "body": map[string]apiError{"error": e}}, nil)
}

func (f openAIBatch) unfinished(b *mockBatch, i int, final string) []byte {
	code, msg := "batch_expired", "This request could not be executed before the completion window expired."
	if final == "cancelled" {
		code, msg = "batch_cancelled", "This request was not executed because the batch was cancelled."
	}
	return f.line(b, i, nil, map[string]string{"code": code, "message": msg})
}

// batchObject is b as the API shows it.
func (s *Server) batchObject(b *mockBatch) map[string]any {
	o := map[string]any{
		"id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": b.failure, "input_file_id": b.inputFileID,
		"completion_window": b.window, "status": b.status, "created_at": b.createdAt.Unix(),
		"expires_at": b.createdAt.Add(24 * time.Hour).Unix(), "metadata": b.metadata,
		"output_file_id": nil, "error_file_id": nil,
		"request_counts": map[string]int{"total": len(b.lines), "completed": b.answered, "failed": b.errored + b.unfinished},
	}
	if b.outputFileID != "" {
		o["output_file_id"] = b.outputFileID
	}
	if b.errorFileID != "" {
		o["error_file_id"] = b.errorFileID
	}
	if b.status != "validating" {
		o["in_progress_at"] = b.createdAt.Unix()
	}
	switch b.status {
	case "completed":
		o["completed_at"] = b.finishedAt.Unix()
	case "expired":
		o["expired_at"] = b.finishedAt.Unix()
	case "cancelled":
		o["cancelled_at"] = b.finishedAt.Unix()
	}
	return o
}

func cmpOrString(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func cmpOrDuration(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

// Paid is what a prompt was billed, from a paid log (Config.PaidLog):
// online calls at the full price, batch lines at half.
type Paid struct{ Online, Batch int }

// Calls is every billed answer of the prompt.
func (p Paid) Calls() int { return p.Online + p.Batch }

// ParsePaidLog reads a paid log: per prompt, the answers billed. A line
// cut short by a kill is not counted; any other line that is neither form
// is an error.
func ParsePaidLog(data []byte) (map[string]Paid, error) {
	out := map[string]Paid{}
	lines := strings.Split(string(data), "\n")
	for i, line := range lines {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var prompt string
		if json.Unmarshal([]byte(line), &prompt) == nil {
			p := out[prompt]
			p.Online++
			out[prompt] = p
			continue
		}
		var b struct {
			Prompt string `json:"prompt"`
			Batch  bool   `json:"batch"`
		}
		if err := json.Unmarshal([]byte(line), &b); err != nil || !b.Batch {
			if i == len(lines)-1 {
				break // the last line, cut short
			}
			return nil, fmt.Errorf("paid log line %d: %q is not a billed answer", i+1, line)
		}
		p := out[b.Prompt]
		p.Batch++
		out[b.Prompt] = p
	}
	return out, nil
}
