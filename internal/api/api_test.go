package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

var now = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// fakePresigner signs nothing: it returns recognisable URLs naming the key,
// method and lifetime, so tests can assert what was presigned.
type fakePresigner struct {
	err   error
	panic bool
}

func (p fakePresigner) PresignPut(_ context.Context, key string, ttl time.Duration, size int64, contentType string) (string, error) {
	if p.panic {
		panic("presigner exploded")
	}
	return fmt.Sprintf("https://bucket.test/%s?method=PUT&ttl=%s&size=%d&type=%s", key, ttl, size, contentType), p.err
}

func (p fakePresigner) PresignGet(_ context.Context, key string, ttl time.Duration) (string, error) {
	return "https://bucket.test/" + key + "?method=GET&ttl=" + ttl.String(), p.err
}

// brokenStore fails every call with an error whose text must never reach
// a client.
type brokenStore struct{ store.Store }

var errSecret = errors.New("dial tcp 10.0.0.7:443: secret-internal-host unreachable")

func (brokenStore) GetTask(context.Context, string) (store.Task, error) {
	return store.Task{}, errSecret
}
func (brokenStore) ListTasks(context.Context, int) ([]store.Task, error) { return nil, errSecret }
func (brokenStore) ListTasksByOwner(context.Context, store.ListTasksByOwnerParams) ([]store.Task, error) {
	return nil, errSecret
}

// The fixture's principals and their tokens.
const (
	aliceToken = "alice-secret-0123456789"
	bobToken   = "bob-secret-0123456789"
)

var tokens = map[string]string{"alice": aliceToken, "bob": bobToken, "": ""}

