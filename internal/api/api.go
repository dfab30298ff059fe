// Package api is the batchgen HTTP API: one http.Handler that net/http
// serves locally (`batchgen serve`) and the api Lambda serves behind API
// Gateway (see internal/lambdafn.HTTP).
//
// A client creates a task with POST /api/tasks, which returns a presigned
// URL; it PUTs the sheet there (under incoming/<task id>/), the upload event
// starts the splitter, and GET /api/tasks/{id} follows the task to a
// presigned link to the result. The file never passes through the API, so
// API Gateway's 10 MB payload limit and 29 s timeout do not bound a job.
package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"time"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// Presigner issues time-limited URLs for direct object uploads and
// downloads (S3 presigned URLs). The embedded runtime has none.
type Presigner interface {
	// PresignPut returns a URL that accepts one HTTP PUT of the object at
	// key until ttl has passed, of exactly size bytes sent with
	// Content-Type contentType (both signed; S3 refuses others with 403).
	PresignPut(ctx context.Context, key string, ttl time.Duration, size int64, contentType string) (string, error)
	// PresignGet returns a URL that serves the object at key until ttl has
	// passed.
	PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error)
}

// Config wires the API.
type Config struct {
	// Store holds the tasks.
	Store store.Store
	// Blobs holds the upload records (uploads/<id>.json).
	Blobs blob.Store
	// Presigner, when non-nil, lets clients upload inputs and download
	// results directly. Without it POST /api/tasks answers 501 and tasks
	// carry no result_url.
	Presigner Presigner
	// Clock stamps upload records and computes expiry times. Defaults to
	// clock.Real.
	Clock clock.Clock
	// Logger receives internal errors, which clients never see. Defaults
	// to discarding.
	Logger *slog.Logger
	// DefaultSpec is the deployment's spec: its Provider always applies,
	// its Model, System and BatchSize apply when the request sets none, and
	// its Prompt is left for the splitter to apply after the workbook's
	// own prompt sheet.
	DefaultSpec store.TaskSpec
	// MaxBatchSize caps a request's batch_size. Defaults to 1000.
	MaxBatchSize int
	// UploadTTL is how long an upload URL stays valid. Defaults to 15
	// minutes.
	UploadTTL time.Duration
	// DownloadTTL is how long a result URL stays valid. Defaults to 1 hour.
	DownloadTTL time.Duration
	// MaxBodyBytes caps a request body. Defaults to 256 KiB.
	MaxBodyBytes int64
	// MaxInputBytes is the largest sheet an upload URL is issued for: the
	// splitter's limit (MAX_INPUT_BYTES), so a file the splitter would
	// refuse is refused up front with 413. Defaults to
	// pipeline.DefaultMaxInputBytes.
	MaxInputBytes int64
	// NewID returns a fresh task id for an upload. Defaults to 128 random
	// bits in hex. It must return ids that ValidTaskID accepts.
	NewID func() string
	// Exports, when non-nil, starts the export of a cancelled task, so its
	// partial result is written. Without it the sweeper starts it later.
	Exports Exporter
	// Retrier, when non-nil, serves POST /api/tasks/{id}/retry; without it
	// that endpoint answers 501.
	Retrier Retrier
}

// Retrier reruns the failed rows of a finished task (pipeline.Retrier: the
// store's reopen and the work queue).
type Retrier interface {
	// Retry reopens the FAILED rows of class errorClass (all when empty),
	// enqueues their batches and returns the reopened task and how many
	// batches were enqueued; zero when nothing failed. It returns
	// store.ErrNotFound for no such task and store.ErrConflict for a task
	// that is not finished.
	Retry(ctx context.Context, taskID, errorClass string, now time.Time) (store.Task, int, error)
}

// Exporter starts the export of a task (pipeline.ExportStarter).
type Exporter interface {
	StartExport(ctx context.Context, taskID string, generation int) error
}

