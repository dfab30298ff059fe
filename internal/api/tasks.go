package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/prompt"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// StateAwaitingUpload is the state GET /api/tasks/{id} reports for a task
// that was created through the API but whose sheet has not arrived yet. It
// is not a store.TaskState: no task exists until the splitter runs.
const StateAwaitingUpload = "AWAITING_UPLOAD"

// Field limits of CreateTaskRequest.
const (
	maxFilenameBytes = 255
	maxPromptBytes   = 32 << 10
	maxModelBytes    = 200
	maxMaxTokens     = 1_000_000
	maxListLimit     = 200
	defaultListLimit = 50
)

// CreateTaskRequest is the body of POST /api/tasks. Only Filename is
// required.
type CreateTaskRequest struct {
	// Filename is the sheet's name; it must end in .xlsx or .csv.
	Filename string `json:"filename"`
	// Prompt is the row template; empty takes the workbook's "prompt" sheet
	// (cell A1), then the deployment's default.
	Prompt string `json:"prompt,omitempty"`
	// System is the system prompt.
	System string `json:"system,omitempty"`
	// Model overrides the deployment's model.
	Model string `json:"model,omitempty"`
	// Temperature is sent to the model when set; 0 to 2.
	Temperature *float64 `json:"temperature,omitempty"`
	// MaxTokens caps each completion; 0 leaves the provider's default.
	MaxTokens int `json:"max_tokens,omitempty"`
	// BatchSize is the number of rows per batch; 0 takes the deployment's.
	BatchSize int `json:"batch_size,omitempty"`
	// Size is the sheet's length in bytes; required. The upload URL is
	// signed for exactly this length, and a size over the deployment's
	// input limit is refused with 413.
	Size *int64 `json:"size,omitempty"`
}

// CreateTaskResponse is the 201 body of POST /api/tasks: PUT the sheet to
// UploadURL before ExpiresAt, then follow the task at /api/tasks/{TaskID}.
type CreateTaskResponse struct {
	TaskID       string `json:"task_id"`
	UploadURL    string `json:"upload_url"`
	UploadMethod string `json:"upload_method"`
	// UploadHeaders are the headers the PUT must send exactly as given
	// (Content-Type, Content-Length): they are signed into UploadURL.
	UploadHeaders map[string]string `json:"upload_headers"`
	ExpiresAt     time.Time         `json:"expires_at"`
}

// contentTypes are the media types uploads are signed with, by extension
// (lower case; sheet.IsSheetName decides which extensions are sheets).
var contentTypes = map[string]string{
	".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
	".xlsm": "application/vnd.ms-excel.sheet.macroEnabled.12",
	".csv":  "text/csv",
	".tsv":  "text/tab-separated-values",
}

// UploadContentType is the Content-Type an upload of filename is signed
// with, by its extension in any letter case; "application/octet-stream"
// for an extension without its own type.
func UploadContentType(filename string) string {
	if t, ok := contentTypes[strings.ToLower(path.Ext(filename))]; ok {
		return t
	}
	return "application/octet-stream"
}

