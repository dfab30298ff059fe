// Package mockserver is a model server for tests, demos and benchmarks
// (`batchgen mock-llm`): OpenAI's chat completions API, and Anthropic's
// Messages API at /v1/messages (anthropic.go), both over the same quota,
// faults and counts. It enforces a request
// quota over a sliding window the way a provider does, injects faults
// deterministically (by seed and by markers in the prompt), and counts what it
// answered per prompt, so a test can prove that a job stayed under the quota
// and paid for every row exactly once.
//
// Quotas: Quota requests and TokenQuota tokens per QuotaWindow, each a strict
// sliding window. A request is charged its prompt tokens plus max_tokens
// (DefaultOutputTokens without one) when admitted, the way OpenAI counts it,
// and the charge is corrected to the usage it reports once answered. Every
// answer carries OpenAI's rate-limit headers (x-ratelimit-limit-*,
// -remaining-*, -reset-* for requests and tokens, scaled to a minute; reset
// is when the window is whole again) and a 429 also Retry-After and
// retry-after-ms; NoRateLimitHeaders leaves all but Retry-After out, so that
// a client must learn the quota from 429s alone.
//
// A response_format of json_schema (or json_object with the schema in the
// messages, as schema.SchemaInstructions writes it) gets a JSON object of
// that shape, its text fields quoting the row's prompt; InvalidRate breaks a
// share of them, NoStructuredOutputs refuses json_schema as servers without
// structured outputs do. The row's prompt is the first user message: later
// ones are re-asks of it.
//
// Markers (substrings anywhere in the request's messages) force an outcome:
//
//	[[filter]]         400 content_filter
//	[[filter_output]]  200 with finish_reason "content_filter" and no text
//	[[too_long]]       400 context_length_exceeded
//	[[5xx]]            500 server_error, every time
//	[[flaky]]          503 for the first FlakyFailures calls of that prompt, then success
//	[[timeout]]        no answer until the client gives up (or HangTimeout passes: 504)
//	[[quota]]          429 insufficient_quota (billing), not counted against the quota
package mockserver

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/schema"
)

// Defaults for Config.
const (
	DefaultQuotaWindow        = time.Minute
	DefaultFilterMarker       = "[[filter]]"
	DefaultOutputFilterMarker = "[[filter_output]]"
	DefaultTooLongMarker      = "[[too_long]]"
	DefaultServerErrorMarker  = "[[5xx]]"
	DefaultFlakyMarker        = "[[flaky]]"
	DefaultTimeoutMarker      = "[[timeout]]"
	DefaultQuotaMarker        = "[[quota]]"
	DefaultResetMarker        = "[[reset]]"
	DefaultFlakyFailures      = 1
	DefaultHangTimeout        = 5 * time.Minute
	DefaultMaxBodyBytes       = 1 << 20
	DefaultMaxTrackedPrompts  = 100_000
)

// Config configures a Server. The zero value is an always-succeeding server
// with no latency and no quota.
type Config struct {
	// Latency is added to every request the quota accepts, after the quota
	// decision. 0 answers at once.
	Latency time.Duration
	// Jitter spreads Latency over [Latency-Jitter, Latency+Jitter], by the
	// same seeded hash as FailRate.
	Jitter time.Duration
	// Quota is the number of requests accepted per QuotaWindow; 0 means
	// unlimited. Requests answered 429 do not count against it.
	Quota int
	// TokenQuota is the number of tokens (prompt plus completion) accepted
	// per QuotaWindow; 0 means unlimited.
	TokenQuota int
	// NoRateLimitHeaders leaves the x-ratelimit-* and retry-after-ms
	// headers out (a 429 still has Retry-After).
	NoRateLimitHeaders bool
	// QuotaWindow is the sliding window of Quota. Defaults to 60 s.
	QuotaWindow time.Duration
	// FailRate is the fraction of accepted requests answered 500 or 503.
	// Whether a call fails is a hash of Seed, the prompt and how many times
	// that prompt was sent before, so the same job fails the same calls on
	// every run however its workers interleave.
	FailRate float64
	// Seed varies the FailRate and Jitter choices.
	Seed int64
	// RequireAPIKey, when set, answers 401 to requests whose bearer token
	// differs.
	RequireAPIKey string

	// Markers; each defaults to the Default...Marker constant.
	FilterMarker       string
	OutputFilterMarker string
	TooLongMarker      string
	ServerErrorMarker  string
	FlakyMarker        string
	TimeoutMarker      string
	QuotaMarker        string
	// ResetMarker prompts have their first FlakyFailures connections reset
	// (TCP RST, no HTTP answer), as a flaky network or proxy would.
	ResetMarker string

	// FlakyFailures is how many calls of a FlakyMarker prompt fail before
	// it succeeds. Defaults to 1.
	FlakyFailures int
	// HangTimeout bounds a TimeoutMarker request that the client never
	// abandons. Defaults to 5 min.
	HangTimeout time.Duration
	// MaxBodyBytes caps a request body (413 beyond). Defaults to 1 MiB.
	MaxBodyBytes int64
	// MaxTrackedPrompts caps Stats.PerPrompt so a long-running server has
	// bounded memory; later new prompts are counted in
	// Stats.UntrackedPrompts only. Defaults to 100 000.
	MaxTrackedPrompts int
	// Clock times the quota window and waits out latency. Defaults to
	// clock.Real.
	Clock clock.Clock
	// InvalidRate is the fraction of structured answers (a request with a
	// response_format of json_schema, or json_object with the schema in its
	// messages) broken on purpose: one property holds an object instead of
	// a value, so no declaration accepts it. Chosen by the same seeded
	// hash as FailRate, per prompt and call, so a re-ask is a new draw.
	InvalidRate float64
	// NoStructuredOutputs answers 400 to a response_format of json_schema,
	// as servers without structured outputs do; json_object is accepted.
	NoStructuredOutputs bool
	// BatchDelay is how long a Batch API job takes to finish all its
	// lines (see batch.go). Defaults to DefaultBatchDelay.
	BatchDelay time.Duration
	// BatchErrorRate is the fraction of a batch's lines answered with a
	// 500 in its error file.
	BatchErrorRate float64
	// BatchExpire makes a batch expire at BatchDelay with half its lines
	// done.
	BatchExpire bool
	// BatchQueueLimit, when positive, is the most lines the batches in
	// flight may hold together (OpenAI's enqueued-token limit, counted in
	// lines): a batch that would pass it fails at validation with
	// token_limit_exceeded, as OpenAI's does, billing nothing.
	BatchQueueLimit int
	// BatchJobsLimit, when positive, is the most batches (either API, or
	// Bedrock jobs) in progress at once: a create past it is refused for
	// now (OpenAI's and Anthropic's 429, Bedrock's
	// ServiceQuotaExceededException), creating nothing, as a
	// concurrent-jobs quota refuses it.
	BatchJobsLimit int
	// Objects is where Bedrock batch jobs read their input and write their
	// output (S3: mocks3.Objects); without it the mock refuses such jobs.
	Objects Objects
	// BatchAnswersLost makes the first that many batch creates (either
	// API) create their batch and then answer 502, as a create whose
	// answer a proxy or a timeout lost: a client that sends it again pays
	// twice.
	BatchAnswersLost int
	// PaidLog, when non-nil, gets one line per completion returned, the
	// prompt as a JSON string, written before the answer: what a provider
	// bills. A batch line answered is written as {"prompt": ..., "batch":
	// true}: billed at half the price. Written to a file, it survives the server being killed (Stats
	// do not), so a test can count every row's paid calls across a kill.
	PaidLog io.Writer
}

