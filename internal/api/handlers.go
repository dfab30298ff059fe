package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/prompt"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// principal returns the caller, which RequireAuth put in the context.
func principal(r *http.Request) string {
	p, _ := PrincipalFrom(r.Context())
	return p
}

func notFound(w http.ResponseWriter, id string) {
	writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
}

// ownedTask loads the caller's task named in the path. A task of another
// principal is answered exactly like a missing one (404), so its existence
// leaks nothing. A task still awaiting its sheet is answered 409, unless
// the caller handles that (awaiting is then the caller's upload record).
func (s *server) ownedTask(w http.ResponseWriter, r *http.Request) (store.Task, bool) {
	id := r.PathValue("id")
	if !ValidTaskID(id) {
		notFound(w, id)
		return store.Task{}, false
	}
	task, err := pipeline.OwnedTask(r.Context(), s.cfg.Store, principal(r), id)
	if errors.Is(err, store.ErrNotFound) {
		if _, ok := s.ownedUpload(w, r, id); ok {
			writeError(w, http.StatusConflict, "awaiting_upload", "task "+id+" has no sheet yet; upload it first")
		}
		return store.Task{}, false
	}
	if err != nil {
		s.internalError(w, r, "get task", err)
		return store.Task{}, false
	}
	return task, true
}

// ownedUpload loads the caller's upload record of task id, answering 404
// when there is none (or it is another principal's).
func (s *server) ownedUpload(w http.ResponseWriter, r *http.Request, id string) (pipeline.UploadRecord, bool) {
	rec, err := pipeline.LoadUpload(r.Context(), s.cfg.Blobs, id)
	if errors.Is(err, blob.ErrNotFound) || (err == nil && rec.Owner != principal(r)) {
		notFound(w, id)
		return pipeline.UploadRecord{}, false
	}
	if err != nil {
		s.internalError(w, r, "load upload record", err)
		return pipeline.UploadRecord{}, false
	}
	return rec, true
}

// createTask is POST /api/tasks: a multipart form carrying the sheet, or a
// JSON body asking for an upload URL.
func (s *server) createTask(w http.ResponseWriter, r *http.Request) {
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mediaType {
	case "multipart/form-data":
		s.createFromForm(w, r)
	case "application/json", "":
		s.createForUpload(w, r)
	default:
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
			"send multipart/form-data with the sheet in field \"file\", or application/json to get an upload URL")
	}
}

// createFromForm takes the sheet in the request: it is checked exactly as
// the CLI checks it before anything is stored or queued.
func (s *server) createFromForm(w http.ResponseWriter, r *http.Request) {
	leave, ok := s.uploading(w, r)
	if !ok {
		return
	}
	defer leave()
	// The form's other fields and part headers fit well within 1 MiB.
	limit := s.cfg.Limits.MaxFileBytes + 1<<20
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength > 0 {
		limit = min(limit, r.ContentLength)
	}
	s.uploadDeadline(w, limit)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "the multipart body cannot be read: "+err.Error())
		return
	}
	var req CreateTaskRequest
	fields := map[string]string{}
	var file string
	defer func() {
		if file != "" {
			os.Remove(file)
		}
	}()
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			s.formError(w, err)
			return
		}
		name := part.FormName()
		switch {
		case name == "file":
			if file != "" {
				writeError(w, http.StatusBadRequest, "invalid_request", "send one file per task")
				return
			}
			req.Filename = SanitizeFilename(part.FileName())
			if err := validFilename(req.Filename); err != nil {
				writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
				return
			}
			file, err = s.receive(part, s.cfg.Limits.MaxFileBytes)
			if err != nil {
				s.receiveError(w, r, req.Filename, err)
				return
			}
		case slices.Contains(formFields, name):
			if _, dup := fields[name]; dup {
				writeError(w, http.StatusBadRequest, "invalid_request", "field "+strconv.Quote(name)+" appears twice")
				return
			}
			b, err := io.ReadAll(io.LimitReader(part, maxFormFieldBytes+1))
			if err != nil {
				s.formError(w, err)
				return
			}
			if len(b) > maxFormFieldBytes {
				writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("field %q is longer than %d bytes", name, maxFormFieldBytes-1))
				return
			}
			fields[name] = string(b)
		default:
			writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("unknown field %q; the fields are file, %s", name, strings.Join(formFields, ", ")))
			return
		}
	}
	if file == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", `field "file" is required: the sheet (.xlsx or .csv)`)
		return
	}
	if err := formRequest(fields, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	spec, terms, ok := s.readCreate(w, req)
	if !ok {
		return
	}
	id := s.cfg.NewID()
	if !ValidTaskID(id) {
		s.internalError(w, r, "create task", fmt.Errorf("NewID returned an invalid task id %q", id))
		return
	}
	rec := pipeline.UploadRecord{TaskID: id, Filename: req.Filename, Spec: spec, Owner: principal(r), Encoding: req.Encoding, Terms: terms, CreatedAt: s.cfg.Clock.Now().UTC()}
	// A sheet sent inside the request creates no task when it is
	// rejected: the answer is the only record, on both runtimes.
	ok, _, rows := s.check(w, file, rec)
	if !ok {
		return
	}
	if !s.admitted(w, r, rec.Owner, rows) {
		return
	}
	s.store(w, r, http.StatusCreated, file, rec)
}

// formFields are the multipart fields besides "file".
var formFields = []string{"prompt", "system", "model", "temperature", "max_tokens", "batch_size", "encoding", "result_format", "columns", "rows_per_call", "max_cost_usd", "mode", "deadline", "sample"}

