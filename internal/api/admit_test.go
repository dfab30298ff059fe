package api_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/store"
)

// TestPrincipalLimits: each per-principal limit is hit, answered 429 with
// Retry-After and a message naming it, while another principal, and the
// same one below the limit, go on.
func TestPrincipalLimits(t *testing.T) {
	t.Parallel()
	seed := func(t *testing.T, f *fixture, owner string, state store.TaskState, rows int, age time.Duration) {
		t.Helper()
		created := now.Add(-age)
		id := fmt.Sprintf("%032x", created.UnixNano()+int64(rows))
		task := store.Task{ID: id, Owner: owner, State: state, Source: "seed.csv", RowsTotal: rows, BatchesTotal: 1,
			Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 100}, Header: []string{"a"}, CreatedAt: created, UpdatedAt: created}
		if err := f.store.CreateTask(context.Background(), task); err != nil {
			t.Fatal(err)
		}
	}
	csv := func(rows int) []byte {
		var b strings.Builder
		b.WriteString("name\n")
		for i := range rows {
			fmt.Fprintf(&b, "brick %d\n", i)
		}
		return []byte(b.String())
	}
	upload := func(t *testing.T, e *embedded, who string, rows int) rawResponse {
		t.Helper()
		ct, body := form(t, fmt.Sprintf("%s-%d.csv", who, rows), csv(rows), map[string]string{"prompt": "{{name}}"})
		return send(t, e.handler, who, "POST", "/api/tasks", ct, body)
	}

	t.Run("active tasks", func(t *testing.T) {
		t.Parallel()
		e := newEmbedded(t)
		e.config.Limits.MaxActiveTasks = 2
		h := api.New(e.config)
		seed(t, e.fixture, "alice", store.TaskRunning, 10, time.Hour)
		seed(t, e.fixture, "alice", store.TaskExporting, 10, 30*time.Minute)
		seed(t, e.fixture, "alice", store.TaskSucceeded, 10, 10*time.Minute) // finished: does not count
		res := doAs(t, h, "alice", "POST", "/api/tasks", `{"filename": "x.csv", "size": 10}`)
		if res.status != http.StatusTooManyRequests || errorCode(res) != "principal_limit" || res.header.Get("Retry-After") != "60" {
			t.Errorf("alice's third unfinished task: %d %q, Retry-After %q; want 429 principal_limit after 60 s", res.status, errorCode(res), res.header.Get("Retry-After"))
		}
		if msg := fmt.Sprint(res.body["error"]); !strings.Contains(msg, "2 unfinished tasks") || !strings.Contains(msg, "max active tasks 2") {
			t.Errorf("refusal %s does not name the limit", msg)
		}
		if res := doAs(t, h, "bob", "POST", "/api/tasks", `{"filename": "x.csv", "size": 10}`); res.status != http.StatusCreated {
			t.Errorf("bob's first task: %d, want 201 (%v)", res.status, res.body)
		}
	})

	t.Run("rows per day", func(t *testing.T) {
		t.Parallel()
		e := newEmbedded(t)
		e.config.Limits.MaxRowsPerDay = 1000
		e.handler = api.New(e.config)
		seed(t, e.fixture, "alice", store.TaskSucceeded, 600, 23*time.Hour)
		seed(t, e.fixture, "alice", store.TaskSucceeded, 300, time.Hour)
		seed(t, e.fixture, "alice", store.TaskSucceeded, 5000, 25*time.Hour) // yesterday's: out of the window
		res := upload(t, e, "alice", 200)
		if res.status != http.StatusTooManyRequests || res.header.Get("Retry-After") != "3600" {
			t.Fatalf("alice's 200 rows over 900 sent today: %d, Retry-After %q; want 429, retry when the 600 rows of 23 h ago leave the day (3600 s)\n%s",
				res.status, res.header.Get("Retry-After"), res.body)
		}
		if body := string(res.body); !strings.Contains(body, "sent 900 rows in the last 24 hours") || !strings.Contains(body, "1000 rows a day") {
			t.Errorf("refusal %s does not name the limit and the rows", body)
		}
		if res := upload(t, e, "alice", 100); res.status != http.StatusCreated {
			t.Errorf("alice's 100 rows, up to the limit: %d, want 201\n%s", res.status, res.body)
		}
		// The day is used up: a task whose sheet comes later is refused too.
		if res := doAs(t, e.handler, "alice", "POST", "/api/tasks", `{"filename": "x.csv", "size": 10}`); res.status != http.StatusTooManyRequests {
			t.Errorf("alice's announced upload with the day used up: %d, want 429", res.status)
		}
		if res := upload(t, e, "bob", 200); res.status != http.StatusCreated {
			t.Errorf("bob's 200 rows: %d, want 201\n%s", res.status, res.body)
		}
	})
}

