// Package api is the batchgen HTTP API: one http.Handler that net/http
// serves locally (`batchgen serve`) and the api Lambda serves behind API
// Gateway (see internal/lambdafn/apifn), with the same routes, the same
// principals and the same answers. openapi.yaml describes it, and a test
// holds the handler to the document.
//
// A client creates a task with POST /api/tasks, either sending the sheet
// as multipart/form-data (up to Limits.MaxFileBytes) or asking for an
// upload URL with a JSON body (AWS: a presigned S3 PUT, so API Gateway's
// 10 MB payload limit does not bound a job; locally: PUT
// /api/tasks/{id}/upload). It follows the task with GET /api/tasks/{id},
// reads the first rows with /preview and downloads /result. Every task
// belongs to the principal that created it (see Authenticator); any other
// principal gets 404 for it on every route and never sees it in a list.
//
// The handler parses, authenticates, calls the core (internal/pipeline) and
// formats; the decisions (who owns a task, what a valid sheet is, how a
// task is cancelled or retried) are the core's.
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
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
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

// Intake splits an input the API stored under incoming/<task id>/ right
// away (pipeline.Intake): the embedded runtime. On AWS the bucket's event
// notification starts the splitter instead, and Config.Intake is nil.
type Intake interface {
	Accept(ctx context.Context, key, version string) (pipeline.IntakeResult, error)
}

// Limits are what one deployment accepts; the template's parameters on
// AWS, flags of `batchgen serve` locally.
type Limits struct {
	// CostCaps is set by a runtime whose generators hold a task to its
	// spending cap (max_cost_usd): the embedded server. Without it a
	// request that sets one is refused, rather than run a task whose cap
	// nothing holds; the page offers the field only with it.
	CostCaps bool
	// BatchModes is set by a runtime that runs economy and auto tasks
	// through the providers' batch APIs (both runtimes do). Without it
	// a request for either is refused; the page offers them only with it.
	BatchModes bool
	// Quotes is set by a runtime that holds a task for a quote first
	// (Config.Starter; both runtimes do): the page offers it.
	Quotes bool
	// Models is the allow-list of models a request may name; empty allows
	// the deployment's default model only (which is always allowed).
	Models []string
	// ModelFixed, when set, says why no request may name a model other
	// than the default: the deployment routes rows over several providers,
	// each calling the model its providers file names, so a task's model
	// would change its id without changing a call
	// (providerfile.File.FixedModels).
	ModelFixed string
	// MaxTokens caps a request's max_tokens. Defaults to 100000.
	MaxTokens int
	// MaxBatchSize caps a request's batch_size. Defaults to 1000.
	MaxBatchSize int
	// MaxFileBytes is the largest sheet accepted, uploaded or announced.
	// Defaults to pipeline.DefaultMaxInputBytes. On AWS it must match the
	// splitter's MAX_INPUT_BYTES, so a file the splitter would refuse is
	// refused up front with 413.
	MaxFileBytes int64
	// MaxRows is the most data rows a sheet may have; 0 takes the sheet
	// reader's default.
	MaxRows int

	// The per-principal limits, each 0 for none. MaxActiveTasks caps a
	// principal's unfinished tasks; MaxRowsPerDay the rows of the tasks it
	// created in the last 24 hours (a sheet sent to its upload URL counts
	// from then on: its rows are not known when its task is created);
	// MaxStreams its event streams open at once, and MaxUploads the sheets
	// it sends through the API at once, each per server process (on AWS
	// sheets go straight to S3).
	MaxActiveTasks, MaxRowsPerDay, MaxStreams, MaxUploads int
}

// Route is an extra route served behind the same authentication, such as
// the event stream `batchgen serve` adds (GET /api/tasks/{id}/events).
type Route struct {
	// Pattern is an http.ServeMux pattern with a method, e.g.
	// "GET /api/tasks/{id}/events".
	Pattern string
	// Handler serves it; PrincipalFrom(r.Context()) names the caller.
	Handler http.Handler
}