// TaskView is a task as the API shows it.
type TaskView struct {
	TaskID        string `json:"task_id"`
	State         string `json:"state"`
	Source        string `json:"source,omitempty"`
	Sheet         string `json:"sheet,omitempty"`
	Encoding      string `json:"encoding,omitempty"`
	Provider      string `json:"provider,omitempty"`
	Model         string `json:"model,omitempty"`
	RowsTotal     int    `json:"rows_total"`
	RowsSucceeded int    `json:"rows_succeeded"`
	RowsFailed    int    `json:"rows_failed"`
	RowsSkipped   int    `json:"rows_skipped"`
	BatchesDone   int    `json:"batches_done"`
	BatchesTotal  int    `json:"batches_total"`
	// Error says why the task FAILED.
	Error string `json:"error,omitempty"`
	// ResultURL downloads the result workbook until ResultExpiresAt; set on
	// GET /api/tasks/{id} for a finished task when the API can presign.
	ResultURL       string     `json:"result_url,omitempty"`
	ResultExpiresAt *time.Time `json:"result_expires_at,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       *time.Time `json:"updated_at,omitempty"`
	FinishedAt      *time.Time `json:"finished_at,omitempty"`
}

// TaskList is the body of GET /api/tasks.
type TaskList struct {
	Tasks []TaskView `json:"tasks"`
}

// UploadRecord is what POST /api/tasks leaves for the splitter at
// UploadRecordKey(TaskID): the spec the client asked for, which the upload
// event alone cannot carry.
type UploadRecord struct {
	TaskID string `json:"task_id"`
	// Filename is the name the client gave; the object key may differ in
	// the case of its extension.
	Filename  string         `json:"filename"`
	Spec      store.TaskSpec `json:"spec"`
	CreatedAt time.Time      `json:"created_at"`
}

// UploadRecordKey is the blob key of a task's upload record.
func UploadRecordKey(taskID string) string { return "uploads/" + taskID + ".json" }

// IncomingKey is the object key a client uploads a task's sheet to. The
// extension is lowercased so keys are uniform; the splitter accepts any case
// (pipeline.IsInputKey).
func IncomingKey(taskID, filename string) string {
	ext := path.Ext(filename)
	return "incoming/" + taskID + "/" + strings.TrimSuffix(filename, ext) + strings.ToLower(ext)
}

// LoadUpload reads a task's upload record. A task created without the API
// has none: the error then wraps blob.ErrNotFound.
func LoadUpload(ctx context.Context, blobs blob.Store, taskID string) (UploadRecord, error) {
	if !ValidTaskID(taskID) {
		return UploadRecord{}, fmt.Errorf("load upload record %q: invalid task id: %w", taskID, blob.ErrNotFound)
	}
	rc, err := blobs.Open(ctx, UploadRecordKey(taskID))
	if err != nil {
		return UploadRecord{}, fmt.Errorf("load upload record %s: %w", taskID, err)
	}
	defer rc.Close()
	var rec UploadRecord
	if err := json.NewDecoder(rc).Decode(&rec); err != nil {
		return UploadRecord{}, fmt.Errorf("load upload record %s: decode: %w", taskID, err)
	}
	if rec.TaskID != taskID {
		return UploadRecord{}, fmt.Errorf("load upload record %s: it names task %q", taskID, rec.TaskID)
	}
	return rec, nil
}

// Uploads finds upload records in Blobs for pipeline.Intake, so that an
// input uploaded through the API is split with the spec it was created
// with.
type Uploads struct{ Blobs blob.Store }

var _ pipeline.UploadRecords = Uploads{}

// LookupUpload returns the upload record of taskID, or an error wrapping
// blob.ErrNotFound when there is none.
func (u Uploads) LookupUpload(ctx context.Context, taskID string) (pipeline.Upload, error) {
	rec, err := LoadUpload(ctx, u.Blobs, taskID)
	if err != nil {
		return pipeline.Upload{}, err
	}
	return pipeline.Upload{Spec: rec.Spec, Filename: rec.Filename}, nil
}

func (s *server) createTask(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Presigner == nil {
		writeError(w, http.StatusNotImplemented, "uploads_unsupported",
			"this server cannot issue upload URLs; put the sheet in the drop folder (incoming/) instead")
		return
	}
	var req CreateTaskRequest
	if !s.decodeJSON(w, r, &req) {
		return
	}
	spec, err := s.specFor(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
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
	contentType := UploadContentType(req.Filename)
	ctx := r.Context()
	id := s.cfg.NewID()
	if !ValidTaskID(id) {
		s.internalError(w, r, "create task", fmt.Errorf("NewID returned an invalid task id %q", id))
		return
	}
	now := s.cfg.Clock.Now().UTC()
	key := IncomingKey(id, req.Filename)
	// Presign before writing the record: signing is local and cheap, and a
	// failure then leaves nothing behind.
	url, err := s.cfg.Presigner.PresignPut(ctx, key, s.cfg.UploadTTL, size, contentType)
	if err != nil {
		s.internalError(w, r, "presign upload", err)
		return
	}
	rec, err := json.Marshal(UploadRecord{TaskID: id, Filename: req.Filename, Spec: spec, CreatedAt: now})
	if err != nil {
		s.internalError(w, r, "encode upload record", err)
		return
	}
	if err := s.cfg.Blobs.Put(ctx, UploadRecordKey(id), strings.NewReader(string(rec))); err != nil {
		s.internalError(w, r, "write upload record", err)
		return
	}
	s.cfg.Logger.Info("task created; awaiting upload", "task", id, "filename", req.Filename)
	w.Header().Set("Location", "/api/tasks/"+id)
	writeJSON(w, http.StatusCreated, CreateTaskResponse{
		TaskID: id, UploadURL: url, UploadMethod: http.MethodPut, ExpiresAt: now.Add(s.cfg.UploadTTL),
		UploadHeaders: map[string]string{"Content-Type": contentType, "Content-Length": strconv.FormatInt(size, 10)},
	})
}

// tooLargeError is a declared size over the deployment's input limit.
type tooLargeError struct{ size, limit int64 }

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("size is %d bytes; the largest sheet this deployment accepts is %d bytes", e.size, e.limit)
}

// uploadSize checks the request's declared size: required, at least one
// byte, at most MaxInputBytes (a *tooLargeError past it).
func (s *server) uploadSize(req CreateTaskRequest) (int64, error) {
	switch {
	case req.Size == nil:
		return 0, errors.New(`size is required: the sheet's length in bytes (e.g. "size": 18342); the upload URL is signed for exactly that length`)
	case *req.Size < 1:
		return 0, fmt.Errorf("size %d: must be the sheet's length in bytes, at least 1", *req.Size)
	case *req.Size > s.cfg.MaxInputBytes:
		return 0, &tooLargeError{size: *req.Size, limit: s.cfg.MaxInputBytes}
	}
	return *req.Size, nil
}

