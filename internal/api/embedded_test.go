package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// embedded is the API as `batchgen serve` wires it: the SQLite store, the
// data directory's files as the bucket, the local queue and the core's
// Intake splitting each upload at once.
type embedded struct {
	*fixture
	handler http.Handler
	queue   *sqlitequeue.Queue
	exports *recordingExports
}

func newEmbedded(t *testing.T) *embedded {
	t.Helper()
	f := newFixture(t)
	q, err := sqlitequeue.New(f.store.DB(), sqlitequeue.Config{Name: "batches", Visibility: time.Minute, MaxReceive: 10})
	if err != nil {
		t.Fatal(err)
	}
	exports := &recordingExports{}
	intake := pipeline.NewIntake(pipeline.NewSplitter(f.store, q, pipeline.SplitterConfig{Clock: f.config.Clock}), f.blobs, exports,
		pipeline.IntakeConfig{
			DefaultSpec: f.config.DefaultSpec, Uploads: pipeline.BlobUploads{Blobs: f.blobs}, TempDir: t.TempDir(), Clock: f.config.Clock,
			Limits: sheet.Limits{MaxFileBytes: f.config.Limits.MaxFileBytes},
		})
	f.config.Presigner = nil
	f.config.Intake = intake
	f.config.Exports = exports
	f.config.Retrier = pipeline.Retrier{Store: f.store, Queue: q}
	f.config.Starter = pipeline.Starter{Store: f.store, Queue: q, Exports: exports}
	ids := []string{"0123456789abcdef0123456789abcdef", "1123456789abcdef0123456789abcdef", "2123456789abcdef0123456789abcdef", "3123456789abcdef0123456789abcdef"}
	f.config.NewID = func() string {
		id := ids[0]
		ids = append(ids[1:], id)
		return id
	}
	return &embedded{fixture: f, handler: api.New(f.config), queue: q, exports: exports}
}

// form is a multipart body: the file and the other fields.
func form(t *testing.T, filename string, content []byte, fields map[string]string) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for k, v := range fields {
		if err := w.WriteField(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if filename != "" {
		part, err := w.CreateFormFile("file", filename)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := part.Write(content); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w.FormDataContentType(), b.Bytes()
}

// rawResponse is an answer that need not be JSON.
type rawResponse struct {
	status int
	header http.Header
	body   []byte
}

func (r rawResponse) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %q", err, r.body)
	}
	return m
}