// Config wires the API.
type Config struct {
	// Prices estimate a task's cost from its tokens. Defaults to the
	// built-in table.
	Prices *pricing.Table
	// WaitingOn, when set, says what an economy or auto task waits for in
	// this process ("waiting on 1 provider batch (90/180 lines done)"; ""
	// for nothing): the embedded server's generator knows
	// (pipeline.Generator.EconomyStatus).
	WaitingOn func(taskID string) string
	// Store holds the tasks.
	Store store.Store
	// Blobs holds upload records (uploads/<id>.json), the inputs the API
	// receives (incoming/<id>/<name>) and the results it streams.
	Blobs blob.Store
	// Auth names the principal of each request. Required.
	Auth Authenticator
	// Presigner, when non-nil, lets clients upload inputs and download
	// results directly from S3: the JSON form of POST /api/tasks answers
	// with a presigned PUT, and GET .../result redirects to a presigned
	// GET. Without it uploads go to PUT /api/tasks/{id}/upload and results
	// are streamed.
	Presigner Presigner
	// StreamGate, when non-nil, counts each principal's event streams for
	// Limits.MaxStreams across every server that serves them: the events
	// function's instances serve one stream each, so on AWS the count lives
	// in the table. Without it the server counts its own.
	StreamGate StreamGate
	// UploadRate is the slowest a sheet may arrive, in bytes a second, and
	// UploadGrace the time every upload gets besides: a request carrying a
	// sheet must be read within UploadGrace plus its size at UploadRate.
	// Default 64 KiB/s and 30 s (100 MiB then get 27 minutes).
	UploadRate  int64
	UploadGrace time.Duration
	// PublicURL is the server's address as its clients reach it
	// (scheme://host[:port], no trailing slash): the upload URLs of a
	// server without a Presigner are built on it, never on a request's
	// Host, which the client (or a page rebinding a name to this server)
	// chooses. Empty, they are relative to the API's own address.
	PublicURL string
	// Intake, when non-nil, splits an input as soon as the API has stored
	// it (the embedded runtime); see Intake.
	Intake Intake
	// Clock stamps upload records and computes expiry times. Defaults to
	// clock.Real.
	Clock clock.Clock
	// Logger receives internal errors, which clients never see. Defaults
	// to discarding.
	Logger *slog.Logger
	// DefaultSpec is the deployment's spec: its Provider always applies,
	// its Model, System and BatchSize apply when the request sets none, and
	// its Prompt applies when neither the request nor the workbook's
	// "prompt" sheet has one.
	DefaultSpec store.TaskSpec
	// Limits bound requests and files.
	Limits Limits
	// UploadTTL is how long an upload URL stays valid. Defaults to 15
	// minutes.
	UploadTTL time.Duration
	// DownloadTTL is how long a result URL stays valid. Defaults to 1 hour.
	DownloadTTL time.Duration
	// MaxBodyBytes caps a JSON request body. Defaults to 256 KiB.
	MaxBodyBytes int64
	// TempDir receives uploaded sheets while they are checked. Defaults to
	// os.TempDir().
	TempDir string
	// NewID returns a fresh task id for an upload. Defaults to 128 random
	// bits in hex. It must return ids that ValidTaskID accepts.
	NewID func() string
	// Exports, when non-nil, starts the export of a cancelled task, so its
	// partial result is written. Without it the sweeper starts it later.
	Exports Exporter
	// Retrier, when non-nil, serves POST /api/tasks/{id}/retry; without it
	// that endpoint answers 501.
	Retrier Retrier
	// Starter, when non-nil, starts held tasks (POST
	// /api/tasks/{id}/start), so a create may ask for a quote first
	// (sample); without it both are refused.
	Starter Starter
	// QuotePace, when non-nil, is the pace the providers' quotas allow
	// now, for the time a quote gives (GET /api/tasks/{id}/quote); without
	// it the quote gives no time.
	QuotePace func() QuotePace
	// EventInterval is how often an event stream reads its task, and so
	// the most often it sends progress. Defaults to 1 second.
	EventInterval time.Duration
	// HeartbeatInterval is the longest an event stream stays silent: a
	// comment line is sent when nothing else was, so proxies keep it open.
	// Defaults to 15 seconds.
	HeartbeatInterval time.Duration
	// EventsURL, when set, is the base URL the event stream is served at
	// (the events function's Function URL on AWS, since API Gateway cannot
	// stream): every task's links.events points there. Empty leaves it on
	// this handler's own route.
	EventsURL string
	// StreamFor, when positive, ends an event stream after this long; the
	// client reconnects with Last-Event-ID. For a runtime with a time limit
	// (the events Lambda). Zero streams until the task is finished.
	StreamFor time.Duration
	// Routes are served beside the API's own, behind the same
	// authentication.
	Routes []Route
}