func mustTokens(t *testing.T) *api.Tokens {
	t.Helper()
	tok, err := api.ParseTokens("alice:" + aliceToken + ",bob:" + bobToken)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// linksOf is the links object of task id as JSON decodes it.
func linksOf(id string, upload bool) map[string]any {
	base := "/api/tasks/" + id
	l := map[string]any{
		"self": base, "result": base + "/result", "preview": base + "/preview", "events": base + "/events",
		"cancel": base + "/cancel", "retry": base + "/retry", "quote": base + "/quote", "start": base + "/start",
	}
	if upload {
		l["upload"] = base + "/upload"
	}
	return l
}

type fixture struct {
	store  *sqlitestore.Store
	blobs  *fileblob.Store
	logs   *bytes.Buffer
	config api.Config
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlitestore.Open(filepath.Join(dir, "db.sqlite"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := fileblob.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &bytes.Buffer{}
	temp := 0.2
	return &fixture{
		store: st, blobs: blobs, logs: logs,
		config: api.Config{
			Store: st, Blobs: blobs, Presigner: fakePresigner{}, Auth: mustTokens(t),
			Clock:  clock.NewFake(now),
			Logger: slog.New(slog.NewJSONHandler(logs, nil)),
			DefaultSpec: store.TaskSpec{
				Prompt: "default {{name}}", Provider: "openai", Model: "gpt-4o-mini", System: "be brief",
				Temperature: &temp, MaxTokens: 300, BatchSize: 100,
			},
			Limits:  api.Limits{MaxBatchSize: 500, MaxFileBytes: 1 << 20, MaxTokens: 4000, Models: []string{"gpt-4o"}},
			TempDir: t.TempDir(),
			NewID:   func() string { return "0123456789abcdef0123456789abcdef" },
		},
	}
}

type response struct {
	status int
	header http.Header
	body   map[string]any
}

// do sends a request as alice.
func do(t *testing.T, h http.Handler, method, target, body string) response {
	t.Helper()
	return doAs(t, h, "alice", method, target, body)
}

// doWith sends a request with a Content-Type as a principal.
func doWith(t *testing.T, h http.Handler, who, method, target, contentType, body string) response {
	t.Helper()
	hdr := http.Header{}
	if contentType != "" {
		hdr.Set("Content-Type", contentType)
	}
	return doHeader(t, h, who, method, target, hdr, body)
}

// doAs sends a request as a principal of the fixture ("" for none) and
// decodes the JSON answer.
func doAs(t *testing.T, h http.Handler, who, method, target, body string) response {
	t.Helper()
	return doHeader(t, h, who, method, target, nil, body)
}

func doHeader(t *testing.T, h http.Handler, who, method, target string, hdr http.Header, body string) response {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, r)
	for k, v := range hdr {
		req.Header[k] = v
	}
	if tok := tokens[who]; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	out := response{status: rec.Code, header: rec.Header()}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("%s %s: Content-Type = %q, want JSON; body %q", method, target, ct, rec.Body.String())
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out.body); err != nil {
		t.Fatalf("%s %s: body is not a JSON object: %v: %q", method, target, err, rec.Body.String())
	}
	return out
}

func errorCode(r response) string {
	e, _ := r.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func TestCreateTask(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := api.New(f.config)
	res := do(t, h, "POST", "/api/tasks", `{"filename": "商品 list.XLSX", "size": 18342, "prompt": "Write copy for {{商品名称}}", "max_tokens": 50, "batch_size": 20}`)
	if res.status != http.StatusCreated {
		t.Fatalf("status = %d, want 201; body %v", res.status, res.body)
	}
	const id = "0123456789abcdef0123456789abcdef"
	want := map[string]any{
		"id": id, "status": "AWAITING_UPLOAD", "source": "商品 list.XLSX", "provider": "openai", "model": "gpt-4o-mini", "result_format": "xlsx",
		"created_at": "2025-06-01T12:00:00Z", "rows_total": 0.0, "rows_succeeded": 0.0, "rows_failed": 0.0, "rows_skipped": 0.0,
		"batches_done": 0.0, "batches_total": 0.0, "links": linksOf(id, true),
		"input_tokens": 0.0, "cached_input_tokens": 0.0, "output_tokens": 0.0,
		// The URL is signed for the declared size and the extension's type
		// (in any case), and the client is told the headers to send.
		"upload_url":    "https://bucket.test/incoming/0123456789abcdef0123456789abcdef/商品 list.xlsx?method=PUT&ttl=15m0s&size=18342&type=application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
		"upload_method": "PUT",
		"upload_headers": map[string]any{
			"Content-Type":   "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
			"Content-Length": "18342",
		},
		"expires_at": "2025-06-01T12:15:00Z",
	}
	if diff := cmp.Diff(want, res.body); diff != "" {
		t.Errorf("response mismatch (-want +got):\n%s", diff)
	}
	if loc := res.header.Get("Location"); loc != "/api/tasks/0123456789abcdef0123456789abcdef" {
		t.Errorf("Location = %q", loc)
	}

	rec, err := pipeline.LoadUpload(t.Context(), f.blobs, "0123456789abcdef0123456789abcdef")
	if err != nil {
		t.Fatalf("LoadUpload: %v", err)
	}
	temp := 0.2
	wantRec := pipeline.UploadRecord{
		TaskID:   "0123456789abcdef0123456789abcdef",
		Filename: "商品 list.XLSX",
		Spec: store.TaskSpec{
			// The request's settings win; the deployment's fill the rest.
			// The default prompt is not copied: the splitter applies it
			// after the workbook's own prompt sheet.
			Prompt: "Write copy for {{商品名称}}", System: "be brief", Provider: "openai", Model: "gpt-4o-mini",
			Temperature: &temp, MaxTokens: 50, BatchSize: 20,
		},
		Owner:     "alice",
		Size:      18342,
		CreatedAt: now,
	}
	if diff := cmp.Diff(wantRec, rec); diff != "" {
		t.Errorf("upload record mismatch (-want +got):\n%s", diff)
	}

	got := do(t, h, "GET", "/api/tasks/0123456789abcdef0123456789abcdef", "")
	wantView := map[string]any{
		"id": id, "status": "AWAITING_UPLOAD", "source": "商品 list.XLSX", "result_format": "xlsx",
		"provider": "openai", "model": "gpt-4o-mini", "created_at": "2025-06-01T12:00:00Z",
		"rows_total": 0.0, "rows_succeeded": 0.0, "rows_failed": 0.0, "rows_skipped": 0.0,
		"batches_done": 0.0, "batches_total": 0.0, "links": linksOf(id, true),
		"input_tokens": 0.0, "cached_input_tokens": 0.0, "output_tokens": 0.0,
	}
	if diff := cmp.Diff(wantView, got.body); diff != "" {
		t.Errorf("awaiting upload view mismatch (-want +got):\n%s", diff)
	}
	// Another principal learns nothing about it.
	if res := doAs(t, h, "bob", "GET", "/api/tasks/"+id, ""); res.status != http.StatusNotFound {
		t.Errorf("bob reads alice's upload: %d %v, want 404", res.status, res.body)
	}
}

func TestCreateTaskRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		body     string
		status   int
		code     string
		contains string
	}{
		{"empty body", "", 400, "invalid_json", "empty"},
		{"not JSON", "filename=a.xlsx", 400, "invalid_json", "not valid JSON"},
		{"truncated JSON", `{"filename": "a.xlsx"`, 400, "invalid_json", "not valid JSON"},
		{"trailing data", `{"filename": "a.xlsx"} {}`, 400, "invalid_json", "unexpected data"},
		{"unknown field", `{"filename": "a.xlsx", "temprature": 1}`, 400, "invalid_json", "temprature"},
		{"wrong type", `{"filename": "a.xlsx", "batch_size": "ten"}`, 400, "invalid_json", `"batch_size" must be an integer`},
		{"missing filename", `{"prompt": "{{a}}"}`, 400, "invalid_request", "filename is required"},
		{"folder in filename", `{"filename": "../etc/a.xlsx"}`, 400, "invalid_request", "without folders"},
		{"hidden filename", `{"filename": ".a.xlsx"}`, 400, "invalid_request", "dot"},
		{"extension only", `{"filename": ".csv"}`, 400, "invalid_request", "dot"},
		{"control character", `{"filename": "a\u0007.xlsx"}`, 400, "invalid_request", "control"},
		{"legacy excel", `{"filename": "a.xls"}`, 400, "invalid_request", "only .xlsx, .xlsm, .csv and .tsv"},
		{"bad template", `{"filename": "a.csv", "prompt": "copy for {{name"}`, 400, "invalid_request", "prompt template"},
		{"temperature too high", `{"filename": "a.csv", "temperature": 2.5}`, 400, "invalid_request", "temperature"},
		{"negative max tokens", `{"filename": "a.csv", "max_tokens": -1}`, 400, "invalid_request", "max_tokens"},
		{"max tokens over the cap", `{"filename": "a.csv", "max_tokens": 4001}`, 400, "limit_exceeded", "at most 4000"},
		{"batch too large", `{"filename": "a.csv", "batch_size": 501}`, 400, "limit_exceeded", "at most 500"},
		{"model not allowed", `{"filename": "a.csv", "model": "o1-pro"}`, 400, "limit_exceeded", `model "o1-pro" is not allowed here; allowed: gpt-4o`},
		{"model of a routed deployment", `{"filename": "a.csv", "size": 3, "model": "gpt-4o"}`, 400, "limit_exceeded", `model "gpt-4o": routed here; leave model out`},
		{"bad encoding name", `{"filename": "a.csv", "size": 3, "encoding": "utf 8; drop"}`, 400, "invalid_request", "encoding"},
		{"unknown result format", `{"filename": "a.csv", "size": 3, "result_format": "ods"}`, 400, "invalid_request", "result_format: result format \"ods\": use xlsx or csv"},
		{"missing size", `{"filename": "a.csv"}`, 400, "invalid_request", "size is required"},
		{"zero size", `{"filename": "a.csv", "size": 0}`, 400, "invalid_request", "at least 1"},
		{"negative size", `{"filename": "a.csv", "size": -5}`, 400, "invalid_request", "at least 1"},
		{"fractional size", `{"filename": "a.csv", "size": 1.5}`, 400, "invalid_json", "size"},
		// The fixture's MaxInputBytes is 1 MiB: one byte more is refused
		// before any URL is signed.
		{"size over the input limit", `{"filename": "a.csv", "size": 1048577}`, 413, "file_too_large", "1048577 bytes; the largest sheet this deployment accepts is 1048576 bytes"},
		{"body too large", `{"filename": "a.csv", "prompt": "` + strings.Repeat("x", 300<<10) + `"}`, 413, "body_too_large", "larger than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if strings.Contains(tc.name, "routed") {
				f.config.Limits.ModelFixed = "routed here"
			}
			res := do(t, api.New(f.config), "POST", "/api/tasks", tc.body)
			if res.status != tc.status || errorCode(res) != tc.code {
				t.Fatalf("got %d %q, want %d %q; body %v", res.status, errorCode(res), tc.status, tc.code, res.body)
			}
			msg := res.body["error"].(map[string]any)["message"].(string)
			if !strings.Contains(msg, tc.contains) {
				t.Errorf("message %q does not contain %q", msg, tc.contains)
			}
			if _, err := pipeline.LoadUpload(t.Context(), f.blobs, "0123456789abcdef0123456789abcdef"); err == nil {
				t.Error("a rejected request left an upload record")
			}
		})
	}
}

