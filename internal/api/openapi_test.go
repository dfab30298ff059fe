package api_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/store"
)

func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI())
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI 3 document: %v", err)
	}
	return doc
}

// observer serves requests through a handler, validates every response
// against the document (status documented, headers, JSON bodies against
// their schemas) and records which operation answered with which status.
type observer struct {
	t      *testing.T
	router routers.Router
	seen   map[string]map[int]bool // "METHOD /path/{id}" -> statuses
}

func (o *observer) serve(h http.Handler, who string, req *http.Request) rawResponse {
	o.t.Helper()
	if tok := tokens[who]; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	body, _ := io.ReadAll(req.Body)
	req.Body = io.NopCloser(bytes.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rawResponse{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}

	vreq := req.Clone(context.Background())
	vreq.Body = io.NopCloser(bytes.NewReader(body))
	route, params, err := o.router.FindRoute(vreq)
	if err != nil {
		o.t.Errorf("%s %s: no operation in the document: %v", req.Method, req.URL.Path, err)
		return res
	}
	op := req.Method + " " + route.Path
	if o.seen[op] == nil {
		o.seen[op] = map[int]bool{}
	}
	o.seen[op][res.status] = true
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: res.status, Header: res.header, Body: io.NopCloser(bytes.NewReader(res.body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	}
	if !strings.HasPrefix(res.header.Get("Content-Type"), "application/json") {
		// Workbooks and event streams: the status and headers are checked,
		// the bytes are the other tests' business.
		out.Options.ExcludeResponseBody = true
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		o.t.Errorf("%s %s -> %d does not match the document: %v\nbody: %.300s", req.Method, req.URL, res.status, err, res.body)
	}
	return res
}

func request(method, target, contentType string, body []byte) *http.Request {
	r := httptest.NewRequest(method, target, bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return r
}

// TestOpenAPI holds the handler and openapi.yaml to each other: the
// document is valid; its operations are exactly the handler's routes; the
// fields of every body type are exactly its schema's properties; and a
// run of requests that provokes every documented status of every
// operation gets only documented statuses, each answer valid against its
// schema.
func TestOpenAPI(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)

	// Operations <-> routes.
	var documented []string
	statuses := map[string][]int{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			key := method + " " + path
			documented = append(documented, key)
			for code := range op.Responses.Map() {
				if code == "default" {
					continue
				}
				n, err := strconv.Atoi(code)
				if err != nil {
					t.Fatalf("%s: response %q is not a status", key, code)
				}
				statuses[key] = append(statuses[key], n)
			}
			sort.Ints(statuses[key])
			if op.Responses.Default() == nil {
				t.Errorf("%s documents no default (500) response", key)
			}
		}
	}
	var served []string
	for _, rt := range api.Routes() {
		served = append(served, rt[0]+" "+rt[1])
	}
	sort.Strings(documented)
	sort.Strings(served)
	if diff := cmp.Diff(served, documented); diff != "" {
		t.Errorf("operations in openapi.yaml vs routes of the handler (-handler +document):\n%s", diff)
	}

	// Body types <-> schemas.
	schema := func(name string) *openapi3.Schema { return doc.Components.Schemas[name].Value }
	for _, tc := range []struct {
		schema string
		typ    any
		extra  []string
	}{
		{"Task", api.TaskView{}, nil},
		{"Links", api.Links{}, nil},
		{"TaskList", api.TaskList{}, nil},
		{"Preview", api.Preview{}, nil},
		{"Error", api.ErrorBody{}, nil},
		{"CreateTaskRequest", api.CreateTaskRequest{}, nil},
		{"CreatedForUpload", api.CreateTaskResponse{}, nil},
	} {
		var props []string
		s := schema(tc.schema)
		for p := range s.Properties {
			props = append(props, p)
		}
		for _, part := range s.AllOf {
			for p := range part.Value.Properties {
				props = append(props, p)
			}
		}
		sort.Strings(props)
		if diff := cmp.Diff(jsonFields(reflect.TypeOf(tc.typ)), props); diff != "" {
			t.Errorf("%T vs schema %s (-Go +document):\n%s", tc.typ, tc.schema, diff)
		}
	}
	var formProps []string
	for p := range schema("CreateTaskForm").Properties {
		formProps = append(formProps, p)
	}
	sort.Strings(formProps)
	wantForm := []string{"batch_size", "columns", "deadline", "encoding", "file", "max_cost_usd", "max_tokens", "mode", "model", "prompt", "result_format", "rows_per_call", "sample", "system", "temperature"}
	if diff := cmp.Diff(wantForm, formProps); diff != "" {
		t.Errorf("multipart fields vs schema CreateTaskForm (-handler +document):\n%s", diff)
	}

	// Every documented status, provoked.
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	o := &observer{t: t, router: router, seen: map[string]map[int]bool{}}
	provokeEveryStatus(t, o)

	for op, want := range statuses {
		var got []int
		for s := range o.seen[op] {
			if s != http.StatusInternalServerError {
				got = append(got, s)
			}
		}
		sort.Ints(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: documented statuses vs statuses served in the run (-document +handler):\n%s", op, diff)
		}
	}
}

// jsonFields lists the JSON names of a struct's fields, embedded structs
// flattened, as encoding/json would.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// provokeEveryStatus runs requests that, together, get every status the
// handler serves on each operation (500 aside, which TestErrors covers).
func provokeEveryStatus(t *testing.T, o *observer) {
	ctx := context.Background()
	e := newEmbedded(t)
	h := e.handler
	csv := func(fields map[string]string) (string, []byte) {
		return form(t, "list.csv", []byte(goodCSV), fields)
	}

	// POST /api/tasks
	ct, body := csv(map[string]string{"prompt": "{{name}}"})
	created := o.serve(h, "alice", request("POST", "/api/tasks", ct, body))
	running := created.json(t)["id"].(string)
	forUpload := o.serve(h, "alice", request("POST", "/api/tasks", "application/json", []byte(`{"filename": "later.csv", "size": `+strconv.Itoa(len(goodCSV))+`}`)))
	waiting := forUpload.json(t)["id"].(string)
	// A refused sheet fails its task, so refusals get one of their own.
	refusing := o.serve(h, "alice", request("POST", "/api/tasks", "application/json", []byte(`{"filename": "later.csv", "size": `+strconv.Itoa(len(goodCSV))+`}`))).json(t)["id"].(string)
	o.serve(h, "alice", request("POST", "/api/tasks", "application/json", []byte(`{"filename": "a.csv"`)))
	o.serve(h, "", request("POST", "/api/tasks", "application/json", []byte(`{}`)))
	o.serve(h, "alice", request("POST", "/api/tasks", "application/json", []byte(`{"filename": "a.csv", "size": 2000000}`)))
	o.serve(h, "alice", request("POST", "/api/tasks", "text/csv", []byte(goodCSV)))

	// GET /api/tasks
	o.serve(h, "alice", request("GET", "/api/tasks?limit=1", "", nil))
	o.serve(h, "alice", request("GET", "/api/tasks?limit=0", "", nil))
	o.serve(h, "", request("GET", "/api/tasks", "", nil))

	// GET /api/tasks/{id}
	o.serve(h, "alice", request("GET", "/api/tasks/"+running, "", nil))
	o.serve(h, "alice", request("GET", "/api/tasks/"+waiting, "", nil))
	o.serve(h, "", request("GET", "/api/tasks/"+running, "", nil))
	o.serve(h, "bob", request("GET", "/api/tasks/"+running, "", nil))

	// GET /api/tasks/{id}/quote and POST /api/tasks/{id}/start: a task held
	// for its quote, quoted and started; one awaiting its sheet conflicts.
	ct, body = csv(map[string]string{"prompt": "{{name}}", "sample": "2"})
	held := o.serve(h, "alice", request("POST", "/api/tasks", ct, body)).json(t)["id"].(string)
	o.serve(h, "alice", request("GET", "/api/tasks/"+held+"/quote", "", nil))
	o.serve(h, "alice", request("GET", "/api/tasks/"+held+"/quote?deadline=soon", "", nil))
	o.serve(h, "", request("GET", "/api/tasks/"+held+"/quote", "", nil))
	o.serve(h, "bob", request("GET", "/api/tasks/"+held+"/quote", "", nil))
	o.serve(h, "alice", request("GET", "/api/tasks/"+waiting+"/quote", "", nil))
	o.serve(h, "alice", request("POST", "/api/tasks/"+held+"/start", "application/json", []byte(`{"mode": "fast"}`)))
	o.serve(h, "", request("POST", "/api/tasks/"+held+"/start", "", nil))
	o.serve(h, "bob", request("POST", "/api/tasks/"+held+"/start", "", nil))
	noStart := e.config
	noStart.Starter = nil
	o.serve(api.New(noStart), "alice", request("POST", "/api/tasks/"+held+"/start", "", nil))
	o.serve(h, "alice", request("POST", "/api/tasks/"+held+"/start", "application/json", []byte(`{"mode": "online"}`)))
	o.serve(h, "alice", request("POST", "/api/tasks/"+held+"/start", "", nil))

	// GET /api/tasks/{id}/preview
	o.serve(h, "alice", request("GET", "/api/tasks/"+running+"/preview", "", nil))
	o.serve(h, "alice", request("GET", "/api/tasks/"+running+"/preview?limit=0", "", nil))
	o.serve(h, "", request("GET", "/api/tasks/"+running+"/preview", "", nil))
	o.serve(h, "bob", request("GET", "/api/tasks/"+running+"/preview", "", nil))
	o.serve(h, "alice", request("GET", "/api/tasks/"+waiting+"/preview", "", nil))

	// GET /api/tasks/{id}/result
	o.serve(h, "alice", request("GET", "/api/tasks/"+running+"/result", "", nil))
	o.serve(h, "", request("GET", "/api/tasks/"+running+"/result", "", nil))
	o.serve(h, "bob", request("GET", "/api/tasks/"+running+"/result", "", nil))

	// PUT /api/tasks/{id}/upload
	png := []byte("\x89PNG\r\n\x1a\n" + strings.Repeat("\x00", len(goodCSV)-8))
	o.serve(h, "alice", request("PUT", "/api/tasks/"+waiting+"/upload", "text/csv", []byte("short")))
	o.serve(h, "alice", request("PUT", "/api/tasks/"+refusing+"/upload", "image/png", png))
	tooLong := request("PUT", "/api/tasks/"+waiting+"/upload", "text/csv", []byte(goodCSV+"more,rows\n"))
	tooLong.ContentLength = -1 // a chunked body: only reading it finds it too long
	o.serve(h, "alice", tooLong)
	o.serve(h, "", request("PUT", "/api/tasks/"+waiting+"/upload", "text/csv", []byte(goodCSV)))
	o.serve(h, "bob", request("PUT", "/api/tasks/"+waiting+"/upload", "text/csv", []byte(goodCSV)))
	uploaded := o.serve(h, "alice", request("PUT", "/api/tasks/"+waiting+"/upload", "text/csv", []byte(goodCSV)))
	if uploaded.status != http.StatusOK {
		t.Fatalf("upload = %d %s", uploaded.status, uploaded.body)
	}
	o.serve(h, "alice", request("PUT", "/api/tasks/"+waiting+"/upload", "text/csv", []byte(goodCSV)))

	// POST /api/tasks/{id}/cancel: the uploaded task is cancelled, twice.
	o.serve(h, "alice", request("POST", "/api/tasks/"+waiting+"/cancel", "", nil))
	o.serve(h, "alice", request("POST", "/api/tasks/"+waiting+"/cancel", "", nil))
	o.serve(h, "", request("POST", "/api/tasks/"+waiting+"/cancel", "", nil))
	o.serve(h, "bob", request("POST", "/api/tasks/"+waiting+"/cancel", "", nil))

	// The running task finishes; its result and events.
	e.finish(t, running)
	o.serve(h, "alice", request("GET", "/api/tasks/"+running+"/result", "", nil))
	withPresigner := e.config
	withPresigner.Presigner = fakePresigner{}
	o.serve(api.New(withPresigner), "alice", request("GET", "/api/tasks/"+running+"/result", "", nil))
	stream := o.serve(h, "alice", request("GET", "/api/tasks/"+running+"/events", "", nil))
	var lastID string
	for line := range strings.Lines(string(stream.body)) {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "id: "); ok {
			lastID = id
		}
	}
	again := request("GET", "/api/tasks/"+running+"/events", "", nil)
	again.Header.Set("Last-Event-ID", lastID)
	o.serve(h, "alice", again)
	o.serve(h, "", request("GET", "/api/tasks/"+running+"/events", "", nil))
	o.serve(h, "bob", request("GET", "/api/tasks/"+running+"/events", "", nil))
	if err := e.blobs.Delete(ctx, "results/"+running+".xlsx"); err != nil {
		t.Fatal(err)
	}
	o.serve(h, "alice", request("GET", "/api/tasks/"+running+"/result", "", nil))

	// POST /api/tasks/{id}/retry
	const partial = "fedcba9876543210fedcba9876543210"
	finishedTask(t, e.store, partial)
	o.serve(h, "alice", request("POST", "/api/tasks/"+partial+"/retry", "application/json", []byte(`{"error_class": "Bad Class"}`)))
	o.serve(h, "alice", request("POST", "/api/tasks/"+partial+"/retry", "application/json", []byte(`{"error_class": "server_error"}`)))
	o.serve(h, "alice", request("POST", "/api/tasks/"+partial+"/retry", "", nil))
	o.serve(h, "", request("POST", "/api/tasks/"+partial+"/retry", "", nil))
	o.serve(h, "bob", request("POST", "/api/tasks/"+partial+"/retry", "", nil))
	noRetry := e.config
	noRetry.Retrier = nil
	o.serve(api.New(noRetry), "alice", request("POST", "/api/tasks/"+partial+"/retry", "", nil))

	// The per-principal limits: a sheet past the day's rows, and a second
	// stream of alice's while her first is open.
	limited := e.config
	limited.Limits.MaxRowsPerDay, limited.Limits.MaxStreams = 1, 1
	lh := api.New(limited)
	ct, body = csv(map[string]string{"prompt": "{{name}}"})
	o.serve(lh, "alice", request("POST", "/api/tasks", ct, body))
	const watched = "abcdef0123456789abcdef0123456789"
	if err := e.store.CreateTask(ctx, store.Task{ID: watched, Owner: "alice", State: store.TaskRunning, Source: "w.csv", Header: []string{"a"},
		RowsTotal: 1, BatchesTotal: 1, Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 1}, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(lh)
	defer srv.Close()
	first, err := http.NewRequest("GET", srv.URL+"/api/tasks/"+watched+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	first.Header.Set("Authorization", "Bearer "+tokens["alice"])
	open, err := http.DefaultClient.Do(first)
	if err != nil || open.StatusCode != http.StatusOK {
		t.Fatalf("alice's first stream: %v %v", open, err)
	}
	defer open.Body.Close()
	o.serve(lh, "alice", request("GET", "/api/tasks/"+watched+"/events", "", nil))
}