// formRequest fills req from the form's text fields.
func formRequest(fields map[string]string, req *CreateTaskRequest) error {
	req.Prompt, req.System, req.Model, req.Encoding = fields["prompt"], fields["system"], fields["model"], strings.TrimSpace(fields["encoding"])
	req.ResultFormat = fields["result_format"]
	req.Mode, req.Deadline = strings.TrimSpace(fields["mode"]), strings.TrimSpace(fields["deadline"])
	if v := fields["columns"]; strings.TrimSpace(v) != "" {
		// As text: the short form or JSON (schema.ParseText, by way of
		// specFor's schema.ParseJSON).
		req.Columns, _ = json.Marshal(v) // a string always marshals
	}
	if v, ok := fields["temperature"]; ok && strings.TrimSpace(v) != "" {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return fmt.Errorf("temperature %q: must be a number between 0 and 2", v)
		}
		req.Temperature = &f
	}
	if v, ok := fields["max_cost_usd"]; ok && strings.TrimSpace(v) != "" {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return fmt.Errorf("max_cost_usd %q: must be an amount in USD", v)
		}
		req.MaxCostUSD = &f
	}
	for name, dst := range map[string]*int{"max_tokens": &req.MaxTokens, "batch_size": &req.BatchSize, "rows_per_call": &req.RowsPerCall, "sample": &req.Sample} {
		if v, ok := fields[name]; ok && strings.TrimSpace(v) != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("%s %q: must be a whole number", name, v)
			}
			*dst = n
		}
	}
	return nil
}

// formError answers a broken multipart body, 413 when it is too long.
func (s *server) formError(w http.ResponseWriter, err error) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, "file_too_large", s.tooLargeMessage())
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.uploadTimedOut(w)
		return
	}
	writeError(w, http.StatusBadRequest, "invalid_request", "the multipart body cannot be read")
}

// uploadDeadline gives the request's body size bytes to arrive: the grace,
// plus the size at the slowest rate accepted. A client trickling a body
// cannot hold a connection (and a temporary file) open for ever. Where the
// server cannot set deadlines (API Gateway, which bounds a request
// itself), nothing changes.
func (s *server) uploadDeadline(w http.ResponseWriter, size int64) {
	d := s.cfg.UploadGrace + time.Duration(float64(size)/float64(s.cfg.UploadRate)*float64(time.Second))
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
}

// uploadTimedOut answers an upload cut by its deadline.
func (s *server) uploadTimedOut(w http.ResponseWriter) {
	writeError(w, http.StatusRequestTimeout, "upload_timeout", fmt.Sprintf(
		"the upload did not arrive in time: a sheet gets %s plus a second for each %d KiB; send it over a faster connection",
		s.cfg.UploadGrace, s.cfg.UploadRate>>10))
}

func (s *server) tooLargeMessage() string {
	return fmt.Sprintf("the sheet is larger than this deployment's limit of %d bytes", s.cfg.Limits.MaxFileBytes)
}

// errFileTooLarge is a received file over the limit.
var errFileTooLarge = errors.New("file over the size limit")

// receive copies at most limit bytes of body to a temporary file, returning
// errFileTooLarge past the limit.
func (s *server) receive(body io.Reader, limit int64) (string, error) {
	f, err := os.CreateTemp(s.cfg.TempDir, "batchgen-upload-*")
	if err != nil {
		return "", fmt.Errorf("create temporary file: %w", err)
	}
	n, err := io.Copy(f, io.LimitReader(body, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > limit {
		err = errFileTooLarge
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

func (s *server) receiveError(w http.ResponseWriter, r *http.Request, filename string, err error) {
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, errFileTooLarge), errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, "file_too_large", filename+": "+s.tooLargeMessage())
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.uploadTimedOut(w)
	case errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "invalid_request", filename+": the upload was cut short")
	default:
		s.internalError(w, r, "receive upload", err)
	}
}

// check validates the received sheet with the core's own validation, the
// one `batchgen run` calls, and answers the CLI's message when it is
// rejected: 415 for content that is no spreadsheet (judged by its bytes,
// not its name), 413 for limits of size, 400 for the rest. It reports
// whether the sheet passed, and whether it was rejected (rather than
// failed to be read for an internal reason).
func (s *server) check(w http.ResponseWriter, file string, rec pipeline.UploadRecord) (ok, rejected bool, rows int) {
	v, err := pipeline.Validate(pipeline.SplitParams{
		TaskID: rec.TaskID, Path: file, Source: rec.Filename, Owner: rec.Owner, Spec: rec.Spec, Encoding: rec.Encoding,
		Limits:        sheet.Limits{MaxRows: s.cfg.Limits.MaxRows, MaxFileBytes: s.cfg.Limits.MaxFileBytes},
		DefaultPrompt: s.cfg.DefaultSpec.Prompt, DefaultColumns: s.cfg.DefaultSpec.Columns,
	})
	var rej *pipeline.RejectedError
	switch {
	case err == nil:
		return true, false, v.Summary.Rows
	case errors.As(err, &rej) && errors.Is(err, sheet.ErrUnsupportedFormat):
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", rej.Error())
	case errors.As(err, &rej) && errors.Is(err, sheet.ErrFileTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "file_too_large", rej.Error())
	case errors.As(err, &rej):
		writeError(w, http.StatusBadRequest, "rejected_input", rej.Error())
	default:
		s.cfg.Logger.Error("api: validate upload", "task_id", rec.TaskID, "error", err)
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return false, false, 0
	}
	return false, true, 0
}