// TestStreamLimit: a principal's event streams beyond MaxStreams are
// refused with 429 and Retry-After while the others stay open; closing one
// makes room again.
func TestStreamLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.config.Auth = api.Fixed("local") // the task's owner
	f.config.Limits.MaxStreams = 2
	srv := httptest.NewServer(api.New(f.config))
	t.Cleanup(srv.Close)
	const id = "0123456789abcdef0123456789abcdef"
	runningTask(t, f.store, id, 3)
	url := srv.URL + "/api/tasks/" + id + "/events"
	first, second := openStream(t, url, ""), openStream(t, url, "")
	if first.StatusCode != http.StatusOK || second.StatusCode != http.StatusOK {
		t.Fatalf("two streams: %d and %d, want 200", first.StatusCode, second.StatusCode)
	}
	third := openStream(t, url, "")
	body, _ := io.ReadAll(third.Body)
	if third.StatusCode != http.StatusTooManyRequests || third.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "max streams") {
		t.Fatalf("a third stream: %d, Retry-After %q, %s; want 429 naming the limit", third.StatusCode, third.Header.Get("Retry-After"), body)
	}
	first.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		again := openStream(t, url, "")
		if again.StatusCode == http.StatusOK {
			break
		}
		again.Body.Close()
		if time.Now().After(deadline) {
			t.Fatalf("after one stream closed, another is still refused: %d", again.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSlowUploadIsCut: a client that sends a sheet's first bytes and then
// trickles (or stalls) is cut at the upload's deadline, the grace plus its
// declared size at the slowest rate accepted, with 408; the server does not
// wait for it.
func TestSlowUploadIsCut(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	e.config.UploadGrace, e.config.UploadRate = 300*time.Millisecond, 1<<20
	srv := httptest.NewServer(api.New(e.config))
	t.Cleanup(srv.Close)
	created := send(t, e.handler, "alice", "POST", "/api/tasks", "application/json", []byte(`{"filename": "slow.csv", "size": 4096, "prompt": "{{name}}"}`))
	if created.status != http.StatusCreated {
		t.Fatalf("POST = %d %s", created.status, created.body)
	}
	body, stall := io.Pipe()
	go func() {
		_, _ = stall.Write([]byte("name\nbrick\n"))
		time.Sleep(10 * time.Second) // far past the deadline of 0.3 s + 4 KiB at 1 MiB/s
		stall.Close()
	}()
	req, _ := http.NewRequest("PUT", srv.URL+created.json(t)["upload_url"].(string), body)
	req.ContentLength = 4096
	req.Header.Set("Authorization", "Bearer "+tokens["alice"])
	req.Header.Set("Content-Type", "text/csv")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT: %v after %v", err, time.Since(start))
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(answer), "upload_timeout") {
		t.Errorf("stalled upload: %d %s after %v, want 408 upload_timeout", resp.StatusCode, answer, time.Since(start))
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("the server waited %v for the stalled upload, past its deadline", waited)
	}
}

// TestUploadLimit: while one of alice's sheets is still arriving, a second
// is refused with 429 naming the limit; bob's is taken.
func TestUploadLimit(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	e.config.Limits.MaxUploads = 1
	h := api.New(e.config)
	// reading is closed when the handler first reads the PUT's body: it
	// has counted the upload by then.
	reading := make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PUT" {
			r.Body = readHook{r.Body, func() { once.Do(func() { close(reading) }) }}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	created := send(t, h, "alice", "POST", "/api/tasks", "application/json", []byte(`{"filename": "slow.csv", "size": 4096, "prompt": "{{name}}"}`))
	if created.status != http.StatusCreated {
		t.Fatalf("POST = %d %s", created.status, created.body)
	}
	body, stall := io.Pipe()
	t.Cleanup(func() { stall.CloseWithError(errors.New("test over")) })
	req, _ := http.NewRequest("PUT", srv.URL+created.json(t)["upload_url"].(string), body)
	req.ContentLength = 4096
	req.Header.Set("Authorization", "Bearer "+tokens["alice"])
	req.Header.Set("Content-Type", "text/csv")
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	go func() { _, _ = stall.Write([]byte("name\nbrick\n")) }()
	select {
	case <-reading:
	case <-time.After(10 * time.Second):
		t.Fatal("the first upload never reached its handler")
	}
	ct, form2 := form(t, "second.csv", []byte("name\nbrick\n"), map[string]string{"prompt": "{{name}}"})
	res := send(t, h, "alice", "POST", "/api/tasks", ct, form2)
	if res.status != http.StatusTooManyRequests || !strings.Contains(string(res.body), "max uploads") || res.header.Get("Retry-After") == "" {
		t.Errorf("a second upload while the first arrives: %d %s (Retry-After %q), want 429 naming the limit", res.status, res.body, res.header.Get("Retry-After"))
	}
	if res := send(t, h, "bob", "POST", "/api/tasks", ct, form2); res.status != http.StatusCreated {
		t.Errorf("bob's upload: %d %s, want 201", res.status, res.body)
	}
}

// readHook calls read before each Read of the body it wraps.
type readHook struct {
	io.ReadCloser
	read func()
}

func (h readHook) Read(p []byte) (int, error) {
	h.read()
	return h.ReadCloser.Read(p)
}