// Stats is a snapshot of what the server answered since start or the last
// reset.
type Stats struct {
	// Requests counts every model call received, in either protocol.
	Requests int64 `json:"requests"`
	// Messages counts those that came in on Anthropic's Messages API (the
	// rest came in on chat completions).
	Messages int64 `json:"messages"`
	// Succeeded counts completions returned (finish_reason stop or length).
	Succeeded int64 `json:"succeeded"`
	// RateLimited counts 429 rate_limit_exceeded answers.
	RateLimited int64 `json:"rate_limited"`
	// Tokens sums the usage (prompt plus completion tokens) of the
	// completions returned.
	Tokens int64 `json:"tokens"`
	// QuotaExhausted counts 429 insufficient_quota answers.
	QuotaExhausted int64 `json:"quota_exhausted"`
	// AfterQuota counts the requests received after the first
	// insufficient_quota answer was written: a client that stops calling a
	// provider that refused for good makes none (unless it had calls in
	// flight at the time).
	AfterQuota int64 `json:"after_quota"`
	// ServerErrors counts 5xx answers.
	ServerErrors int64 `json:"server_errors"`
	// Filtered counts content filter answers (400 or 200).
	Filtered int64 `json:"filtered"`
	// BadRequests counts other 4xx answers (malformed, too long, auth).
	BadRequests int64 `json:"bad_requests"`
	// Structured counts completions answered as JSON of a schema, and
	// Broken those of them broken on purpose (InvalidRate).
	Structured int64 `json:"structured"`
	Broken     int64 `json:"broken"`
	// Packed counts completions of packed calls (several rows in one),
	// PackedItems the items they answered, and BrokenItems the items
	// broken on purpose (left out, given twice or wrong).
	Packed      int64 `json:"packed"`
	PackedItems int64 `json:"packed_items"`
	BrokenItems int64 `json:"broken_items"`
	// Resets counts connections reset on purpose (ResetMarker).
	Resets int64 `json:"resets"`
	// BatchLines counts the Batch API lines finished, BatchFailed those
	// of them answered with an error.
	BatchLines  int64 `json:"batch_lines"`
	BatchFailed int64 `json:"batch_failed"`
	// BatchesRefused counts batches failed for BatchQueueLimit.
	BatchesRefused int64 `json:"batches_refused"`
	// CreatesOverJobs counts creates refused for BatchJobsLimit.
	CreatesOverJobs int64 `json:"creates_over_jobs"`
	// MostJobsInProgress is the most batches that were in progress at once.
	MostJobsInProgress int64 `json:"most_jobs_in_progress"`
	// BatchesCreated counts the batches created (either API), those whose
	// answer BatchAnswersLost lost too.
	BatchesCreated int64 `json:"batches_created"`
	// Canceled counts requests whose client went away before the answer.
	Canceled int64 `json:"canceled"`
	// InFlight is the number of requests being handled now, PeakInFlight
	// the highest it has been.
	InFlight     int64 `json:"in_flight"`
	PeakInFlight int64 `json:"peak_in_flight"`
	// PerPrompt is keyed by the first user message of the request: the
	// row's question, which a re-ask repeats before its correction.
	PerPrompt map[string]PromptStats `json:"per_prompt,omitempty"`
	// UntrackedPrompts counts requests for prompts not in PerPrompt
	// because MaxTrackedPrompts was reached.
	UntrackedPrompts int64 `json:"untracked_prompts"`
}