func (r rawResponse) code(t *testing.T) string {
	t.Helper()
	e, _ := r.json(t)["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func (r rawResponse) message(t *testing.T) string {
	t.Helper()
	e, _ := r.json(t)["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

// send makes one request as a principal of the fixture ("" for none).
func send(t *testing.T, h http.Handler, who, method, target, contentType string, body []byte) rawResponse {
	t.Helper()
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if tok := tokens[who]; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rawResponse{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
}

// upload posts a sheet as multipart/form-data.
func (e *embedded) upload(t *testing.T, who, filename, content string, fields map[string]string) rawResponse {
	t.Helper()
	ct, body := form(t, filename, []byte(content), fields)
	return send(t, e.handler, who, "POST", "/api/tasks", ct, body)
}

const goodCSV = "name,category\nbrick,toys\nball,toys\nkite,outdoor\n"

// TestUploadSplitsAtOnce: a sheet posted as multipart is checked, stored
// under incoming/<id>/ and split by the embedded runtime's Intake before
// the answer, which is the task with its owner's links.
func TestUploadSplitsAtOnce(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	res := e.upload(t, "alice", `C:\Users\alice\..\商品.csv`, goodCSV, map[string]string{"prompt": "Copy for {{name}} in {{category}}", "batch_size": "2", "model": "gpt-4o", "temperature": "0.5", "max_tokens": "100"})
	if res.status != http.StatusCreated {
		t.Fatalf("POST = %d %s, want 201", res.status, res.body)
	}
	got := res.json(t)
	const id = "0123456789abcdef0123456789abcdef"
	if got["id"] != id || got["status"] != "RUNNING" || got["rows_total"] != 3.0 || got["batches_total"] != 2.0 || got["source"] != "商品.csv" || got["model"] != "gpt-4o" {
		t.Errorf("task = %v, want RUNNING with 3 rows in 2 batches from 商品.csv on gpt-4o", got)
	}
	if loc := res.header.Get("Location"); loc != "/api/tasks/"+id {
		t.Errorf("Location = %q", loc)
	}
	task, err := e.store.GetTask(t.Context(), id)
	if err != nil || task.Owner != "alice" || task.Spec.Temperature == nil || *task.Spec.Temperature != 0.5 || task.Spec.MaxTokens != 100 {
		t.Errorf("stored task %+v (%v), want alice's with the form's settings", task, err)
	}
	// The name was reduced to its last segment: nothing escapes incoming/<id>/.
	if _, err := e.blobs.Size(t.Context(), "incoming/"+id+"/商品.csv"); err != nil {
		t.Errorf("the sheet is not at incoming/%s/商品.csv: %v", id, err)
	}
	ds, err := e.queue.Receive(t.Context(), 10)
	if err != nil || len(ds) != 2 {
		t.Errorf("queue holds %d messages (%v), want the 2 batches", len(ds), err)
	}
}

// TestUploadRejectsLikeTheCLI: a file the CLI would reject is answered with
// the core's message, the one `batchgen run` prints, and the status of its
// kind, before anything is stored or queued.
func TestUploadRejectsLikeTheCLI(t *testing.T) {
	t.Parallel()
	png := "\x89PNG\r\n\x1a\n" + strings.Repeat("\x00", 64)
	tests := []struct {
		name, filename, content, prompt string
		status                          int
		code                            string
	}{
		{"unknown placeholder", "products.csv", goodCSV, "Copy for {{nme}}", 400, "rejected_input"},
		{"no data rows", "empty.csv", "name,category\n", "{{name}}", 400, "rejected_input"},
		{"duplicate header", "dup.csv", "name,name\na,b\n", "{{name}}", 400, "rejected_input"},
		{"an image named .xlsx", "photo.xlsx", png, "{{name}}", 415, "unsupported_media_type"},
		{"a PDF named .csv", "report.csv", "%PDF-1.7\n" + strings.Repeat("x", 50), "{{name}}", 415, "unsupported_media_type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEmbedded(t)
			res := e.upload(t, "alice", tc.filename, tc.content, map[string]string{"prompt": tc.prompt})
			if res.status != tc.status || res.code(t) != tc.code {
				t.Fatalf("POST = %d %s, want %d %s", res.status, res.body, tc.status, tc.code)
			}
			// What `batchgen run` says about the same file: it calls
			// pipeline.Validate with the file's base name.
			path := filepath.Join(t.TempDir(), tc.filename)
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, cliErr := pipeline.Validate(pipeline.SplitParams{Path: path, Source: tc.filename, Spec: store.TaskSpec{Prompt: tc.prompt}})
			var rejected *pipeline.RejectedError
			if !errors.As(cliErr, &rejected) {
				t.Fatalf("the CLI's validation accepted the file: %v", cliErr)
			}
			if diff := cmp.Diff(rejected.Error(), res.message(t)); diff != "" {
				t.Errorf("message differs from the CLI's (-cli +api):\n%s", diff)
			}
			if tasks, _ := e.store.ListTasks(t.Context(), 0); len(tasks) != 0 {
				t.Errorf("a rejected upload left %d tasks", len(tasks))
			}
			if _, err := pipeline.LoadUpload(t.Context(), e.blobs, "0123456789abcdef0123456789abcdef"); err == nil {
				t.Error("a rejected upload left an upload record")
			}
		})
	}
}

// TestUploadLimits: the deployment's file size, model, max_tokens and
// batch_size limits apply to the multipart form too.
func TestUploadLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content string
		fields  map[string]string
		status  int
		code    string
	}{
		{"file over the size limit", "name\n" + strings.Repeat("x\n", 600<<10), map[string]string{"prompt": "{{name}}"}, 413, "file_too_large"},
		{"model off the list", goodCSV, map[string]string{"prompt": "{{name}}", "model": "o1-pro"}, 400, "limit_exceeded"},
		{"max_tokens over the cap", goodCSV, map[string]string{"prompt": "{{name}}", "max_tokens": "4001"}, 400, "limit_exceeded"},
		{"batch_size over the cap", goodCSV, map[string]string{"prompt": "{{name}}", "batch_size": "501"}, 400, "limit_exceeded"},
		{"temperature not a number", goodCSV, map[string]string{"prompt": "{{name}}", "temperature": "warm"}, 400, "invalid_request"},
		{"unknown field", goodCSV, map[string]string{"prompt": "{{name}}", "temprature": "1"}, 400, "invalid_request"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEmbedded(t)
			res := e.upload(t, "alice", "a.csv", tc.content, tc.fields)
			if res.status != tc.status || res.code(t) != tc.code {
				t.Fatalf("POST = %d %s, want %d %s", res.status, res.body, tc.status, tc.code)
			}
		})
	}
}