// specFor validates a request and completes it with the deployment's
// defaults. Its errors are meant for the client.
func (s *server) specFor(req CreateTaskRequest) (store.TaskSpec, error) {
	if err := validFilename(req.Filename); err != nil {
		return store.TaskSpec{}, err
	}
	def := s.cfg.DefaultSpec
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
	if req.Prompt != "" {
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
	if spec.Model == "" {
		spec.Model = def.Model
	}
	if t := req.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 2) {
		return spec, fmt.Errorf("temperature %v: must be between 0 and 2", *t)
	}
	if spec.Temperature == nil {
		spec.Temperature = def.Temperature
	}
	if req.MaxTokens < 0 || req.MaxTokens > maxMaxTokens {
		return spec, fmt.Errorf("max_tokens %d: must be between 0 and %d", req.MaxTokens, maxMaxTokens)
	}
	if spec.MaxTokens == 0 {
		spec.MaxTokens = def.MaxTokens
	}
	if req.BatchSize < 0 || req.BatchSize > s.cfg.MaxBatchSize {
		return spec, fmt.Errorf("batch_size %d: must be between 1 and %d (0 for the default)", req.BatchSize, s.cfg.MaxBatchSize)
	}
	if spec.BatchSize == 0 {
		spec.BatchSize = def.BatchSize
	}
	return spec, nil
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
	id := r.PathValue("id")
	if !ValidTaskID(id) {
		writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
		return
	}
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
		writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
		return
	case errors.As(err, &state):
		writeError(w, http.StatusConflict, "conflict", state.Error())
		return
	case errors.As(err, &export):
		// The task is cancelled; the sweeper starts the export later.
		s.cfg.Logger.Warn("start export of a cancelled task failed; the sweeper will retry", "task", id, "error", export.Err)
	case err != nil:
		s.internalError(w, r, "cancel task", err)
		return
	}
	writeJSON(w, http.StatusAccepted, viewOf(task))
}

// retryRequest is the optional body of POST /api/tasks/{id}/retry.
type retryRequest struct {
	// ErrorClass, when set, reruns only rows that failed with this class
	// (e.g. "content_filter", "retry_exhausted", "stuck").
	ErrorClass string `json:"error_class"`
}