// PromptStats counts the calls for one prompt.
type PromptStats struct {
	// Calls counts every well-formed request with this prompt, whatever the
	// answer.
	Calls int64 `json:"calls"`
	// Succeeded counts completions returned for it: more than one for a
	// prompt that occurs once in a job means a row was paid for twice.
	Succeeded int64 `json:"succeeded"`
}

// Server is the mock. It is an http.Handler, safe for concurrent use.
type Server struct {
	cfg Config

	mu sync.Mutex
	// window holds the accept times of the requests accepted within the
	// last QuotaWindow, oldest at head: a ring of at most Quota entries.
	window []time.Time
	head   int
	n      int
	// toks holds the token charges within the last QuotaWindow, oldest
	// first, and tokSum their sum.
	toks   []tokenCharge
	tokSum int
	stats  Stats
	prompt map[string]*PromptStats
	seq    int64
	// batch holds the Batch API's files and jobs.
	batch batches
}

// New returns a server for cfg, filling defaults.
func New(cfg Config) *Server {
	if cfg.QuotaWindow <= 0 {
		cfg.QuotaWindow = DefaultQuotaWindow
	}
	cfg.Quota = max(cfg.Quota, 0)
	cfg.TokenQuota = max(cfg.TokenQuota, 0)
	cfg.FailRate = min(max(cfg.FailRate, 0), 1)
	cfg.BatchErrorRate = min(max(cfg.BatchErrorRate, 0), 1)
	cfg.Latency = max(cfg.Latency, 0)
	cfg.Jitter = max(cfg.Jitter, 0)
	defaultString(&cfg.FilterMarker, DefaultFilterMarker)
	defaultString(&cfg.OutputFilterMarker, DefaultOutputFilterMarker)
	defaultString(&cfg.TooLongMarker, DefaultTooLongMarker)
	defaultString(&cfg.ServerErrorMarker, DefaultServerErrorMarker)
	defaultString(&cfg.FlakyMarker, DefaultFlakyMarker)
	defaultString(&cfg.TimeoutMarker, DefaultTimeoutMarker)
	defaultString(&cfg.QuotaMarker, DefaultQuotaMarker)
	defaultString(&cfg.ResetMarker, DefaultResetMarker)
	if cfg.FlakyFailures <= 0 {
		cfg.FlakyFailures = DefaultFlakyFailures
	}
	if cfg.HangTimeout <= 0 {
		cfg.HangTimeout = DefaultHangTimeout
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxTrackedPrompts <= 0 {
		cfg.MaxTrackedPrompts = DefaultMaxTrackedPrompts
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &Server{
		cfg:    cfg,
		prompt: map[string]*PromptStats{},
		batch:  batches{files: map[string]*mockFile{}, batches: map[string]*mockBatch{}},
	}
}

func defaultString(s *string, def string) {
	if *s == "" {
		*s = def
	}
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked(true)
}

func (s *Server) snapshotLocked(perPrompt bool) Stats {
	st := s.stats
	st.PerPrompt = nil
	if perPrompt {
		st.PerPrompt = make(map[string]PromptStats, len(s.prompt))
		for k, v := range s.prompt {
			st.PerPrompt[k] = *v
		}
	}
	return st
}

// Reset clears the counters and the quota window, as if the server had just
// started (completion IDs keep increasing).
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	inFlight := s.stats.InFlight
	s.stats = Stats{InFlight: inFlight, PeakInFlight: inFlight}
	clear(s.prompt)
	s.head, s.n = 0, 0
	s.toks, s.tokSum = nil, 0
}

// ServeHTTP routes:
//
//	POST /v1/chat/completions (also /chat/completions)
//	POST /v1/messages (Anthropic's Messages API; see anthropic.go)
//	/v1/files, /v1/batches (OpenAI's Batch API; see batch.go)
//	/model-invocation-job[s] (Bedrock's batch inference; see bedrock_batch.go)
//	GET  /stats   (JSON Stats; ?summary=1 leaves out per_prompt)
//	POST /reset
//	GET  /healthz
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route := func(method string, h func(http.ResponseWriter, *http.Request)) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			writeError(w, http.StatusMethodNotAllowed, apiError{Message: fmt.Sprintf("use %s for %s", method, r.URL.Path), Type: "invalid_request_error"})
			return
		}
		h(w, r)
	}
	if s.serveBatchAPI(w, r) {
		return
	}
	switch r.URL.Path {
	case "/v1/chat/completions", "/chat/completions":
		route(http.MethodPost, func(w http.ResponseWriter, r *http.Request) { s.serveCall(openAI{}, w, r) })
	case "/v1/messages":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			anthropic{}.writeError(w, http.StatusMethodNotAllowed, apiError{Message: fmt.Sprintf("use POST for %s", r.URL.Path), Type: "invalid_request_error"})
			return
		}
		s.serveCall(anthropic{}, w, r)
	case "/stats":
		route(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
			s.mu.Lock()
			st := s.snapshotLocked(r.URL.Query().Get("summary") == "")
			s.mu.Unlock()
			writeJSON(w, http.StatusOK, st)
		})
	case "/reset":
		route(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
			s.Reset()
			writeJSON(w, http.StatusOK, map[string]string{"status": "reset"})
		})
	case "/healthz":
		route(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		})
	default:
		writeError(w, http.StatusNotFound, apiError{Message: fmt.Sprintf("unknown path %s", r.URL.Path), Type: "invalid_request_error", Code: "unknown_url"})
	}
}