// TestUploadURLLocal: the JSON form answers with the embedded runtime's own
// upload endpoint; the PUT must carry the declared size, and the sheet is
// then checked and split like a multipart upload.
func TestUploadURLLocal(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	created := send(t, e.handler, "alice", "POST", "/api/tasks", "application/json",
		[]byte(`{"filename": "list.csv", "size": `+strconv.Itoa(len(goodCSV))+`, "prompt": "{{name}}"}`))
	if created.status != http.StatusCreated {
		t.Fatalf("POST = %d %s", created.status, created.body)
	}
	url := created.json(t)["upload_url"].(string)
	path := strings.TrimPrefix(url, "http://example.com")
	if res := send(t, e.handler, "alice", "PUT", path, "text/csv", []byte(goodCSV+"x")); res.status != http.StatusBadRequest {
		t.Errorf("PUT of the wrong size = %d %s, want 400", res.status, res.body)
	}
	res := send(t, e.handler, "alice", "PUT", path, "text/csv", []byte(goodCSV))
	if res.status != http.StatusOK || res.json(t)["status"] != "RUNNING" {
		t.Fatalf("PUT = %d %s, want 200 and a RUNNING task", res.status, res.body)
	}
	if res := send(t, e.handler, "alice", "PUT", path, "text/csv", []byte(goodCSV)); res.status != http.StatusConflict {
		t.Errorf("second PUT = %d %s, want 409", res.status, res.body)
	}
}

// TestUploadURLLocalRejects: a sheet PUT to the embedded runtime's upload
// endpoint is checked as a multipart upload is, and the answer to the PUT
// carries the reason in the CLI's words (the web page shows it); the
// task ends FAILED with that reason, as on AWS, where the splitter refuses
// what the bucket took (TestUploadURLRejectionOnAWS), and no row of it is
// queued.
func TestUploadURLLocalRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, filename, prompt, content string
		wantStatus                      int
		wantCode                        string
		wantMessage                     []string
	}{
		{name: "no data rows", filename: "empty.csv", prompt: "{{name}}", content: "name,category\n", wantStatus: 400, wantCode: "rejected_input", wantMessage: []string{"empty.csv", "no data rows"}},
		{name: "a placeholder naming no column", filename: "list.csv", prompt: "{{price}}", content: goodCSV, wantStatus: 400, wantCode: "rejected_input", wantMessage: []string{"{{price}}", "category"}},
		{name: "no spreadsheet", filename: "photo.xlsx", prompt: "{{name}}", content: "\x89PNG\r\n\x1a\n0000", wantStatus: 415, wantCode: "unsupported_media_type", wantMessage: []string{"photo.xlsx"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEmbedded(t)
			req, _ := json.Marshal(map[string]any{"filename": tc.filename, "size": len(tc.content), "prompt": tc.prompt})
			created := send(t, e.handler, "alice", "POST", "/api/tasks", "application/json", req)
			if created.status != http.StatusCreated {
				t.Fatalf("POST = %d %s", created.status, created.body)
			}
			m := created.json(t)
			path := strings.TrimPrefix(m["upload_url"].(string), "http://example.com")
			res := send(t, e.handler, "alice", "PUT", path, api.UploadContentType(tc.filename), []byte(tc.content))
			if res.status != tc.wantStatus || res.code(t) != tc.wantCode {
				t.Fatalf("PUT = %d %s, want %d %s", res.status, res.body, tc.wantStatus, tc.wantCode)
			}
			for _, want := range tc.wantMessage {
				if msg := res.message(t); !strings.Contains(msg, want) {
					t.Errorf("message %q does not say %q", msg, want)
				}
			}
			task, err := e.store.GetTask(t.Context(), m["id"].(string))
			if err != nil || task.State != store.TaskFailed || task.Error != res.message(t) || task.RowsTotal != 0 {
				t.Errorf("task of a refused upload: %+v, %v; want FAILED with the PUT's message and no rows", task, err)
			}
			view := send(t, e.handler, "alice", "GET", "/api/tasks/"+m["id"].(string), "", nil)
			if got := view.json(t); got["status"] != "FAILED" || got["error"] != res.message(t) {
				t.Errorf("GET after the refused PUT: %s, want FAILED with the reason", view.body)
			}
			if res := send(t, e.handler, "alice", "PUT", path, api.UploadContentType(tc.filename), []byte(tc.content)); res.status != http.StatusConflict {
				t.Errorf("second PUT = %d %s, want 409: the task has its (refused) sheet", res.status, res.body)
			}
		})
	}
}