// errorClassPattern bounds an error class to what classes look like.
var errorClassPattern = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// retryTask reruns the failed rows of a finished or cancelled task (all, or
// those of one error class): succeeded rows keep their results and are
// never billed again, the task goes back to RUNNING and is exported again
// under its next export generation when its batches finish.
func (s *server) retryTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !ValidTaskID(id) {
		writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
		return
	}
	if s.cfg.Retrier == nil {
		writeError(w, http.StatusNotImplemented, "not_implemented", "this deployment cannot retry tasks")
		return
	}
	var req retryRequest
	if r.ContentLength != 0 {
		if !s.decodeJSON(w, r, &req) {
			return
		}
	}
	if req.ErrorClass != "" && !errorClassPattern.MatchString(req.ErrorClass) {
		writeError(w, http.StatusBadRequest, "invalid_request", "error_class must be 1 to 64 lower-case letters, digits or underscores")
		return
	}
	ctx := r.Context()
	task, n, err := s.cfg.Retrier.Retry(ctx, id, req.ErrorClass, s.cfg.Clock.Now())
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
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
		s.cfg.Logger.Warn("retry: enqueue failed; the sweeper will re-enqueue", "task", id, "error", err)
		writeJSON(w, http.StatusAccepted, viewOf(task))
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
	writeJSON(w, http.StatusAccepted, viewOf(task))
}

func (s *server) getTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !ValidTaskID(id) {
		writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
		return
	}
	ctx := r.Context()
	task, err := s.cfg.Store.GetTask(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		s.awaitingUpload(w, r, id)
		return
	}
	if err != nil {
		s.internalError(w, r, "get task", err)
		return
	}
	view := viewOf(task)
	if s.cfg.Presigner != nil && task.ResultKey != "" && (task.State == store.TaskSucceeded || task.State == store.TaskPartial) {
		url, err := s.cfg.Presigner.PresignGet(ctx, task.ResultKey, s.cfg.DownloadTTL)
		if err != nil {
			s.internalError(w, r, "presign result", err)
			return
		}
		expires := s.cfg.Clock.Now().UTC().Add(s.cfg.DownloadTTL)
		view.ResultURL, view.ResultExpiresAt = url, &expires
	}
	writeJSON(w, http.StatusOK, view)
}

// awaitingUpload answers for a task id that has no task yet: created
// through the API and waiting for its sheet, or unknown.
func (s *server) awaitingUpload(w http.ResponseWriter, r *http.Request, id string) {
	rec, err := LoadUpload(r.Context(), s.cfg.Blobs, id)
	if errors.Is(err, blob.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "no task "+strconv.Quote(id))
		return
	}
	if err != nil {
		s.internalError(w, r, "load upload record", err)
		return
	}
	writeJSON(w, http.StatusOK, TaskView{
		TaskID: id, State: StateAwaitingUpload, Source: rec.Filename,
		Provider: rec.Spec.Provider, Model: rec.Spec.Model, CreatedAt: rec.CreatedAt,
	})
}

func (s *server) listTasks(w http.ResponseWriter, r *http.Request) {
	limit := defaultListLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("limit %q: must be between 1 and %d", v, maxListLimit))
			return
		}
		limit = n
	}
	tasks, err := s.cfg.Store.ListTasks(r.Context(), limit)
	if err != nil {
		s.internalError(w, r, "list tasks", err)
		return
	}
	out := TaskList{Tasks: make([]TaskView, 0, len(tasks))}
	for _, t := range tasks {
		out.Tasks = append(out.Tasks, viewOf(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func viewOf(t store.Task) TaskView {
	v := TaskView{
		TaskID: t.ID, State: string(t.State), Source: t.Source, Sheet: t.Sheet, Encoding: t.Encoding,
		Provider: t.Spec.Provider, Model: t.Spec.Model,
		RowsTotal: t.RowsTotal, RowsSucceeded: t.RowsSucceeded, RowsFailed: t.RowsFailed, RowsSkipped: t.RowsSkipped,
		BatchesDone: t.BatchesDone, BatchesTotal: t.BatchesTotal, Error: t.Error,
		CreatedAt: t.CreatedAt.UTC(),
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