// admitted checks a new task of owner with rows rows against the principal
// limits and answers the refusal if there is one.
func (s *server) admitted(w http.ResponseWriter, r *http.Request, owner string, rows int) bool {
	refused, err := s.admit(r.Context(), owner, rows)
	if err != nil {
		s.internalError(w, r, "check the principal limits", err)
		return false
	}
	if refused != nil {
		s.cfg.Logger.Info("task refused: principal limit", "owner", owner, "reason", refused.message)
		refused.write(w)
		return false
	}
	return true
}

// store puts a checked sheet where the splitter takes it
// (incoming/<id>/<name>) with its upload record, splits it at once when
// the runtime has an Intake, and answers with the task.
func (s *server) store(w http.ResponseWriter, r *http.Request, status int, file string, rec pipeline.UploadRecord) {
	ctx := r.Context()
	rec.Uploaded, rec.Size = true, 0
	key, err := s.keep(r, file, rec)
	if err != nil {
		s.internalError(w, r, "store upload", err)
		return
	}
	s.cfg.Logger.Info("task uploaded", "task_id", rec.TaskID, "owner", rec.Owner, "filename", rec.Filename)
	w.Header().Set("Location", "/api/tasks/"+rec.TaskID)
	if s.cfg.Intake == nil {
		WriteJSON(w, status, s.recordView(rec))
		return
	}
	res, err := s.cfg.Intake.Accept(ctx, key, "api")
	if err != nil {
		s.internalError(w, r, "split upload", err)
		return
	}
	task, err := s.cfg.Store.GetTask(ctx, rec.TaskID)
	if err != nil {
		s.internalError(w, r, "get task", err)
		return
	}
	if res.Outcome == pipeline.IntakeRejected {
		writeError(w, http.StatusBadRequest, "rejected_input", task.Error)
		return
	}
	WriteJSON(w, status, s.viewOf(task))
}

// keep puts a received sheet where the splitter takes it
// (incoming/<id>/<name>), after its upload record: the object's arrival
// starts the splitter, which looks the record up. It returns the key.
func (s *server) keep(r *http.Request, file string, rec pipeline.UploadRecord) (string, error) {
	if err := s.putRecord(r, rec); err != nil {
		return "", fmt.Errorf("write upload record: %w", err)
	}
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("open upload: %w", err)
	}
	defer f.Close()
	key := pipeline.IncomingKey(rec.TaskID, rec.Filename)
	if err := s.cfg.Blobs.Put(r.Context(), key, f); err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	return key, nil
}

// recordRejected ends a task whose uploaded sheet check rejected as AWS
// ends it: there the bucket takes any bytes of the signed size and the
// splitter refuses them, so the task is FAILED with the reason (and
// listed so) rather than waiting for an upload forever. The same intake
// records it here, after the PUT has been answered with the reason.
func (s *server) recordRejected(r *http.Request, file string, rec pipeline.UploadRecord) {
	if s.cfg.Intake == nil {
		return
	}
	rec.Uploaded, rec.Size = true, 0
	key, err := s.keep(r, file, rec)
	if err == nil {
		_, err = s.cfg.Intake.Accept(r.Context(), key, "api")
	}
	if err != nil {
		s.cfg.Logger.Error("api: record a rejected upload", "task_id", rec.TaskID, "error", err)
	}
}

func (s *server) putRecord(r *http.Request, rec pipeline.UploadRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode upload record: %w", err)
	}
	return s.cfg.Blobs.Put(r.Context(), pipeline.UploadRecordKey(rec.TaskID), bytes.NewReader(b))
}

// createForUpload is the JSON form of POST /api/tasks: it records the
// request and answers with where to upload the sheet.
func (s *server) createForUpload(w http.ResponseWriter, r *http.Request) {
	var req CreateTaskRequest
	if !s.decodeJSON(w, r, &req) {
		return
	}
	if err := validFilename(req.Filename); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	spec, terms, ok := s.readCreate(w, req)
	if !ok {
		return
	}
	size, err := s.uploadSize(req)
	var tooBig *tooLargeError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, "file_too_large", err.Error())
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if !s.admitted(w, r, principal(r), 0) {
		return
	}
	contentType := UploadContentType(req.Filename)
	ctx := r.Context()
	id := s.cfg.NewID()
	if !ValidTaskID(id) {
		s.internalError(w, r, "create task", fmt.Errorf("NewID returned an invalid task id %q", id))
		return
	}
	now := s.cfg.Clock.Now().UTC()
	rec := pipeline.UploadRecord{TaskID: id, Filename: req.Filename, Spec: spec, Owner: principal(r), Size: size, Encoding: req.Encoding, Terms: terms, CreatedAt: now}
	url := s.cfg.PublicURL + "/api/tasks/" + id + "/upload"
	if s.cfg.Presigner != nil {
		// Presign before writing the record: signing is local and cheap,
		// and a failure then leaves nothing behind.
		url, err = s.cfg.Presigner.PresignPut(ctx, pipeline.IncomingKey(id, req.Filename), s.cfg.UploadTTL, size, contentType)
		if err != nil {
			s.internalError(w, r, "presign upload", err)
			return
		}
	}
	if err := s.putRecord(r, rec); err != nil {
		s.internalError(w, r, "write upload record", err)
		return
	}
	s.cfg.Logger.Info("task created; awaiting upload", "task_id", id, "owner", rec.Owner, "filename", req.Filename)
	w.Header().Set("Location", "/api/tasks/"+id)
	WriteJSON(w, http.StatusCreated, CreateTaskResponse{
		TaskView: s.recordView(rec), UploadURL: url, UploadMethod: http.MethodPut, ExpiresAt: now.Add(s.cfg.UploadTTL),
		UploadHeaders: map[string]string{"Content-Type": contentType, "Content-Length": strconv.FormatInt(size, 10)},
	})
}