// finish exports a task's rows as a result and marks it SUCCEEDED, as the
// workers and the exporter would.
func (e *embedded) finish(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	for {
		ds, err := e.queue.Receive(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			break
		}
		for _, d := range ds {
			if err := e.queue.Delete(ctx, d.Receipt); err != nil {
				t.Fatal(err)
			}
		}
	}
	batches, err := e.store.ListBatches(ctx, store.ListBatchesParams{TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		c, err := e.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: id, BatchNo: b.No, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		var rows []store.RowResultWrite
		for r := c.FirstRow; r < c.FirstRow+c.RowCount; r++ {
			rows = append(rows, store.RowResultWrite{RowNo: r, Result: store.RowResult{State: store.RowSucceeded, Output: "copy " + strconv.Itoa(r), Attempts: 1}})
		}
		if _, err := e.store.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: id, BatchNo: b.No, Attempt: c.Attempt, Rows: rows, Now: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.FinishBatch(ctx, store.FinishBatchParams{TaskID: id, BatchNo: b.No, Attempt: c.Attempt, Succeeded: c.RowCount, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	task, err := e.store.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	key := pipeline.TaskResultKey(task)
	if err := e.blobs.Put(ctx, key, strings.NewReader("PK-result-of-"+id)); err != nil {
		t.Fatal(err)
	}
	for _, step := range [][2]store.TaskState{{store.TaskRunning, store.TaskExporting}, {store.TaskExporting, store.TaskSucceeded}} {
		if _, err := e.store.TransitionTask(ctx, store.TransitionTaskParams{ID: id, From: []store.TaskState{step[0]}, To: step[1], ResultKey: key, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUploadAsksForCSV: an upload that asks for a CSV result gets a task
// whose result is a CSV file, served as one and named after the input.
func TestUploadAsksForCSV(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	res := e.upload(t, "alice", "商品.csv", goodCSV, map[string]string{"prompt": "{{name}}", "result_format": "CSV"})
	if res.status != http.StatusCreated || res.json(t)["result_format"] != "csv" {
		t.Fatalf("POST = %d %s, want 201 with result_format csv", res.status, res.body)
	}
	const id = "0123456789abcdef0123456789abcdef"
	e.finish(t, id)
	task, err := e.store.GetTask(t.Context(), id)
	if err != nil || task.Spec.ResultFormat != store.ResultCSV || task.ResultKey != "results/"+id+".csv" {
		t.Fatalf("task = %+v (%v), want a CSV result", task, err)
	}
	r := send(t, e.handler, "alice", "GET", "/api/tasks/"+id+"/result", "", nil)
	if ct, cd := r.header.Get("Content-Type"), r.header.Get("Content-Disposition"); r.status != http.StatusOK || ct != "text/csv; charset=utf-8" || !strings.Contains(cd, ".result.csv") {
		t.Errorf("result = %d, Content-Type %q, Content-Disposition %q", r.status, ct, cd)
	}
	if res := e.upload(t, "alice", "b.csv", goodCSV, map[string]string{"prompt": "{{name}}", "result_format": "ods"}); res.status != http.StatusBadRequest || !strings.Contains(res.message(t), "use xlsx or csv") {
		t.Errorf("result_format ods = %d %s, want 400 naming the formats", res.status, res.body)
	}
}

// TestUploadOfAResult: a result sent back in through the API is recognised
// by its result columns, and its task says what became of its rows.
func TestUploadOfAResult(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	header := "name,category," + strings.Join(pipeline.ResultColumns, ",")
	result := header + "\n" +
		"brick,toys,copy,succeeded,,,FALSE,1,10,sim,1,1,again,0123456789abcdef\n" + // flagged
		"ball,toys,,failed,boom,server,,3,,,,,,0123456789abcdef\n" + // failed, but its key is not this row's: changed
		"kite,outdoor,copy,succeeded,,,FALSE,1,10,sim,1,1,,0123456789abcdef\n" + // its key is not this row's: changed
		"yoyo,toys,,,,,,,,,,,,\n" // added by the user
	res := e.upload(t, "alice", "商品.result.csv", result, map[string]string{"prompt": "{{name}}"})
	if res.status != http.StatusCreated {
		t.Fatalf("POST = %d %s", res.status, res.body)
	}
	want := map[string]any{"kept": 0.0, "changed": 2.0, "new": 1.0, "cleared": 0.0, "flagged": 1.0, "failed": 0.0, "blank": 0.0}
	if diff := cmp.Diff(want, res.json(t)["rerun"]); diff != "" {
		t.Errorf("rerun counts of the created task (-want +got):\n%s", diff)
	}
	got := send(t, e.handler, "alice", "GET", "/api/tasks/"+res.json(t)["id"].(string), "", nil)
	if diff := cmp.Diff(want, got.json(t)["rerun"]); diff != "" {
		t.Errorf("rerun counts of GET (-want +got):\n%s", diff)
	}
}

// TestResultAndPreview: the preview shows the first rows as they stand,
// the result is 409 until the task is finished, then streamed as a
// workbook named after the input.
func TestResultAndPreview(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	res := e.upload(t, "alice", "商品 list.csv", goodCSV, map[string]string{"prompt": "{{name}}"})
	if res.status != http.StatusCreated {
		t.Fatalf("POST = %d %s", res.status, res.body)
	}
	const id = "0123456789abcdef0123456789abcdef"
	if r := send(t, e.handler, "alice", "GET", "/api/tasks/"+id+"/result", "", nil); r.status != http.StatusConflict || r.code(t) != "not_finished" {
		t.Errorf("result of a running task = %d %s, want 409 not_finished", r.status, r.body)
	}
	var preview api.Preview
	r := send(t, e.handler, "alice", "GET", "/api/tasks/"+id+"/preview?limit=2", "", nil)
	if err := json.Unmarshal(r.body, &preview); r.status != http.StatusOK || err != nil {
		t.Fatalf("preview = %d %s (%v)", r.status, r.body, err)
	}
	want := api.Preview{ID: id, Status: "RUNNING", RowsTotal: 3,
		Columns: []string{"name", "category", "output", "status", "error"},
		Rows:    [][]string{{"brick", "toys", "", "PENDING", ""}, {"ball", "toys", "", "PENDING", ""}}}
	if diff := cmp.Diff(want, preview); diff != "" {
		t.Errorf("preview of a running task (-want +got):\n%s", diff)
	}

	e.finish(t, id)
	r = send(t, e.handler, "alice", "GET", "/api/tasks/"+id+"/result", "", nil)
	if r.status != http.StatusOK || string(r.body) != "PK-result-of-"+id {
		t.Fatalf("result = %d %q, want the stored workbook", r.status, r.body)
	}
	if ct, cd := r.header.Get("Content-Type"), r.header.Get("Content-Disposition"); ct != "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet" || !strings.Contains(cd, "attachment") || !strings.Contains(cd, "list.result.xlsx") {
		t.Errorf("result headers Content-Type %q, Content-Disposition %q", ct, cd)
	}
	r = send(t, e.handler, "alice", "GET", "/api/tasks/"+id+"/preview", "", nil)
	if err := json.Unmarshal(r.body, &preview); err != nil || preview.Status != "SUCCEEDED" || len(preview.Rows) != 3 || preview.Rows[2][2] != "copy 3" || preview.Rows[2][3] != "SUCCEEDED" {
		t.Errorf("preview of the finished task = %+v (%v)", preview, err)
	}

	// With a presigner (AWS) the result is a redirect to a signed URL.
	e.config.Presigner = fakePresigner{}
	r = send(t, api.New(e.config), "alice", "GET", "/api/tasks/"+id+"/result", "", nil)
	if r.status != http.StatusFound || r.header.Get("Location") != "https://bucket.test/results/"+id+".xlsx?method=GET&ttl=1h0m0s" {
		t.Errorf("result with a presigner = %d Location %q, want 302 to the presigned URL", r.status, r.header.Get("Location"))
	}
}

// TestUploadDeclaresColumns: the columns field, in the short form in a form and as a list in JSON, becomes the
// task's declared columns, shown on the task and in its preview (an answer column named like an input column
// renamed as the result names it); a declaration that cannot be is a 400 naming the column.
func TestUploadDeclaresColumns(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	res := e.upload(t, "alice", "商品.csv", goodCSV, map[string]string{"prompt": "{{name}}", "columns": "category:enum(toys|outdoor)!, score:number"})
	if res.status != http.StatusCreated {
		t.Fatalf("POST = %d %s", res.status, res.body)
	}
	want := []any{
		map[string]any{"name": "category", "type": "enum", "values": []any{"toys", "outdoor"}, "required": true},
		map[string]any{"name": "score", "type": "number"},
	}
	if diff := cmp.Diff(want, res.json(t)["columns"]); diff != "" {
		t.Errorf("columns of the created task (-want +got):\n%s", diff)
	}
	id := res.json(t)["id"].(string)
	var preview api.Preview
	r := send(t, e.handler, "alice", "GET", "/api/tasks/"+id+"/preview?limit=1", "", nil)
	if err := json.Unmarshal(r.body, &preview); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"name", "category", "batchgen_category", "score", "status", "error"}, preview.Columns); diff != "" {
		t.Errorf("preview columns (-want +got):\n%s", diff)
	}

	for fields, wantMsg := range map[string]string{
		"category:enum()":           `columns: column 1 ("category"): an enum needs at least one value`,
		`[{"name":"a","type":"x"}]`: `columns: column 1 ("a"): unknown type "x"`,
		`{"type":"array"}`:          `columns: the schema's type is "array"`,
	} {
		r := e.upload(t, "alice", "商品.csv", goodCSV, map[string]string{"prompt": "{{name}}", "columns": fields})
		if r.status != http.StatusBadRequest || !strings.Contains(r.message(t), wantMsg) {
			t.Errorf("columns %s: %d %s, want 400 %q", fields, r.status, r.body, wantMsg)
		}
	}
}

// TestUploadWithMaxCost: a spending cap in the form becomes the task's,
// shown in its view; an amount that is not one is refused, as is any cap
// on a deployment that cannot hold a task to one; a retry sets a new cap.
func TestUploadWithMaxCost(t *testing.T) {
	t.Parallel()
	fields := func(maxCost string) map[string]string {
		return map[string]string{"prompt": "Copy for {{name}}", "max_cost_usd": maxCost}
	}
	uncapped := newEmbedded(t)
	if res := uncapped.upload(t, "alice", "a.csv", goodCSV, fields("2.5")); res.status != http.StatusBadRequest || !strings.Contains(res.message(t), "cannot hold a task to a spending cap") {
		t.Errorf("a cap where none is held: %d %s, want 400 saying so", res.status, res.body)
	}

	e := newEmbedded(t)
	e.config.Limits.CostCaps = true
	e.handler = api.New(e.config)
	for _, bad := range []string{"-1", "lots", "NaN"} {
		if res := e.upload(t, "alice", "a.csv", goodCSV, fields(bad)); res.status != http.StatusBadRequest || !strings.Contains(res.message(t), "max_cost_usd") {
			t.Errorf("max_cost_usd %q: %d %s, want 400 naming the field", bad, res.status, res.body)
		}
	}
	res := e.upload(t, "alice", "a.csv", goodCSV, fields("2.5"))
	if res.status != http.StatusCreated || res.json(t)["max_cost_usd"] != 2.5 {
		t.Fatalf("POST = %d %s, want 201 with the cap", res.status, res.body)
	}
	id := res.json(t)["id"].(string)
	task, err := e.store.GetTask(t.Context(), id)
	if err != nil || task.MaxCost != 2.5 {
		t.Fatalf("stored task's cap %v (%v), want 2.5", task.MaxCost, err)
	}
	// A retry raises the cap (this task is still running, so the retry
	// itself is refused: the new cap holds at once all the same).
	res = send(t, e.handler, "alice", "POST", "/api/tasks/"+id+"/retry", "application/json", []byte(`{"max_cost_usd": 40}`))
	if task, _ := e.store.GetTask(t.Context(), id); task.MaxCost != 40 {
		t.Errorf("after the retry (%d %s) the cap is %v, want 40", res.status, res.body, task.MaxCost)
	}
}

// TestUploadWithMode: a mode (and an auto task's deadline) in the form
// become the task's, shown in its view; a mode that is not one, auto
// without a deadline, a deadline for another mode or one passed are
// refused naming what is wrong, as is a batch mode on a deployment that
// cannot run provider batches; a retry changes the mode (a task waiting in
// economy finished online).
func TestUploadWithMode(t *testing.T) {
	t.Parallel()
	fields := func(mode, deadline string) map[string]string {
		return map[string]string{"prompt": "Copy for {{name}}", "mode": mode, "deadline": deadline}
	}
	online := newEmbedded(t)
	if res := online.upload(t, "alice", "a.csv", goodCSV, fields("economy", "")); res.status != http.StatusBadRequest || !strings.Contains(res.message(t), "runs tasks online only") {
		t.Errorf("economy where it cannot run: %d %s, want 400 saying so", res.status, res.body)
	}

	e := newEmbedded(t)
	e.config.Limits.BatchModes = true
	e.handler = api.New(e.config)
	now := e.config.Clock.Now()
	soon := now.Add(3 * time.Hour).UTC().Truncate(time.Second)
	for _, bad := range []struct{ mode, deadline, want string }{
		{"cheap", "", `mode "cheap"`},
		{"auto", "", "mode auto needs a deadline"},
		{"economy", soon.Format(time.RFC3339), "deadline is for mode auto"},
		{"auto", "tomorrow", `deadline "tomorrow"`},
		{"auto", now.Add(-time.Hour).UTC().Format(time.RFC3339), "has passed"},
	} {
		if res := e.upload(t, "alice", "a.csv", goodCSV, fields(bad.mode, bad.deadline)); res.status != http.StatusBadRequest || !strings.Contains(res.message(t), bad.want) {
			t.Errorf("mode %q deadline %q: %d %s, want 400 with %q", bad.mode, bad.deadline, res.status, res.body, bad.want)
		}
	}
	res := e.upload(t, "alice", "a.csv", goodCSV, fields("auto", soon.Format(time.RFC3339)))
	if res.status != http.StatusCreated || res.json(t)["mode"] != "auto" || res.json(t)["deadline"] != soon.Format(time.RFC3339) {
		t.Fatalf("POST = %d %s, want 201 with mode auto and its deadline", res.status, res.body)
	}
	id := res.json(t)["id"].(string)
	task, err := e.store.GetTask(t.Context(), id)
	if err != nil || task.Mode != store.ModeAuto || !task.Deadline.Equal(soon) {
		t.Fatalf("stored task's terms %+v (%v), want auto by %s", task.Terms, err, soon)
	}
	res = send(t, e.handler, "alice", "POST", "/api/tasks/"+id+"/retry", "application/json", []byte(`{"mode": "online"}`))
	if task, _ := e.store.GetTask(t.Context(), id); task.Mode != store.ModeOnline || !task.Deadline.IsZero() {
		t.Errorf("after the retry (%d %s) the terms are %+v, want online", res.status, res.body, task.Terms)
	}
}