// outcome is what the server decided to answer an accepted request with.
type outcome int

const (
	succeed outcome = iota
	failServer
	failUnavailable
	failFilter
	failOutputFilter
	failTooLong
	hang
	resetConn
)

// serveCall answers one model call in dialect d: the quota, the faults,
// the answer and the counts are the server's, whatever the protocol.
func (s *Server) serveCall(d dialect, w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.stats.Requests++
	if _, ok := d.(anthropic); ok {
		s.stats.Messages++
	}
	if s.stats.QuotaExhausted > 0 {
		s.stats.AfterQuota++
	}
	s.stats.InFlight++
	s.stats.PeakInFlight = max(s.stats.PeakInFlight, s.stats.InFlight)
	s.mu.Unlock()
	defer s.count(func(st *Stats) { st.InFlight-- })

	if key := s.cfg.RequireAPIKey; key != "" && !d.authorized(r, key) {
		s.count(func(st *Stats) { st.BadRequests++ })
		// Never echo the presented key back.
		d.writeError(w, http.StatusUnauthorized, apiError{Message: "Incorrect API key provided.", Type: "invalid_request_error", Code: "invalid_api_key"})
		return
	}
	body, aerr, status := s.readBody(w, r)
	var req chatRequest
	if aerr == nil {
		req, aerr, status = d.parse(s, body)
	}
	if aerr != nil {
		s.count(func(st *Stats) { st.BadRequests++ })
		d.writeError(w, status, *aerr)
		return
	}

	s.mu.Lock()
	calls := s.trackCallLocked(req.prompt)
	now := s.cfg.Clock.Now()
	if strings.Contains(req.text, s.cfg.QuotaMarker) {
		s.stats.QuotaExhausted++
		s.mu.Unlock()
		d.writeError(w, http.StatusTooManyRequests, apiError{
			Message: "You exceeded your current quota, please check your plan and billing details.",
			Type:    "insufficient_quota", Code: "insufficient_quota",
		})
		return
	}
	charge := req.inTokens + cmpOr(req.maxTokens, llm.DefaultOutputTokens)
	s.seq++
	id := s.seq
	retryAfter, what, ok := s.admitLocked(now, id, charge)
	if !s.cfg.NoRateLimitHeaders {
		d.limitHeaders(w.Header(), now, s.limitsLocked(now))
	}
	if !ok {
		s.stats.RateLimited++
		s.mu.Unlock()
		secs := max(int(math.Ceil(retryAfter.Seconds())), 1)
		d.retryHeaders(w.Header(), retryAfter, !s.cfg.NoRateLimitHeaders)
		limit := s.cfg.Quota
		if what == "tokens" {
			limit = s.cfg.TokenQuota
		}
		d.writeError(w, http.StatusTooManyRequests, apiError{
			Message: fmt.Sprintf("Rate limit reached for %s: limit %d per %v. Please try again in %ds.", what, limit, s.cfg.QuotaWindow, secs),
			Type:    "rate_limit_exceeded", Code: "rate_limit_exceeded",
		})
		return
	}
	roll := s.roll(req.prompt, calls)
	out := s.decide(req.text, calls, roll)
	s.mu.Unlock()

	ctx := r.Context()
	if d := s.latency(roll); d > 0 {
		select {
		case <-s.cfg.Clock.After(d):
		case <-ctx.Done():
			s.count(func(st *Stats) { st.Canceled++ })
			return
		}
	}

	switch out {
	case resetConn:
		s.count(func(st *Stats) { st.Resets++ })
		resetConnection(w, d)
	case hang:
		select {
		case <-s.cfg.Clock.After(s.cfg.HangTimeout):
			s.count(func(st *Stats) { st.ServerErrors++ })
			d.writeError(w, http.StatusGatewayTimeout, apiError{Message: "The server timed out generating a response.", Type: "timeout"})
		case <-ctx.Done():
			s.count(func(st *Stats) { st.Canceled++ })
		}
	case failServer, failUnavailable, failFilter, failTooLong:
		status, e := s.failure(out)
		if out == failUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		d.writeError(w, status, e)
	case failOutputFilter:
		s.count(func(st *Stats) { st.Filtered++ })
		d.answer(w, id, now, req, "", "content_filter")
	default:
		text, finish := s.answerText(req, calls)
		used := req.inTokens + estimateTokens(text)
		s.mu.Lock()
		s.correctLocked(id, used)
		s.stats.Tokens += int64(used)
		s.stats.Succeeded++
		if p, ok := s.prompt[req.prompt]; ok {
			p.Succeeded++
		}
		if s.cfg.PaidLog != nil {
			line, _ := json.Marshal(req.prompt) // a string always marshals
			_, _ = s.cfg.PaidLog.Write(append(line, '\n'))
		}
		s.mu.Unlock()
		d.answer(w, id, now, req, text, finish)
	}
}