// Retrier reruns the failed rows of a finished task (pipeline.Retrier: the
// store's reopen and the work queue).
type Retrier interface {
	// Retry reopens the FAILED rows of class p.ErrorClass (all when
	// empty), enqueues their batches and returns the reopened task and how
	// many batches were enqueued; zero when nothing failed. It returns
	// store.ErrNotFound for no such task and store.ErrConflict for a task
	// that is not finished.
	Retry(ctx context.Context, p pipeline.RetryParams) (pipeline.RetryOutcome, error)
}

// Starter starts a held task (pipeline.Starter): it sets the terms its
// owner chose, moves it to RUNNING and sends its batches. It returns
// store.ErrNotFound for no such task and a *pipeline.StateError for a task
// that is not held.
type Starter interface {
	Start(ctx context.Context, p pipeline.StartParams) (store.Task, int, error)
}

// QuotePace is what the time of a quote is computed at
// (pipeline.QuoteParams): the requests a second the providers' quotas
// allow (0 when not known) and how many calls run at once.
type QuotePace struct {
	RequestsPerSecond float64
	Concurrency       int
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
	if c.Limits.MaxFileBytes <= 0 {
		c.Limits.MaxFileBytes = pipeline.DefaultMaxInputBytes
	}
	if c.Limits.MaxBatchSize <= 0 {
		c.Limits.MaxBatchSize = 1000
	}
	if c.UploadRate <= 0 {
		c.UploadRate = 64 << 10
	}
	if c.UploadGrace <= 0 {
		c.UploadGrace = 30 * time.Second
	}
	if c.Limits.MaxTokens <= 0 {
		c.Limits.MaxTokens = 100_000
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
	if c.TempDir == "" {
		c.TempDir = os.TempDir()
	}
	if c.NewID == nil {
		c.NewID = randomID
	}
	if c.Prices == nil {
		c.Prices = pricing.Default()
	}
	if c.EventInterval <= 0 {
		c.EventInterval = defaultEventInterval
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = defaultHeartbeatInterval
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

// ValidTaskID reports whether id can name a task (pipeline.ValidTaskID
// holds the rule).
func ValidTaskID(id string) bool { return pipeline.ValidTaskID(id) }

// routes are the API's own routes, in one table so that the OpenAPI test
// can hold the document to exactly these.
var routes = []route{
	{http.MethodPost, "/api/tasks", (*server).createTask},
	{http.MethodGet, "/api/tasks", (*server).listTasks},
	{http.MethodGet, "/api/tasks/{id}", (*server).getTask},
	{http.MethodPut, "/api/tasks/{id}/upload", (*server).uploadTask},
	{http.MethodGet, "/api/tasks/{id}/result", (*server).getResult},
	{http.MethodGet, "/api/tasks/{id}/preview", (*server).previewTask},
	{http.MethodPost, "/api/tasks/{id}/cancel", (*server).cancelTask},
	{http.MethodPost, "/api/tasks/{id}/retry", (*server).retryTask},
	{http.MethodGet, "/api/tasks/{id}/quote", (*server).quoteTask},
	{http.MethodPost, "/api/tasks/{id}/start", (*server).startTask},
	{http.MethodGet, EventsPattern, (*server).taskEvents},
}

// route is one of the API's own routes.
type route struct {
	method, pattern string
	handle          func(*server, http.ResponseWriter, *http.Request)
}

// Routes lists the method and path pattern of every route the handler
// serves itself (Config.Routes not included).
func Routes() [][2]string {
	out := make([][2]string, len(routes))
	for i, rt := range routes {
		out[i] = [2]string{rt.method, rt.pattern}
	}
	return out
}

// New returns the API handler. It panics if cfg has no Store, Blobs or
// Auth: that is a wiring bug found at start-up.
func New(cfg Config) http.Handler {
	return newHandler("api.New", cfg, routes)
}

// NewEvents returns a handler that serves only the task event stream (GET
// /api/tasks/{id}/events), behind cfg.Auth, and answers 404 on every other
// path: the events function's Lambda Function URL, which streams responses
// but has no API Gateway authorizer in front of it, so its cfg.Auth
// verifies the JWT itself (jwtauth). Serving nothing else keeps that
// unauthorized-by-the-gateway door as narrow as the one route it exists
// for. It panics under the same conditions as New.
func NewEvents(cfg Config) http.Handler {
	var only []route
	for _, rt := range routes {
		if rt.pattern == EventsPattern {
			only = append(only, rt)
		}
	}
	cfg.Routes = nil
	return newHandler("api.NewEvents", cfg, only)
}

// EventsPattern is the path of a task's event stream.
const EventsPattern = "/api/tasks/{id}/events"

func newHandler(name string, cfg Config, routes []route) http.Handler {
	if cfg.Store == nil || cfg.Blobs == nil || cfg.Auth == nil {
		panic(name + ": Config.Store, Config.Blobs and Config.Auth are required")
	}
	s := &server{cfg: cfg.withDefaults()}
	mux := http.NewServeMux()
	allow := map[string][]string{}
	var order []string
	for _, rt := range routes {
		mux.HandleFunc(rt.method+" "+rt.pattern, func(w http.ResponseWriter, r *http.Request) { rt.handle(s, w, r) })
		if allow[rt.pattern] == nil {
			order = append(order, rt.pattern)
		}
		allow[rt.pattern] = append(allow[rt.pattern], rt.method)
	}
	for _, rt := range cfg.Routes {
		mux.Handle(rt.Pattern, rt.Handler)
		method, pattern, _ := strings.Cut(rt.Pattern, " ")
		if allow[pattern] == nil {
			order = append(order, pattern)
		}
		allow[pattern] = append(allow[pattern], method)
	}
	// Method-less patterns catch the other methods on known paths, so they
	// get a JSON 405 instead of falling through to the JSON 404 below.
	for _, pattern := range order {
		methods := allow[pattern]
		if slices.Contains(methods, http.MethodGet) {
			methods = append(methods, http.MethodHead)
		}
		mux.HandleFunc(pattern, methodNotAllowed(strings.Join(methods, ", ")))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return s.recoverer(RequireAuth(s.cfg.Auth, s.cfg.Logger, mux))
}

type server struct {
	cfg Config
	// streams and uploads count the open event streams and the uploads
	// being received, per principal.
	streams, uploads counter
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

// WriteJSON answers status with v as JSON, not cached and not sniffed.
// Routes served beside the API (Config.Routes) use it too.
func WriteJSON(w http.ResponseWriter, status int, v any) {
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

// WriteError answers with the API's one error shape,
// {"error": {"code", "message"}}. Routes served beside the API
// (Config.Routes) use it so that clients parse one format.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	WriteJSON(w, status, ErrorBody{Error: ErrorDetail{Code: code, Message: message}})
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	WriteError(w, status, code, message)
}

// internalError logs err with the request and answers a 500 that leaks
// nothing about it.
func (s *server) internalError(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.cfg.Logger.Error("api: "+what, "method", r.Method, "path", r.URL.Path, "error", err)
	writeError(w, http.StatusInternalServerError, "internal", "internal error")
}

// decodeOptionalJSON is decodeJSON for a body that may be left out (no
// Content-Length, or 0): then v keeps its zero value and the request goes
// on. A chunked body (ContentLength -1) is read.
func (s *server) decodeOptionalJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	return r.ContentLength == 0 || s.decodeJSON(w, r, v)
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