func TestCreateTaskWithoutPresigner(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.config.Presigner = nil
	res := do(t, api.New(f.config), "POST", "/api/tasks", `{"filename": "a.csv", "size": 10, "model": "gpt-4o"}`)
	if res.status != http.StatusCreated {
		t.Fatalf("got %d %v, want 201", res.status, res.body)
	}
	// The embedded runtime takes the upload itself.
	if got, want := res.body["upload_url"], "/api/tasks/0123456789abcdef0123456789abcdef/upload"; got != want {
		t.Errorf("upload_url = %v, want %v", got, want)
	}
	// With the public address configured, the URL is built on it, whatever
	// Host the request names (a client's choice, or a rebinding page's).
	f.config.PublicURL = "https://batchgen.example.com"
	hdr := http.Header{"Content-Type": {"application/json"}}
	req := httptest.NewRequest("POST", "/api/tasks", strings.NewReader(`{"filename": "a.csv", "size": 10}`))
	req.Host = "evil.example"
	req.Header = hdr
	req.Header.Set("Authorization", "Bearer "+tokens["alice"])
	rec := httptest.NewRecorder()
	api.New(f.config).ServeHTTP(rec, req)
	if want := `"upload_url":"https://batchgen.example.com/api/tasks/0123456789abcdef0123456789abcdef/upload"`; !strings.Contains(rec.Body.String(), want) {
		t.Errorf("with a public URL and Host evil.example: %d %s, want %s", rec.Code, rec.Body, want)
	}
}