// failure is the error answer of a failing outcome, counted.
func (s *Server) failure(out outcome) (int, apiError) {
	param := "messages"
	switch out {
	case failUnavailable:
		s.count(func(st *Stats) { st.ServerErrors++ })
		return http.StatusServiceUnavailable, apiError{Message: "The engine is currently overloaded, please try again later.", Type: "server_error"}
	case failFilter:
		s.count(func(st *Stats) { st.Filtered++ })
		return http.StatusBadRequest, apiError{
			Message: "The response was filtered due to the prompt triggering content management policy.",
			Type:    "invalid_request_error", Code: "content_filter", Param: &param,
		}
	case failTooLong:
		s.count(func(st *Stats) { st.BadRequests++ })
		return http.StatusBadRequest, apiError{
			Message: "This model's maximum context length is 8192 tokens. However, your messages resulted in more tokens. Please reduce the length of the messages.",
			Type:    "invalid_request_error", Code: "context_length_exceeded", Param: &param,
		}
	}
	s.count(func(st *Stats) { st.ServerErrors++ })
	return http.StatusInternalServerError, apiError{Message: "The server had an error while processing your request.", Type: "server_error"}
}

// answerText is the answer to an accepted call and its finish reason: the
// row's copy, or JSON of the shape asked for (counted).
func (s *Server) answerText(req chatRequest, calls int64) (string, string) {
	if req.columns == nil && !req.jsonObject && !req.packed {
		return truncate("Copy for: "+req.prompt, req.maxTokens)
	}
	a := s.structured(req, calls)
	s.count(func(st *Stats) {
		st.Structured++
		if a.items > 0 {
			st.Packed++
			st.PackedItems += int64(a.items)
			st.BrokenItems += int64(a.broken)
		} else if a.broken > 0 {
			st.Broken++
		}
	})
	return a.text, "stop"
}

// resetConnection drops the client's connection with a TCP RST and no
// answer. If the connection cannot be hijacked (HTTP/2), it answers 502.
func resetConnection(w http.ResponseWriter, d dialect) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		d.writeError(w, http.StatusBadGateway, apiError{Message: "connection reset", Type: "server_error"})
		return
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0) // close with RST, not FIN
	}
	_ = conn.Close()
}

func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

// trackCallLocked counts a call for prompt and returns its 1-based number
// (for untracked prompts, 1: they cannot be told apart any more).
func (s *Server) trackCallLocked(prompt string) int64 {
	p, ok := s.prompt[prompt]
	if !ok {
		if len(s.prompt) >= s.cfg.MaxTrackedPrompts {
			s.stats.UntrackedPrompts++
			return 1
		}
		p = &PromptStats{}
		s.prompt[prompt] = p
	}
	p.Calls++
	return p.Calls
}

// tokenCharge is one admitted request's tokens in the window.
type tokenCharge struct {
	at  time.Time
	id  int64
	tok int
}

// admitLocked applies the sliding-window quotas at now. It records and
// admits request id charged tokens, or returns how long until enough of the
// window's oldest requests leave it, and which quota refused ("requests" or
// "tokens").
func (s *Server) admitLocked(now time.Time, id int64, tokens int) (time.Duration, string, bool) {
	cutoff := now.Add(-s.cfg.QuotaWindow)
	s.expireLocked(cutoff)
	if q := s.cfg.Quota; q > 0 && s.n == q {
		return s.window[s.head].Sub(cutoff), "requests", false
	}
	if tq := s.cfg.TokenQuota; tq > 0 && len(s.toks) > 0 && s.tokSum+tokens > tq {
		// Wait until enough charges leave; a request above the whole
		// quota is admitted into an empty window.
		left := s.tokSum
		for _, c := range s.toks {
			left -= c.tok
			if left+tokens <= tq {
				return c.at.Sub(cutoff), "tokens", false
			}
		}
		return s.toks[len(s.toks)-1].at.Sub(cutoff), "tokens", false
	}
	if s.cfg.TokenQuota > 0 {
		s.toks = append(s.toks, tokenCharge{at: now, id: id, tok: tokens})
		s.tokSum += tokens
	}
	q := s.cfg.Quota
	if q == 0 {
		return 0, "", true
	}
	if s.n == len(s.window) {
		// Grow on demand so that a huge Quota costs memory only when
		// that many requests really arrive within one window.
		grown := make([]time.Time, min(max(2*len(s.window), 64), q))
		for i := range s.n {
			grown[i] = s.window[(s.head+i)%len(s.window)]
		}
		s.window, s.head = grown, 0
	}
	s.window[(s.head+s.n)%len(s.window)] = now
	s.n++
	return 0, "", true
}

// expireLocked drops what left the window at cutoff.
func (s *Server) expireLocked(cutoff time.Time) {
	for s.n > 0 && !s.window[s.head].After(cutoff) {
		s.head = (s.head + 1) % len(s.window)
		s.n--
	}
	i := 0
	for i < len(s.toks) && !s.toks[i].at.After(cutoff) {
		s.tokSum -= s.toks[i].tok
		i++
	}
	if i > 0 {
		s.toks = append(s.toks[:0], s.toks[i:]...)
	}
}

// correctLocked replaces request id's token charge by what it used.
func (s *Server) correctLocked(id int64, used int) {
	i, ok := slices.BinarySearchFunc(s.toks, id, func(c tokenCharge, id int64) int { return cmp.Compare(c.id, id) })
	if !ok {
		return // left the window already
	}
	s.tokSum += used - s.toks[i].tok
	s.toks[i].tok = used
}