func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxInputBytes <= 0 {
		c.MaxInputBytes = pipeline.DefaultMaxInputBytes
	}
	if c.MaxBatchSize <= 0 {
		c.MaxBatchSize = 1000
	}
	if c.UploadTTL <= 0 {
		c.UploadTTL = 15 * time.Minute
	}
	if c.DownloadTTL <= 0 {
		c.DownloadTTL = time.Hour
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 256 << 10
	}
	if c.NewID == nil {
		c.NewID = randomID
	}
	return c
}

// randomID returns 128 random bits in hex: unguessable, so knowing one task
// id tells nothing about another, and valid as a Step Functions execution
// name and an S3 key segment.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

var taskIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}$`)

// ValidTaskID reports whether id can name a task: 1-80 letters, digits,
// '-' or '_'. The limit is Step Functions' execution name, which is the
// task id; the alphabet keeps ids safe inside object keys.
func ValidTaskID(id string) bool { return taskIDPattern.MatchString(id) }

// New returns the API handler. It panics if cfg has no Store or Blobs: that
// is a wiring bug found at start-up.
func New(cfg Config) http.Handler {
	if cfg.Store == nil || cfg.Blobs == nil {
		panic("api.New: Config.Store and Config.Blobs are required")
	}
	s := &server{cfg: cfg.withDefaults()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/tasks", s.createTask)
	mux.HandleFunc("GET /api/tasks", s.listTasks)
	mux.HandleFunc("GET /api/tasks/{id}", s.getTask)
	mux.HandleFunc("POST /api/tasks/{id}/cancel", s.cancelTask)
	mux.HandleFunc("POST /api/tasks/{id}/retry", s.retryTask)
	// Method-less patterns catch the other methods on known paths, so they
	// get a JSON 405 instead of falling through to the JSON 404 below.
	mux.HandleFunc("/api/tasks", methodNotAllowed("GET, HEAD, POST"))
	mux.HandleFunc("/api/tasks/{id}", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/api/tasks/{id}/cancel", methodNotAllowed("POST"))
	mux.HandleFunc("/api/tasks/{id}/retry", methodNotAllowed("POST"))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return s.recoverer(mux)
}

type server struct {
	cfg Config
}

// recoverer turns a panic in a handler into a logged 500: net/http would
// survive it, but under Lambda it would kill the invocation.
func (s *server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.cfg.Logger.Error("api handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(p))
				writeError(w, http.StatusInternalServerError, "internal", "internal error")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here; use "+allow)
	}
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong. Code is stable and meant for programs;
// Message is meant for people and may change.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own plain structs are encoded; this cannot happen.
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"internal error"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, ErrorBody{Error: ErrorDetail{Code: code, Message: message}})
}

// internalError logs err with the request and answers a 500 that leaks
// nothing about it.
func (s *server) internalError(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.cfg.Logger.Error("api: "+what, "method", r.Method, "path", r.URL.Path, "error", err)
	writeError(w, http.StatusInternalServerError, "internal", "internal error")
}

// decodeJSON reads a JSON object into v, refusing unknown fields (a typo in
// a field name should not silently fall back to a default), trailing data
// and bodies over the limit.
func (s *server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); !errors.Is(extra, io.EOF) {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	if err == nil {
		return true
	}
	var tooBig *http.MaxBytesError
	var syntax *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("request body is larger than %d bytes", tooBig.Limit))
	case errors.Is(err, io.EOF):
		writeError(w, http.StatusBadRequest, "invalid_json", "request body is empty; send a JSON object")
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "invalid_json", "request body is not valid JSON")
	case errors.As(err, &typeErr):
		writeError(w, http.StatusBadRequest, "invalid_json", fmt.Sprintf("field %q must be %s", typeErr.Field, jsonKind(typeErr.Type)))
	default:
		// DisallowUnknownFields and trailing-data errors are safe to show.
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error())
	}
	return false
}

// jsonKind names a Go type the way a JSON client thinks of it.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}