func TestGetTask(t *testing.T) {
	t.Parallel()
	created := now.Add(-time.Hour)
	finished := now.Add(-time.Minute)
	tests := []struct {
		name      string
		task      store.Task
		presigner api.Presigner
		want      map[string]any
	}{
		{
			name: "running task has no result",
			task: store.Task{
				ID: "t-running", Owner: "alice", State: store.TaskRunning, Source: "incoming/a.xlsx", Sheet: "Sheet1",
				Spec:      store.TaskSpec{Prompt: "{{a}}", Provider: "sim", Model: "sim-1", BatchSize: 10},
				RowsTotal: 30, BatchesTotal: 3, BatchesDone: 1, RowsSucceeded: 9, RowsFailed: 1,
				Usage:     store.Usage{InputTokens: 90, OutputTokens: 40},
				CreatedAt: created, UpdatedAt: created,
			},
			presigner: fakePresigner{},
			want: map[string]any{
				"id": "t-running", "status": "RUNNING", "source": "incoming/a.xlsx", "sheet": "Sheet1", "links": linksOf("t-running", false),
				// 10 rows in the hour since it was created; 20 to go.
				"rows_per_second": 10.0 / 3600, "eta_seconds": 7200.0,
				"provider": "sim", "model": "sim-1", "rows_total": 30.0, "rows_succeeded": 9.0, "rows_failed": 1.0,
				"rows_skipped": 0.0, "batches_done": 1.0, "batches_total": 3.0,
				"input_tokens": 90.0, "cached_input_tokens": 0.0, "output_tokens": 40.0, "estimated_cost": 0.0,
				"created_at": "2025-06-01T11:00:00Z", "updated_at": "2025-06-01T11:00:00Z",
			},
		},
		{
			name: "tokens and their estimated cost",
			task: store.Task{
				ID: "t-priced", Owner: "alice", State: store.TaskSucceeded,
				Spec:      store.TaskSpec{Prompt: "{{a}}", Provider: "openai", Model: "gpt-4o-mini", BatchSize: 10},
				RowsTotal: 1, BatchesTotal: 1, BatchesDone: 1, RowsSucceeded: 1,
				Usage:     store.Usage{InputTokens: 2_000_000, CachedInputTokens: 1_000_000, OutputTokens: 500_000},
				CreatedAt: created, UpdatedAt: finished, FinishedAt: finished,
			},
			want: map[string]any{
				"id": "t-priced", "status": "SUCCEEDED", "provider": "openai", "model": "gpt-4o-mini", "links": linksOf("t-priced", false), "rows_per_second": 1.0 / 3540,
				"rows_total": 1.0, "rows_succeeded": 1.0, "rows_failed": 0.0, "rows_skipped": 0.0,
				"batches_done": 1.0, "batches_total": 1.0,
				// 1M input at 0.15, 1M cached at 0.075, 0.5M output at 0.60 per million.
				"input_tokens": 2e6, "cached_input_tokens": 1e6, "output_tokens": 5e5, "estimated_cost": 0.525,
				"created_at": "2025-06-01T11:00:00Z", "updated_at": "2025-06-01T11:59:00Z", "finished_at": "2025-06-01T11:59:00Z",
			},
		},
		{
			// Routed over two providers: each one's tokens at its own
			// price, not all at the first provider's (the spec's).
			name: "routed task at each provider's price",
			task: store.Task{
				ID: "t-routed", Owner: "alice", State: store.TaskSucceeded,
				Spec:      store.TaskSpec{Prompt: "{{a}}", Provider: "openai", Model: "gpt-4o-mini", BatchSize: 10},
				RowsTotal: 2, BatchesTotal: 1, BatchesDone: 1, RowsSucceeded: 2,
				Usage: store.Usage{InputTokens: 3_000_000, CachedInputTokens: 1_000_000, OutputTokens: 1_500_000},
				UsageByProvider: map[string]store.Usage{
					"openai/gpt-4o-mini":                             {InputTokens: 2_000_000, CachedInputTokens: 1_000_000, OutputTokens: 500_000},
					"bedrock/anthropic.claude-3-haiku-20240307-v1:0": {InputTokens: 1_000_000, OutputTokens: 1_000_000},
				},
				CreatedAt: created, UpdatedAt: finished, FinishedAt: finished,
			},
			want: map[string]any{
				"id": "t-routed", "status": "SUCCEEDED", "provider": "openai", "model": "gpt-4o-mini", "links": linksOf("t-routed", false), "rows_per_second": 2.0 / 3540,
				"rows_total": 2.0, "rows_succeeded": 2.0, "rows_failed": 0.0, "rows_skipped": 0.0,
				"batches_done": 1.0, "batches_total": 1.0,
				// gpt-4o-mini: 0.525 as above; claude-3-haiku: 1M input at
				// 0.25 and 1M output at 1.25. At gpt-4o-mini's price alone
				// it would be 0.825.
				"input_tokens": 3e6, "cached_input_tokens": 1e6, "output_tokens": 1.5e6, "estimated_cost": 0.525 + 0.25 + 1.25,
				"created_at": "2025-06-01T11:00:00Z", "updated_at": "2025-06-01T11:59:00Z", "finished_at": "2025-06-01T11:59:00Z",
			},
		},
		{
			name: "partial task links its result",
			task: store.Task{
				ID: "t-partial", Owner: "alice", State: store.TaskPartial, Source: "a.csv", Encoding: "windows-1252",
				Spec:      store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 10, ResultFormat: store.ResultCSV},
				RowsTotal: 2, BatchesTotal: 1, BatchesDone: 1, RowsSucceeded: 1, RowsFailed: 1,
				ResultKey: "results/t-partial.csv", CreatedAt: created, UpdatedAt: finished, FinishedAt: finished,
			},
			presigner: fakePresigner{},
			want: map[string]any{
				"id": "t-partial", "status": "PARTIAL", "links": linksOf("t-partial", false), "rows_per_second": 2.0 / 3540, "source": "a.csv", "encoding": "windows-1252", "provider": "sim",
				"result_format": "csv",
				"rows_total":    2.0, "rows_succeeded": 1.0, "rows_failed": 1.0, "rows_skipped": 0.0,
				"batches_done": 1.0, "batches_total": 1.0,
				"input_tokens": 0.0, "cached_input_tokens": 0.0, "output_tokens": 0.0,
				"result_url":        "https://bucket.test/results/t-partial.csv?method=GET&ttl=1h0m0s",
				"result_expires_at": "2025-06-01T13:00:00Z",
				"created_at":        "2025-06-01T11:00:00Z", "updated_at": "2025-06-01T11:59:00Z", "finished_at": "2025-06-01T11:59:00Z",
			},
		},
		{
			name: "without a presigner there is no link",
			task: store.Task{
				ID: "t-done", Owner: "alice", State: store.TaskSucceeded, Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 1},
				RowsTotal: 1, BatchesTotal: 1, BatchesDone: 1, RowsSucceeded: 1, ResultKey: "results/t-done.xlsx",
				CreatedAt: created, UpdatedAt: finished, FinishedAt: finished,
			},
			want: map[string]any{
				"id": "t-done", "status": "SUCCEEDED", "provider": "sim", "links": linksOf("t-done", false), "rows_per_second": 1.0 / 3540,
				"rows_total": 1.0, "rows_succeeded": 1.0, "rows_failed": 0.0, "rows_skipped": 0.0,
				"batches_done": 1.0, "batches_total": 1.0,
				"input_tokens": 0.0, "cached_input_tokens": 0.0, "output_tokens": 0.0,
				"created_at": "2025-06-01T11:00:00Z", "updated_at": "2025-06-01T11:59:00Z", "finished_at": "2025-06-01T11:59:00Z",
			},
		},
		{
			name: "failed task says why",
			task: store.Task{
				ID: "t-failed", Owner: "alice", State: store.TaskFailed, Source: "incoming/bad.xlsx",
				Spec:      store.TaskSpec{Provider: "sim", BatchSize: 100},
				Error:     `bad.xlsx: prompt template: placeholder {{nme}} names no column; the columns are "name"`,
				CreatedAt: created, UpdatedAt: created, FinishedAt: created,
			},
			presigner: fakePresigner{},
			want: map[string]any{
				"id": "t-failed", "status": "FAILED", "links": linksOf("t-failed", false), "source": "incoming/bad.xlsx", "provider": "sim",
				"error":      `bad.xlsx: prompt template: placeholder {{nme}} names no column; the columns are "name"`,
				"rows_total": 0.0, "rows_succeeded": 0.0, "rows_failed": 0.0, "rows_skipped": 0.0,
				"batches_done": 0.0, "batches_total": 0.0,
				"input_tokens": 0.0, "cached_input_tokens": 0.0, "output_tokens": 0.0,
				"created_at": "2025-06-01T11:00:00Z", "updated_at": "2025-06-01T11:00:00Z", "finished_at": "2025-06-01T11:00:00Z",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.config.Presigner = tc.presigner
			if err := f.store.CreateTask(t.Context(), tc.task); err != nil {
				t.Fatalf("CreateTask: %v", err)
			}
			res := do(t, api.New(f.config), "GET", "/api/tasks/"+tc.task.ID, "")
			if res.status != http.StatusOK {
				t.Fatalf("status = %d; body %v", res.status, res.body)
			}
			if _, ok := tc.want["result_format"]; !ok {
				tc.want["result_format"] = "xlsx"
			}
			if diff := cmp.Diff(tc.want, res.body); diff != "" {
				t.Errorf("view mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestListTasks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for i, id := range []string{"old", "mid", "bobs", "new"} {
		at := now.Add(time.Duration(i) * time.Minute)
		owner := "alice"
		if id == "bobs" {
			owner = "bob"
		}
		err := f.store.CreateTask(t.Context(), store.Task{ID: id, Owner: owner, State: store.TaskRunning, Spec: store.TaskSpec{Provider: "sim", BatchSize: 1}, CreatedAt: at, UpdatedAt: at})
		if err != nil {
			t.Fatal(err)
		}
	}
	h := api.New(f.config)
	list := func(who, target string) ([]string, string) {
		t.Helper()
		res := doAs(t, h, who, "GET", target, "")
		if res.status != http.StatusOK {
			t.Fatalf("GET %s: status %d; body %v", target, res.status, res.body)
		}
		var got []string
		for _, v := range res.body["tasks"].([]any) {
			got = append(got, v.(map[string]any)["id"].(string))
		}
		next, _ := res.body["next_cursor"].(string)
		return got, next
	}
	got, next := list("alice", "/api/tasks")
	if diff := cmp.Diff([]string{"new", "mid", "old"}, got); diff != "" || next != "" {
		t.Errorf("alice's tasks (-want +got):\n%s\nnext_cursor %q, want none", diff, next)
	}
	got, next = list("alice", "/api/tasks?limit=2")
	if diff := cmp.Diff([]string{"new", "mid"}, got); diff != "" || next == "" {
		t.Fatalf("alice's first page (-want +got):\n%s\nnext_cursor %q, want one", diff, next)
	}
	got, next = list("alice", "/api/tasks?limit=2&cursor="+next)
	if diff := cmp.Diff([]string{"old"}, got); diff != "" || next != "" {
		t.Errorf("alice's second page (-want +got):\n%s\nnext_cursor %q, want none", diff, next)
	}
	if got, _ := list("bob", "/api/tasks"); !cmp.Equal([]string{"bobs"}, got) {
		t.Errorf("bob's tasks = %v, want only his own", got)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		broken      bool
		presigner   api.Presigner
		method      string
		target      string
		body        string
		contentType string
		status      int
		code        string
		allow       string
	}{
		{name: "unknown task", method: "GET", target: "/api/tasks/nope", status: 404, code: "not_found"},
		{name: "invalid task id", method: "GET", target: "/api/tasks/a%2F..%2Fb", status: 404, code: "not_found"},
		{name: "unknown path", method: "GET", target: "/api/nothing", status: 404, code: "not_found"},
		{name: "root", method: "GET", target: "/", status: 404, code: "not_found"},
		{name: "delete a task", method: "DELETE", target: "/api/tasks/abc", status: 405, code: "method_not_allowed", allow: "GET, HEAD"},
		{name: "put the collection", method: "PUT", target: "/api/tasks", status: 405, code: "method_not_allowed", allow: "POST, GET, HEAD"},
		{name: "bad limit", method: "GET", target: "/api/tasks?limit=0", status: 400, code: "invalid_request"},
		{name: "forged cursor", method: "GET", target: "/api/tasks?cursor=eyJpIjoiLi4vLi4ifQ", status: 400, code: "invalid_request"},
		{name: "form without a file", method: "POST", target: "/api/tasks", body: "--x\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n{{a}}\r\n--x--\r\n", contentType: "multipart/form-data; boundary=x", status: 400, code: "invalid_request"},
		{name: "plain text body", method: "POST", target: "/api/tasks", body: "a,b", contentType: "text/csv", status: 415, code: "unsupported_media_type"},
		{name: "store down on get", broken: true, method: "GET", target: "/api/tasks/abc", status: 500, code: "internal"},
		{name: "store down on list", broken: true, method: "GET", target: "/api/tasks", status: 500, code: "internal"},
		{name: "presign fails", presigner: fakePresigner{err: errSecret}, method: "POST", target: "/api/tasks", body: `{"filename": "a.csv", "size": 10}`, status: 500, code: "internal"},
		{name: "handler panics", presigner: fakePresigner{panic: true}, method: "POST", target: "/api/tasks", body: `{"filename": "a.csv", "size": 10}`, status: 500, code: "internal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if tc.broken {
				f.config.Store = brokenStore{f.store}
			}
			if tc.presigner != nil {
				f.config.Presigner = tc.presigner
			}
			res := doWith(t, api.New(f.config), "alice", tc.method, tc.target, tc.contentType, tc.body)
			if res.status != tc.status || errorCode(res) != tc.code {
				t.Fatalf("got %d %q, want %d %q; body %v", res.status, errorCode(res), tc.status, tc.code, res.body)
			}
			if got := res.header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow = %q, want %q", got, tc.allow)
			}
			if tc.status == 500 {
				msg := res.body["error"].(map[string]any)["message"]
				if msg != "internal error" {
					t.Errorf("500 message = %q, want %q", msg, "internal error")
				}
				// The detail is logged for operators, never sent.
				if !strings.Contains(f.logs.String(), "secret-internal-host") && !strings.Contains(f.logs.String(), "presigner exploded") {
					t.Errorf("the internal error was not logged: %s", f.logs.String())
				}
			}
		})
	}
}

func TestLoadUploadRejectsForeignIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := []struct{ name, id string }{
		{"path traversal", "../secrets"},
		{"empty", ""},
		{"missing", "abc"},
	}
	for _, tc := range tests {
		if _, err := pipeline.LoadUpload(t.Context(), f.blobs, tc.id); err == nil {
			t.Errorf("%s: LoadUpload(%q) succeeded", tc.name, tc.id)
		}
	}
}

func TestIncomingKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ id, filename, want string }{
		{"abc", "a.xlsx", "incoming/abc/a.xlsx"},
		{"abc", "Report.Final.CSV", "incoming/abc/Report.Final.csv"},
		{"abc", "商品 list.XLSX", "incoming/abc/商品 list.xlsx"},
	}
	for _, tc := range tests {
		if got := pipeline.IncomingKey(tc.id, tc.filename); got != tc.want {
			t.Errorf("IncomingKey(%q, %q) = %q, want %q", tc.id, tc.filename, got, tc.want)
		}
	}
}

type recordingExports struct{ ids []string }

func (r *recordingExports) StartExport(_ context.Context, id string, _ int) error {
	r.ids = append(r.ids, id)
	return nil
}

func TestCancelTask(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	exports := &recordingExports{}
	f.config.Exports = exports
	h := api.New(f.config)
	const id = "0123456789abcdef0123456789abcdef"
	if err := f.store.CreateTask(context.Background(), store.Task{
		ID: id, Owner: "alice", State: store.TaskRunning, Source: "incoming/x/a.xlsx", Header: []string{"a"}, RowsTotal: 3, BatchesTotal: 1,
		Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 3}, CreatedAt: now, UpdatedAt: now,
	}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, method, target string
		status               int
		code                 string
	}{
		{"cancel a running task", "POST", "/api/tasks/" + id + "/cancel", http.StatusAccepted, ""},
		{"cancel it again", "POST", "/api/tasks/" + id + "/cancel", http.StatusConflict, "conflict"},
		{"unknown task", "POST", "/api/tasks/ffffffffffffffffffffffffffffffff/cancel", http.StatusNotFound, "not_found"},
		{"wrong method", "GET", "/api/tasks/" + id + "/cancel", http.StatusMethodNotAllowed, "method_not_allowed"},
	}
	for _, tc := range tests { // in order: the second depends on the first
		r := do(t, h, tc.method, tc.target, "")
		if r.status != tc.status || errorCode(r) != tc.code {
			t.Errorf("%s: %d %q, want %d %q (%v)", tc.name, r.status, errorCode(r), tc.status, tc.code, r.body)
		}
		if tc.status == http.StatusAccepted && r.body["status"] != "CANCELLED" {
			t.Errorf("%s: status %v, want CANCELLED", tc.name, r.body["status"])
		}
	}
	if len(exports.ids) != 1 || exports.ids[0] != id {
		t.Errorf("exports started %v, want the partial export of %s once", exports.ids, id)
	}
	task, err := f.store.GetTask(context.Background(), id)
	if err != nil || task.State != store.TaskCancelled {
		t.Errorf("stored task %s (%v), want CANCELLED", task.State, err)
	}
}

// TestDefaultModelOnlyWithoutAllowList: a deployment without an allow-list runs its default model only: a request
// naming another is refused (so a token holder cannot pick the most expensive model on the operator's key), one
// naming the default or none is taken.
func TestDefaultModelOnlyWithoutAllowList(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.config.Limits.Models = nil
	h := api.New(f.config)
	res := do(t, h, "POST", "/api/tasks", `{"filename": "a.csv", "size": 10, "model": "o1-pro"}`)
	msg, _ := res.body["error"].(map[string]any)["message"].(string)
	if res.status != http.StatusBadRequest || !strings.Contains(msg, `model "o1-pro": this deployment runs only its default model "gpt-4o-mini"`) {
		t.Errorf("another model: %d %v", res.status, res.body)
	}
	for _, body := range []string{`{"filename": "a.csv", "size": 10, "model": "gpt-4o-mini"}`, `{"filename": "b.csv", "size": 10}`} {
		if res := do(t, h, "POST", "/api/tasks", body); res.status != http.StatusCreated {
			t.Errorf("%s: %d %v, want 201", body, res.status, res.body)
		}
	}
}