// limitWindow is one quota in force as a provider states it: per minute,
// what is left of it, and when the window is whole again (one window after
// its newest request).
type limitWindow struct {
	// kind is "requests" or "tokens".
	kind             string
	limit, remaining int
	reset            time.Duration
}

// limitsLocked returns the quotas in force, scaled to a minute.
func (s *Server) limitsLocked(now time.Time) []limitWindow {
	perMinute := float64(time.Minute) / float64(s.cfg.QuotaWindow)
	window := func(kind string, limit, used int, newest time.Time) limitWindow {
		w := limitWindow{kind: kind, limit: int(float64(limit) * perMinute), remaining: int(float64(max(limit-used, 0)) * perMinute)}
		if used > 0 {
			w.reset = max(newest.Add(s.cfg.QuotaWindow).Sub(now), time.Millisecond)
		}
		return w
	}
	var out []limitWindow
	if q := s.cfg.Quota; q > 0 {
		var newest time.Time
		if s.n > 0 {
			newest = s.window[(s.head+s.n-1)%len(s.window)]
		}
		out = append(out, window("requests", q, s.n, newest))
	}
	if tq := s.cfg.TokenQuota; tq > 0 {
		var newest time.Time
		if len(s.toks) > 0 {
			newest = s.toks[len(s.toks)-1].at
		}
		out = append(out, window("tokens", tq, s.tokSum, newest))
	}
	return out
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// roll is the deterministic pseudo-random number in [0, 1) for the calls-th
// call of prompt.
func (s *Server) roll(prompt string, calls int64) float64 {
	h := fnv.New64a()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(s.cfg.Seed))
	h.Write(buf[:])
	binary.LittleEndian.PutUint64(buf[:], uint64(calls))
	h.Write(buf[:])
	h.Write([]byte(prompt))
	x := h.Sum64()
	// splitmix64 finaliser: FNV alone is poorly spread in the high bits.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

func (s *Server) decide(text string, calls int64, roll float64) outcome {
	switch {
	case strings.Contains(text, s.cfg.TimeoutMarker):
		return hang
	case strings.Contains(text, s.cfg.ServerErrorMarker):
		return failServer
	case strings.Contains(text, s.cfg.ResetMarker) && calls <= int64(s.cfg.FlakyFailures):
		return resetConn
	case strings.Contains(text, s.cfg.FlakyMarker) && calls <= int64(s.cfg.FlakyFailures):
		return failUnavailable
	case strings.Contains(text, s.cfg.FilterMarker):
		return failFilter
	case strings.Contains(text, s.cfg.OutputFilterMarker):
		return failOutputFilter
	case strings.Contains(text, s.cfg.TooLongMarker):
		return failTooLong
	case roll < s.cfg.FailRate:
		// Reuse the roll's position within the failure band to split
		// 500s from 503s, so both kinds occur.
		if roll < s.cfg.FailRate/2 {
			return failServer
		}
		return failUnavailable
	}
	return succeed
}

// latency derives the jitter from roll's low digits, independent enough of
// the failure decision (which reads the high ones) for a mock.
func (s *Server) latency(roll float64) time.Duration {
	d := s.cfg.Latency
	if j := s.cfg.Jitter; j > 0 {
		frac := math.Mod(roll*1e6, 1) // in [0, 1)
		d += time.Duration((2*frac - 1) * float64(j))
	}
	return max(d, 0)
}

// chatRequest is the part of the OpenAI request the mock reads.
type chatRequest struct {
	model     string
	prompt    string // first user message: the row's question
	text      string // every message, for markers
	maxTokens int
	inTokens  int
	// columns is the shape the answer must have: from a json_schema
	// response format, or for json_object from a schema in the messages
	// (schema.SchemaInstructions); nil for a plain text answer.
	columns schema.Columns
	// jsonObject asks for a JSON object without a schema the mock knows.
	jsonObject bool
	// packed is a call for several rows (schema.PackPrompt): the answer
	// holds one item per row, each of columns (or one text when none).
	packed bool
}

type wireRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	MaxTokens           *int `json:"max_tokens"`
	MaxCompletionTokens *int `json:"max_completion_tokens"`
	Stream              bool `json:"stream"`
	N                   *int `json:"n"`
	ResponseFormat      *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	} `json:"response_format"`
}

// readBody reads a request's body, up to MaxBodyBytes. On failure it
// returns the error to answer with and its status.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError, int) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{Message: fmt.Sprintf("request body larger than %d bytes", s.cfg.MaxBodyBytes), Type: "invalid_request_error", Code: "request_too_large"}, http.StatusRequestEntityTooLarge
		}
		return nil, &apiError{Message: "could not read request body", Type: "invalid_request_error"}, http.StatusBadRequest
	}
	return body, nil, 0
}

// badRequest is the answer to a request that is wrong in param (or as a
// whole, for ""), in the server's terms.
func badRequest(param, format string, args ...any) (chatRequest, *apiError, int) {
	var p *string
	if param != "" {
		p = &param
	}
	return chatRequest{}, &apiError{Message: fmt.Sprintf(format, args...), Type: "invalid_request_error", Param: p}, http.StatusBadRequest
}