// uploadTask is PUT /api/tasks/{id}/upload: the sheet of a task created
// with the JSON form of POST /api/tasks, of the size declared there.
func (s *server) uploadTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !ValidTaskID(id) {
		notFound(w, id)
		return
	}
	rec, ok := s.ownedUpload(w, r, id)
	if !ok {
		return
	}
	if _, err := s.cfg.Store.GetTask(r.Context(), id); rec.Uploaded || err == nil {
		writeError(w, http.StatusConflict, "already_uploaded", "task "+id+" already has its sheet")
		return
	} else if !errors.Is(err, store.ErrNotFound) {
		s.internalError(w, r, "get task", err)
		return
	}
	if r.ContentLength >= 0 && r.ContentLength != rec.Size {
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("the body is %d bytes; task %s was created for %d", r.ContentLength, id, rec.Size))
		return
	}
	leave, ok := s.uploading(w, r)
	if !ok {
		return
	}
	defer leave()
	s.uploadDeadline(w, rec.Size)
	file, err := s.receive(http.MaxBytesReader(w, r.Body, rec.Size), rec.Size)
	if err != nil {
		s.receiveError(w, r, rec.Filename, err)
		return
	}
	defer os.Remove(file)
	if fi, err := os.Stat(file); err != nil || fi.Size() != rec.Size {
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("the body is not the %d bytes task %s was created for", rec.Size, id))
		return
	}
	if ok, rejected, _ := s.check(w, file, rec); !ok {
		if rejected {
			s.recordRejected(r, file, rec)
		}
		return
	}
	s.store(w, r, http.StatusOK, file, rec)
}

// tooLargeError is a declared size over the deployment's input limit.
type tooLargeError struct{ size, limit int64 }

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("size is %d bytes; the largest sheet this deployment accepts is %d bytes", e.size, e.limit)
}

// uploadSize checks the request's declared size: required, at least one
// byte, at most the file limit (a *tooLargeError past it).
func (s *server) uploadSize(req CreateTaskRequest) (int64, error) {
	switch {
	case req.Size == nil:
		return 0, errors.New(`size is required: the sheet's length in bytes (e.g. "size": 18342); the upload URL is signed for exactly that length`)
	case *req.Size < 1:
		return 0, fmt.Errorf("size %d: must be the sheet's length in bytes, at least 1", *req.Size)
	case *req.Size > s.cfg.Limits.MaxFileBytes:
		return 0, &tooLargeError{size: *req.Size, limit: s.cfg.Limits.MaxFileBytes}
	}
	return *req.Size, nil
}

// limitError is a request over one of the deployment's Limits: 400 with
// its own code, so a client can tell a policy from a typo.
type limitError struct{ msg string }

func (e *limitError) Error() string { return e.msg }

// readCreate reads a create request's spec and terms, or answers why it
// cannot (ok false): both forms of POST /api/tasks read them alike.
func (s *server) readCreate(w http.ResponseWriter, req CreateTaskRequest) (spec store.TaskSpec, terms store.Terms, ok bool) {
	spec, err := s.specFor(req)
	if err == nil {
		terms, err = s.terms(req)
	}
	var limit *limitError
	switch {
	case errors.As(err, &limit):
		writeError(w, http.StatusBadRequest, "limit_exceeded", err.Error())
	case err != nil:
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
	}
	return spec, terms, err == nil
}

// encodingPattern bounds an encoding name; the sheet reader decides which
// names it knows.
var encodingPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,40}$`)

// boundedCount is a request's optional count named name: 0 takes def, a
// negative one is refused, and one over the deployment's limit is a
// *limitError.
func boundedCount(name string, v, limit, def int) (int, error) {
	switch {
	case v < 0:
		return 0, fmt.Errorf("%s %d: must be at least 1 (0 for the default)", name, v)
	case v > limit:
		return 0, &limitError{fmt.Sprintf("%s %d: this deployment allows at most %d", name, v, limit)}
	case v == 0:
		return def, nil
	}
	return v, nil
}

// specFor validates a request's settings against the deployment's limits
// and completes them with its defaults. Its errors are meant for the
// client.
func (s *server) specFor(req CreateTaskRequest) (store.TaskSpec, error) {
	def, lim := s.cfg.DefaultSpec, s.cfg.Limits
	spec := store.TaskSpec{
		Prompt:      req.Prompt,
		System:      req.System,
		Provider:    def.Provider,
		Model:       req.Model,
		Temperature: req.Temperature,
		TopP:        def.TopP,
		MaxTokens:   req.MaxTokens,
		BatchSize:   req.BatchSize,
	}
	if len(req.Prompt) > maxPromptBytes {
		return spec, fmt.Errorf("prompt is %d bytes; the limit is %d", len(req.Prompt), maxPromptBytes)
	}
	if strings.TrimSpace(req.Prompt) != "" {
		if _, err := prompt.Parse(req.Prompt); err != nil {
			return spec, err
		}
	}
	if len(req.System) > maxPromptBytes {
		return spec, fmt.Errorf("system is %d bytes; the limit is %d", len(req.System), maxPromptBytes)
	}
	if !utf8.ValidString(req.System) {
		return spec, errors.New("system is not valid UTF-8")
	}
	if spec.System == "" {
		spec.System = def.System
	}
	if len(req.Model) > maxModelBytes || strings.ContainsFunc(req.Model, unicode.IsControl) {
		return spec, fmt.Errorf("model %.40q is not a model name", req.Model)
	}
	if req.Model != "" && req.Model != def.Model && lim.ModelFixed != "" {
		return spec, &limitError{fmt.Sprintf("model %q: %s; leave model out", req.Model, lim.ModelFixed)}
	}
	if req.Model != "" && req.Model != def.Model && len(lim.Models) > 0 && !slices.Contains(lim.Models, req.Model) {
		return spec, &limitError{fmt.Sprintf("model %q is not allowed here; allowed: %s", req.Model, strings.Join(lim.Models, ", "))}
	}
	if req.Model != "" && req.Model != def.Model && len(lim.Models) == 0 {
		// Without an allow-list a token holder could name the most
		// expensive model on the operator's key: only the default runs.
		return spec, &limitError{fmt.Sprintf("model %q: this deployment runs only its default model %q; leave model out, or ask its operator to allow more (--allow-models, or the stack's AllowedModels)", req.Model, def.Model)}
	}
	if spec.Model == "" {
		spec.Model = def.Model
	}
	if t := req.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 2) {
		return spec, fmt.Errorf("temperature %v: must be between 0 and 2", *t)
	}
	if spec.Temperature == nil {
		spec.Temperature = def.Temperature
	}
	var err error
	if spec.MaxTokens, err = boundedCount("max_tokens", req.MaxTokens, lim.MaxTokens, def.MaxTokens); err != nil {
		return spec, err
	}
	if spec.BatchSize, err = boundedCount("batch_size", req.BatchSize, lim.MaxBatchSize, def.BatchSize); err != nil {
		return spec, err
	}
	if req.Encoding != "" && !encodingPattern.MatchString(req.Encoding) {
		return spec, fmt.Errorf("encoding %.40q is not an encoding name (e.g. utf-8, gb18030, windows-1252)", req.Encoding)
	}
	format, err := store.ParseResultFormat(req.ResultFormat)
	if err != nil {
		return spec, fmt.Errorf("result_format: %.60s", err.Error())
	}
	spec.ResultFormat = format
	if spec.RowsPerCall, err = boundedCount("rows_per_call", req.RowsPerCall, schema.MaxRowsPerCall, def.RowsPerCall); err != nil {
		return spec, err
	}
	if spec.RowsPerCall == 1 {
		spec.RowsPerCall = 0 // one row a call, as without the field
	}
	// Without columns here, the workbook's (its prompt sheet), else the
	// deployment's: SplitParams.DefaultColumns.
	if spec.Columns, err = schema.ParseJSON(req.Columns); err != nil {
		return spec, fmt.Errorf("columns: %w", err)
	}
	return spec, nil
}

// SanitizeFilename reduces a client's file name to a plain name that is
// safe inside an object key or a data directory: the last segment of any
// path (either slash), without control characters, surrounding spaces or
// leading dots. The result may still be refused (no sheet extension,
// empty); validFilename decides.
func SanitizeFilename(name string) string {
	if i := strings.LastIndexAny(name, `/\`); i >= 0 {
		name = name[i+1:]
	}
	name = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return -1
		}
		return r
	}, name)
	name = strings.TrimLeft(strings.TrimSpace(name), ".")
	if len(name) > maxFilenameBytes {
		ext := path.Ext(name)
		name = strings.ToValidUTF8(name[:maxFilenameBytes-len(ext)], "") + ext
	}
	return name
}

// validFilename accepts a plain file name (no directories) ending in .xlsx
// or .csv, which is what the upload notification forwards to the splitter.
func validFilename(name string) error {
	switch {
	case name == "":
		return errors.New("filename is required, e.g. \"products.xlsx\"")
	case len(name) > maxFilenameBytes:
		return fmt.Errorf("filename is %d bytes; the limit is %d", len(name), maxFilenameBytes)
	case !utf8.ValidString(name):
		return errors.New("filename is not valid UTF-8")
	case strings.ContainsAny(name, `/\`) || strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("filename %q: use a plain file name without folders or control characters", name)
	case strings.TrimSpace(name) != name || strings.HasPrefix(name, "."):
		return fmt.Errorf("filename %q: must not start with a dot or start or end with spaces", name)
	}
	if !sheet.IsSheetName(name) {
		return fmt.Errorf("filename %q: only .xlsx, .xlsm, .csv and .tsv sheets are accepted", name)
	}
	return nil
}

// cancelTask stops a task: no new row starts (running batches see the state
// within seconds), rows in flight finish, and the export writes a partial
// result that marks the rows that never ran not_started.
func (s *server) cancelTask(w http.ResponseWriter, r *http.Request) {
	owned, ok := s.ownedTask(w, r)
	if !ok {
		return
	}
	id := owned.ID
	var exports pipeline.ExportStarter
	if s.cfg.Exports != nil {
		exports = s.cfg.Exports
	}
	task, err := pipeline.Cancel(r.Context(), s.cfg.Store, pipeline.CancelParams{
		TaskID: id, Reason: "cancelled through the API", Now: s.cfg.Clock.Now(), Exports: exports,
	})
	var state *pipeline.StateError
	var export *pipeline.ExportNotStartedError
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, id)
		return
	case errors.As(err, &state):
		writeError(w, http.StatusConflict, "conflict", state.Error())
		return
	case errors.As(err, &export):
		// The task is cancelled; the sweeper starts the export later.
		s.cfg.Logger.Warn("start export of a cancelled task failed; the sweeper will retry", "task_id", id, "error", export.Err)
	case err != nil:
		s.internalError(w, r, "cancel task", err)
		return
	}
	WriteJSON(w, http.StatusAccepted, s.viewOf(task))
}

// retryRequest is the optional body of POST /api/tasks/{id}/retry.
type retryRequest struct {
	// ErrorClass, when set, reruns only rows that failed with this class
	// (e.g. "content_filter", "retry_exhausted", "stuck").
	ErrorClass string `json:"error_class"`
	termsRequest
}

// termsRequest changes a task's terms, on a retry or a start.
type termsRequest struct {
	// MaxCostUSD, when set, is the task's spending cap from now on (0
	// removes it): a task stopped at its cap runs the rest with a higher
	// one.
	MaxCostUSD *float64 `json:"max_cost_usd"`
	// Mode and Deadline, when Mode is set, are the task's mode and (for
	// auto) deadline from now on, as a create takes them: a task waiting
	// in economy can be finished online.
	Mode     string `json:"mode"`
	Deadline string `json:"deadline"`
}

// termsChange reads req into the change it makes to a task's terms; nil
// when it changes nothing.
func (s *server) termsChange(req termsRequest) (func(*store.Terms), error) {
	if req.MaxCostUSD == nil && req.Mode == "" && req.Deadline == "" {
		return nil, nil
	}
	maxCost, err := s.maxCost(req.MaxCostUSD)
	if err != nil {
		return nil, err
	}
	var mode store.Mode
	var deadline time.Time
	if req.Mode != "" || req.Deadline != "" {
		if mode, deadline, err = s.mode(req.Mode, req.Deadline); err != nil {
			return nil, err
		}
	}
	return func(t *store.Terms) {
		if req.MaxCostUSD != nil {
			t.MaxCost = maxCost
		}
		if req.Mode != "" || req.Deadline != "" {
			t.Mode, t.Deadline = mode, deadline
		}
	}, nil
}

// terms reads a create request's cap, mode and deadline.
func (s *server) terms(req CreateTaskRequest) (store.Terms, error) {
	maxCost, err := s.maxCost(req.MaxCostUSD)
	if err != nil {
		return store.Terms{}, err
	}
	mode, deadline, err := s.mode(req.Mode, req.Deadline)
	if err != nil {
		return store.Terms{}, err
	}
	if err := pipeline.CheckSample("sample", req.Sample); err != nil {
		return store.Terms{}, err
	}
	if req.Sample > 0 && s.cfg.Starter == nil {
		return store.Terms{}, errors.New("sample: this deployment cannot hold a task for a quote")
	}
	return store.Terms{MaxCost: maxCost, Mode: mode, Deadline: deadline, Sample: req.Sample}, nil
}

// mode reads a request's mode and deadline (pipeline.ParseModeDeadline),
// refusing a batch mode this deployment cannot run.
func (s *server) mode(m, deadline string) (store.Mode, time.Time, error) {
	mode, t, err := pipeline.ParseModeDeadline(m, deadline, s.cfg.Clock.Now())
	if err == nil && mode.Batched() && !s.cfg.Limits.BatchModes {
		return "", time.Time{}, fmt.Errorf("mode %s: this deployment runs tasks online only", mode)
	}
	return mode, t, err
}

// maxCost reads a request's spending cap: 0 when absent; an error for an
// amount that is not one, or for a cap this deployment cannot hold.
func (s *server) maxCost(v *float64) (float64, error) {
	if v == nil {
		return 0, nil
	}
	if err := pipeline.CheckMaxCost("max_cost_usd", *v); err != nil {
		return 0, err
	}
	if *v > 0 && !s.cfg.Limits.CostCaps {
		return 0, errors.New("max_cost_usd: this deployment cannot hold a task to a spending cap")
	}
	return *v, nil
}

// errorClassPattern bounds an error class to what classes look like.
var errorClassPattern = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// retryTask reruns the failed rows of a finished or cancelled task (all, or
// those of one error class): succeeded rows keep their results and are
// never billed again, the task goes back to RUNNING and is exported again
// under its next export generation when its batches finish.
func (s *server) retryTask(w http.ResponseWriter, r *http.Request) {
	owned, ok := s.ownedTask(w, r)
	if !ok {
		return
	}
	id := owned.ID
	if s.cfg.Retrier == nil {
		writeError(w, http.StatusNotImplemented, "not_implemented", "this deployment cannot retry tasks")
		return
	}
	var req retryRequest
	if !s.decodeOptionalJSON(w, r, &req) {
		return
	}
	if req.ErrorClass != "" && !errorClassPattern.MatchString(req.ErrorClass) {
		writeError(w, http.StatusBadRequest, "invalid_request", "error_class must be 1 to 64 lower-case letters, digits or underscores")
		return
	}
	ctx := r.Context()
	change, err := s.termsChange(req.termsRequest)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if change != nil {
		_, err = store.UpdateTerms(ctx, s.cfg.Store, id, change)
		if errors.Is(err, store.ErrNotFound) {
			notFound(w, id)
			return
		} else if err != nil {
			s.internalError(w, r, "set the task's terms", err)
			return
		}
	}
	out, err := s.cfg.Retrier.Retry(ctx, pipeline.RetryParams{TaskID: id, ErrorClass: req.ErrorClass, Now: s.cfg.Clock.Now()})
	task, n := out.Task, out.Batches
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, id)
		return
	case errors.Is(err, store.ErrConflict):
		cur, gerr := s.cfg.Store.GetTask(ctx, id)
		if gerr != nil {
			s.internalError(w, r, "get task", gerr)
			return
		}
		writeError(w, http.StatusConflict, "conflict", "task "+id+" is "+string(cur.State)+"; only a finished or cancelled task can be retried")
		return
	case err != nil && task.ID == "":
		s.internalError(w, r, "retry task", err)
		return
	case err != nil:
		// Reopened, but the messages were not all sent: the sweeper
		// re-enqueues the batches that wait.
		s.cfg.Logger.Warn("retry: enqueue failed; the sweeper will re-enqueue", "task_id", id, "error", err)
		WriteJSON(w, http.StatusAccepted, s.viewOf(task))
		return
	}
	if n == 0 {
		what := "no failed rows"
		if req.ErrorClass != "" {
			what += " of class " + req.ErrorClass
		}
		writeError(w, http.StatusConflict, "nothing_to_retry", "task "+id+" has "+what)
		return
	}
	WriteJSON(w, http.StatusAccepted, s.viewOf(task))
}

// getTask is GET /api/tasks/{id}: the task's status, counts, rate, ETA and,
// on AWS, a presigned link to a finished task's result.
func (s *server) getTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !ValidTaskID(id) {
		notFound(w, id)
		return
	}
	ctx := r.Context()
	task, err := pipeline.OwnedTask(ctx, s.cfg.Store, principal(r), id)
	if errors.Is(err, store.ErrNotFound) {
		if rec, ok := s.ownedUpload(w, r, id); ok {
			WriteJSON(w, http.StatusOK, s.recordView(rec))
		}
		return
	}
	if err != nil {
		s.internalError(w, r, "get task", err)
		return
	}
	view := s.viewOf(s.live(ctx, task))
	if s.cfg.Presigner != nil && task.HasResult() {
		url, err := s.cfg.Presigner.PresignGet(ctx, task.ResultKey, s.cfg.DownloadTTL)
		if err != nil {
			s.internalError(w, r, "presign result", err)
			return
		}
		expires := s.cfg.Clock.Now().UTC().Add(s.cfg.DownloadTTL)
		view.ResultURL, view.ResultExpiresAt = url, &expires
	}
	WriteJSON(w, http.StatusOK, view)
}

// resultFormatName names a spec's result format as requests do.
func resultFormatName(spec store.TaskSpec) string {
	return strings.TrimPrefix(spec.ResultFormat.Ext(), ".")
}

// getResult is GET /api/tasks/{id}/result: the result workbook, streamed
// (embedded) or by a redirect to a presigned URL (AWS); 409 while there is
// none yet.
func (s *server) getResult(w http.ResponseWriter, r *http.Request) {
	task, ok := s.ownedTask(w, r)
	if !ok {
		return
	}
	if !task.HasResult() {
		code, msg := "not_finished", "task "+task.ID+" is "+string(task.State)+"; its result is not ready"
		if task.State == store.TaskFailed {
			code, msg = "no_result", "task "+task.ID+" failed and has no result: "+task.Error
		} else if task.State.Final() {
			msg = "task " + task.ID + " is " + string(task.State) + "; its result is still being written"
		}
		writeError(w, http.StatusConflict, code, msg)
		return
	}
	ctx := r.Context()
	if s.cfg.Presigner != nil {
		url, err := s.cfg.Presigner.PresignGet(ctx, task.ResultKey, s.cfg.DownloadTTL)
		if err != nil {
			s.internalError(w, r, "presign result", err)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, url, http.StatusFound)
		return
	}
	rc, err := s.cfg.Blobs.Open(ctx, task.ResultKey)
	if errors.Is(err, blob.ErrNotFound) {
		writeError(w, http.StatusGone, "result_gone", "the result of task "+task.ID+" has expired; drop the sheet again to write it again")
		return
	}
	if err != nil {
		s.internalError(w, r, "open result", err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", task.Spec.ResultFormat.ContentType())
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": resultFilename(task)}))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// The status is sent; all that is left is to log.
		s.cfg.Logger.Warn("api: stream result", "task_id", task.ID, "error", err)
	}
}

// resultFilename names a download after its input: products.xlsx ->
// products.result.xlsx.
func resultFilename(t store.Task) string {
	base := SanitizeFilename(path.Base(strings.ReplaceAll(t.Source, `\`, "/")))
	base = strings.TrimSuffix(base, path.Ext(base))
	if base == "" {
		base = t.ID
	}
	return base + ".result" + t.Spec.ResultFormat.Ext()
}

// previewTask is GET /api/tasks/{id}/preview: the first rows (?limit=,
// default 10, at most 100) as they stand, input columns then output, status
// and error, so a page can show them while the task runs.
func (s *server) previewTask(w http.ResponseWriter, r *http.Request) {
	limit, ok := intParam(w, r, "limit", defaultPreviewRows, maxPreviewRows)
	if !ok {
		return
	}
	task, ok := s.ownedTask(w, r)
	if !ok {
		return
	}
	rows, err := s.cfg.Store.ListRows(r.Context(), store.ListRowsParams{TaskID: task.ID, FromNo: 1, Limit: limit})
	if err != nil {
		s.internalError(w, r, "list rows", err)
		return
	}
	out := Preview{ID: task.ID, Status: string(task.State), RowsTotal: task.RowsTotal, Rows: make([][]string, 0, len(rows))}
	answers := pipeline.AnswerColumns(task.Spec.Columns, task.Header)
	out.Columns = append(append(append(out.Columns, task.Header...), answers...), "status", "error")
	for _, row := range rows {
		cells := make([]string, len(task.Header), len(task.Header)+len(answers)+2)
		copy(cells, row.Values)
		out.Rows = append(out.Rows, append(append(cells, pipeline.AnswerTexts(task.Spec.Columns, row)...), string(row.State), row.Error))
	}
	WriteJSON(w, http.StatusOK, out)
}

// intParam reads an optional integer query parameter in [1, maximum].
func intParam(w http.ResponseWriter, r *http.Request, name string, def, maximum int) (int, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maximum {
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("%s %q: must be between 1 and %d", name, v, maximum))
		return 0, false
	}
	return n, true
}

// listTasks is GET /api/tasks: the caller's tasks, newest first, a page at
// a time (?limit=, ?cursor= from next_cursor).
func (s *server) listTasks(w http.ResponseWriter, r *http.Request) {
	limit, ok := intParam(w, r, "limit", defaultListLimit, maxListLimit)
	if !ok {
		return
	}
	after, err := decodeCursor(r.URL.Query().Get("cursor"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "cursor is not one this API issued; use next_cursor as given")
		return
	}
	page, err := pipeline.ListOwnedTasks(r.Context(), s.cfg.Store, principal(r), after, limit)
	if err != nil {
		s.internalError(w, r, "list tasks", err)
		return
	}
	out := TaskList{Tasks: make([]TaskView, 0, len(page.Tasks))}
	for _, t := range page.Tasks {
		out.Tasks = append(out.Tasks, s.viewOf(s.live(r.Context(), t)))
	}
	if page.Next.ID != "" {
		out.NextCursor = encodeCursor(page.Next)
	}
	WriteJSON(w, http.StatusOK, out)
}

// cursorJSON is a TaskCursor as clients carry it (base64url JSON, opaque to
// them).
type cursorJSON struct {
	CreatedAt time.Time `json:"c"`
	ID        string    `json:"i"`
}

func encodeCursor(c store.TaskCursor) string {
	b, _ := json.Marshal(cursorJSON{CreatedAt: c.CreatedAt.UTC(), ID: c.ID}) // plain struct: cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (store.TaskCursor, error) {
	if s == "" {
		return store.TaskCursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.TaskCursor{}, err
	}
	var c cursorJSON
	if err := json.Unmarshal(b, &c); err != nil {
		return store.TaskCursor{}, err
	}
	if !ValidTaskID(c.ID) {
		return store.TaskCursor{}, errors.New("bad task id in cursor")
	}
	return store.TaskCursor{CreatedAt: c.CreatedAt, ID: c.ID}, nil
}

// recordView shows a task that exists only as its upload record.
func (s *server) recordView(rec pipeline.UploadRecord) TaskView {
	status := StateAwaitingUpload
	if rec.Uploaded {
		status = StateUploaded
	}
	v := TaskView{
		ID: rec.TaskID, Status: status, Source: rec.Filename, Encoding: rec.Encoding, ResultFormat: resultFormatName(rec.Spec), Columns: rec.Spec.Columns, RowsPerCall: rec.Spec.RowsPerCall,
		Provider: rec.Spec.Provider, Model: rec.Spec.Model, CreatedAt: rec.CreatedAt.UTC(), Links: s.linksOf(rec.TaskID),
	}
	if !rec.Uploaded {
		v.Links.Upload = v.Links.Self + "/upload"
	}
	return v
}

// live is t with the rows done as saved so far (pipeline.LiveCounts), or
// t as it is when they cannot be read: a status is better a batch behind
// than not shown.
func (s *server) live(ctx context.Context, t store.Task) store.Task {
	lt, err := pipeline.LiveCounts(ctx, s.cfg.Store, t)
	if err != nil && ctx.Err() == nil {
		s.cfg.Logger.Warn("task progress: batch counts unread; showing finished batches only", "task_id", t.ID, "error", err)
	}
	return lt
}

func (s *server) viewOf(t store.Task) TaskView {
	v := TaskView{
		ID: t.ID, Status: string(t.State), Source: t.Source, Sheet: t.Sheet, Encoding: t.Encoding, ResultFormat: resultFormatName(t.Spec), Rerun: t.Rerun,
		Columns: t.Spec.Columns, RowsPerCall: t.Spec.RowsPerCall,
		Provider: t.Spec.Provider, Model: t.Spec.Model,
		RowsTotal: t.RowsTotal, RowsSucceeded: t.RowsSucceeded, RowsFailed: t.RowsFailed, RowsSkipped: t.RowsSkipped,
		BatchesDone: t.BatchesDone, BatchesTotal: t.BatchesTotal, Error: t.Error,
		InputTokens: t.Usage.InputTokens, CachedInputTokens: t.Usage.CachedInputTokens, OutputTokens: t.Usage.OutputTokens,
		CreatedAt: t.CreatedAt.UTC(), Links: s.linksOf(t.ID), Mode: string(t.Mode), Sample: t.Sample,
	}
	if !t.Deadline.IsZero() {
		d := t.Deadline.UTC()
		v.Deadline = &d
	}
	if t.Mode.Batched() && !t.State.Final() && s.cfg.WaitingOn != nil {
		v.WaitingOn = s.cfg.WaitingOn(t.ID)
	}
	if est := s.cfg.Prices.Task(t); est.Known {
		v.EstimatedCost = &est.Cost
		if est.Saved > 0 {
			v.SavedUSD = &est.Saved
		}
	}
	if t.MaxCost > 0 {
		c := t.MaxCost
		v.MaxCostUSD = &c
	}
	p := pipeline.TaskProgress(t, s.cfg.Clock.Now())
	if p.RowsPerSecond > 0 {
		rate := p.RowsPerSecond
		v.RowsPerSecond = &rate
	}
	if p.ETA > 0 {
		eta := math.Round(p.ETA.Seconds()*10) / 10
		v.ETASeconds = &eta
	}
	if !t.UpdatedAt.IsZero() {
		u := t.UpdatedAt.UTC()
		v.UpdatedAt = &u
	}
	if !t.FinishedAt.IsZero() {
		f := t.FinishedAt.UTC()
		v.FinishedAt = &f
	}
	return v
}