// parse reads and validates a chat completions request body.
func (openAI) parse(s *Server, body []byte) (chatRequest, *apiError, int) {
	bad := badRequest
	var wr wireRequest
	if err := json.Unmarshal(body, &wr); err != nil {
		return bad("", "We could not parse the JSON body of your request: %v", err)
	}
	switch {
	case wr.Model == "":
		return bad("model", "you must provide a model parameter")
	case len(wr.Messages) == 0:
		return bad("messages", "messages must be a non-empty array")
	case wr.Stream:
		return bad("stream", "the mock server does not support streaming")
	case wr.N != nil && *wr.N != 1:
		return bad("n", "the mock server answers one choice only")
	}
	req := chatRequest{model: wr.Model}
	var all strings.Builder
	found := false
	for i, m := range wr.Messages {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return bad(fmt.Sprintf("messages[%d].role", i), "invalid role %q", m.Role)
		}
		text, ok := contentText(m.Content)
		if !ok {
			return bad(fmt.Sprintf("messages[%d].content", i), "content must be a string or an array of text parts")
		}
		all.WriteString(text)
		all.WriteByte('\n')
		if m.Role == "user" && !found {
			// The row's question: later user messages are re-asks of it.
			req.prompt, found = text, true
		}
	}
	if !found {
		return bad("messages", "messages must contain a user message")
	}
	req.text = all.String()
	if rf := wr.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_schema":
			if s.cfg.NoStructuredOutputs {
				return bad("response_format", "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.")
			}
			if rf.JSONSchema == nil || len(rf.JSONSchema.Schema) == 0 {
				return bad("response_format.json_schema", "Missing required parameter: 'response_format.json_schema.schema'.")
			}
			cols, packed, err := answerShape(rf.JSONSchema.Schema)
			if err != nil {
				return bad("response_format.json_schema.schema", "Invalid schema for response_format '%s': %v", rf.JSONSchema.Name, err)
			}
			req.columns, req.packed = cols, packed
		case "json_object":
			if !strings.Contains(strings.ToLower(req.text), "json") {
				return bad("messages", "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.")
			}
			req.jsonObject = true
			req.columns, req.packed = schemaInMessages(req.text)
		default:
			return bad("response_format.type", "Invalid value: '%s'. Supported values are: 'text', 'json_object' and 'json_schema'.", rf.Type)
		}
	}
	req.inTokens = estimateTokens(req.text)
	for _, mt := range []*int{wr.MaxCompletionTokens, wr.MaxTokens} {
		if mt == nil {
			continue
		}
		if *mt < 1 {
			return bad("max_tokens", "max tokens must be at least 1, got %d", *mt)
		}
		req.maxTokens = *mt
	}
	return req, nil, 0
}

// contentText accepts a string or an array of {"type":"text","text":...}
// parts, the two shapes the OpenAI API takes for message content.
func contentText(raw json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", false
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", false
		}
		b.WriteString(p.Text)
	}
	return b.String(), true
}

// structured is the answer to a request for JSON: an object with a valid
// value for every column (text columns quote the row's prompt, as plain
// answers do, so a test can tell whose answer it is), or broken on
// purpose for InvalidRate of the calls; {"answer": ...} for JSON mode with
// no schema the mock can read.
func (s *Server) structured(req chatRequest, calls int64) structuredAnswer {
	if items := schema.UnpackPrompt(req.prompt); req.packed && items != nil {
		text, broken := s.packed(req, items, calls)
		return structuredAnswer{text: text, items: len(items), broken: broken}
	}
	text, broken := s.one(req, req.prompt, calls)
	a := structuredAnswer{text: text}
	if broken {
		a.broken = 1
	}
	return a
}

// structuredAnswer is a JSON answer: for a packed call, how many items it
// was asked and how many it broke; else whether it is broken (1).
type structuredAnswer struct {
	text          string
	items, broken int
}

// packed answers a packed call item by item, as one call of each item's
// prompt would be answered; InvalidRate breaks items, each in one of the
// three ways a model gets a packed answer wrong: an item left out, an item
// given twice, an item's value wrong.
func (s *Server) packed(req chatRequest, items []schema.PackItem, calls int64) (string, int) {
	var kept []schema.PackItem
	var answers []string
	broken := 0
	for _, it := range items {
		text, _ := s.one(req, it.Prompt, -1)
		roll := s.roll(req.prompt+"\x00item "+it.ID, calls)
		if s.cfg.InvalidRate > 0 && roll < s.cfg.InvalidRate {
			broken++
			switch int(roll / s.cfg.InvalidRate * 3) {
			case 0:
				continue // left out
			case 1:
				kept, answers = append(kept, it), append(answers, text) // given twice
			default:
				text = ""
				if len(req.columns) > 0 {
					text = brokenAnswer(req.columns)
				}
			}
		}
		kept, answers = append(kept, it), append(answers, text)
	}
	return schema.PackedText(kept, answers, len(req.columns) > 0), broken
}

// one is the answer to one row's prompt: an object of req's columns, or
// {"answer": ...} for JSON mode without a schema the mock can read; calls
// below 0 never breaks it (a packed item's breaking is packed's).
func (s *Server) one(req chatRequest, prompt string, calls int64) (string, bool) {
	if len(req.columns) == 0 {
		if req.packed {
			return "Copy for: " + prompt, false
		}
		b, _ := json.Marshal(map[string]string{"answer": "Copy for: " + prompt})
		return string(b), false
	}
	// A draw of its own, apart from FailRate's: the prompt with a suffix.
	if calls >= 0 && s.cfg.InvalidRate > 0 && s.roll(prompt+"\x00invalid", calls) < s.cfg.InvalidRate {
		return brokenAnswer(req.columns), true
	}
	return req.columns.SampleAnswer(
		func(i int) uint64 { return uint64(s.roll(prompt+"\x00"+req.columns[i].Name, 0) * (1 << 53)) },
		func(c schema.Column) string { return c.Name + " for: " + prompt }), false
}

// brokenAnswer is an answer no declaration of cols accepts: its first
// column holds an object.
func brokenAnswer(cols schema.Columns) string {
	name, _ := json.Marshal(cols[0].Name)
	return "{" + string(name) + `:{"broken":true}}`
}

// schemaInMessages reads the schema a JSON-mode request carries in its
// messages (llm.Request.SchemaInstructions): nil columns when none.
func schemaInMessages(text string) (schema.Columns, bool) {
	_, after, ok := strings.Cut(text, schema.SchemaMarker)
	if !ok {
		return nil, false
	}
	var raw json.RawMessage
	if err := json.NewDecoder(strings.NewReader(after)).Decode(&raw); err != nil {
		return nil, false
	}
	cols, packed, err := answerShape(raw)
	if err != nil {
		return nil, false
	}
	return cols, packed
}

// answerShape reads the schema a request asks its answer to match: the
// columns of one answer, or of each item of a packed answer
// ({"answers": [{"id", ...}]}; none for items of one text).
func answerShape(raw json.RawMessage) (cols schema.Columns, packed bool, err error) {
	var doc struct {
		Properties struct {
			Answers *struct {
				Type  string          `json:"type"`
				Items json.RawMessage `json:"items"`
			} `json:"answers"`
		} `json:"properties"`
	}
	if json.Unmarshal(raw, &doc) == nil && doc.Properties.Answers != nil && doc.Properties.Answers.Type == "array" {
		item, err := schema.ParseJSONSchema(doc.Properties.Answers.Items)
		if err != nil {
			return nil, true, fmt.Errorf("answers.items: %w", err)
		}
		item = slices.DeleteFunc(item, func(c schema.Column) bool { return c.Name == "id" })
		if len(item) == 1 && item[0].Name == schema.AnswerProperty {
			item = nil
		}
		return item, true, nil
	}
	cols, err = schema.ParseJSONSchema(raw)
	return cols, false, err
}

// truncate cuts text to maxTokens (0 = no cap), reporting the finish reason.
func truncate(text string, maxTokens int) (string, string) {
	if maxTokens <= 0 || estimateTokens(text) <= maxTokens {
		return text, "stop"
	}
	for i := range text {
		if estimateTokens(text[:i]) > maxTokens {
			_, size := utf8.DecodeLastRuneInString(text[:i])
			return text[:i-size], "length"
		}
	}
	return text, "stop"
}

// estimateTokens is the mock's tokenizer: llm.EstimateTokens, about four
// bytes per token for Latin text and one per other character.
func estimateTokens(s string) int { return llm.EstimateTokens(s) }

type completion struct {
	ID                string   `json:"id"`
	Object            string   `json:"object"`
	Created           int64    `json:"created"`
	Model             string   `json:"model"`
	Choices           []choice `json:"choices"`
	Usage             usage    `json:"usage"`
	SystemFingerprint string   `json:"system_fingerprint"`
}

type choice struct {
	Index   int `json:"index"`
	Message struct {
		Role    string  `json:"role"`
		Content string  `json:"content"`
		Refusal *string `json:"refusal"`
	} `json:"message"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason string    `json:"finish_reason"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newCompletion(id int64, now time.Time, req chatRequest, text, finish string) completion {
	c := choice{FinishReason: finish}
	c.Message.Role = "assistant"
	c.Message.Content = text
	out := estimateTokens(text)
	return completion{
		ID:                fmt.Sprintf("chatcmpl-mock-%08d", id),
		Object:            "chat.completion",
		Created:           now.Unix(),
		Model:             req.model,
		Choices:           []choice{c},
		Usage:             usage{PromptTokens: req.inTokens, CompletionTokens: out, TotalTokens: req.inTokens + out},
		SystemFingerprint: "fp_mock",
	}
}

// apiError is OpenAI's error object; it is sent as {"error": {...}}.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

func writeError(w http.ResponseWriter, status int, e apiError) {
	if e.Code == "" {
		e.Code = nil
	}
	writeJSON(w, status, map[string]apiError{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The client may be gone; there is nobody to tell.
	_ = json.NewEncoder(w).Encode(v)
}

// Serve answers HTTP requests on ln until ctx is done, then shuts down
// gracefully (in-flight requests are cancelled, so hanging ones end too).
// It returns nil after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		// Request contexts derive from ctx, so cancelling ctx ends latency
		// waits and [[timeout]] hangs instead of stalling Shutdown.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve mock LLM on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down mock LLM on %s: %w", ln.Addr(), err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve mock LLM on %s: %w", ln.Addr(), err)
	}
	return nil
}

// ListenAndServe listens on addr (e.g. "127.0.0.1:8089") and calls Serve.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for mock LLM on %s: %w", addr, err)
	}
	return s.Serve(ctx, ln)
}
