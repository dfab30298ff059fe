package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// serveProc is a `batchgen serve` process started by a test.
type serveProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string // http://127.0.0.1:PORT
	data string
	mu   sync.Mutex
	errb bytes.Buffer
	done chan struct{}
}

var listenLine = regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+)`)

// startServe runs `batchgen serve` on a free loopback port over data, with
// the model at mock (--provider openai), and returns once it listens. The
// process is killed at the end of the test if still running.
func startServe(t *testing.T, data string, mock *httptest.Server, extra ...string) *serveProc {
	t.Helper()
	return startServeEnv(t, data, mock, nil, extra...)
}

// startServeEnv is startServe with more environment variables.
func startServeEnv(t *testing.T, data string, mock *httptest.Server, env []string, extra ...string) *serveProc {
	t.Helper()
	return startServeWith(t, data, env, append([]string{"--provider", "openai", "--base-url", mock.URL + "/v1", "--concurrency", "2"}, extra...)...)
}

// startServeWith runs `batchgen serve` on a free loopback port over data
// with batches of 5 rows and the given provider flags (and others), and
// returns once it listens.
func startServeWith(t *testing.T, data string, env []string, extra ...string) *serveProc {
	t.Helper()
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", data, "--drop-interval", "50ms", "--batch-size", "5"}, extra...)
	cmd := exec.Command(binary, args...)
	cmd.Env = append(append(os.Environ(), "OPENAI_API_KEY=test-key"), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &serveProc{t: t, cmd: cmd, data: data, done: make(chan struct{})}
	cmd.Stderr = lockedWriter{&p.mu, &p.errb}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("serve stderr:\n%s", p.stderr())
		}
	})
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if m := listenLine.FindStringSubmatch(lines.Text()); m != nil {
			p.url = m[1]
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return p
		}
	}
	<-p.done
	t.Fatalf("serve did not start: exit %v\n%s", cmd.ProcessState, p.stderr())
	return nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (p *serveProc) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errb.String()
}

// stop sends SIGTERM, as a service manager does, and waits for the exit.
func (p *serveProc) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("serve did not stop within 30s of SIGTERM\n%s", p.stderr())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		p.t.Errorf("serve exited %d after SIGTERM, want 0\n%s", code, p.stderr())
	}
}

// getJSON GETs path and decodes the JSON answer into v.
func (p *serveProc) getJSON(path string, v any) int {
	p.t.Helper()
	resp, err := http.Get(p.url + path)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		p.t.Fatalf("GET %s: decode: %v", path, err)
	}
	return resp.StatusCode
}

// apiTask is the part of the API's task view the tests read.
type apiTask struct {
	TaskID        string `json:"id"`
	State         string `json:"status"`
	Source        string `json:"source"`
	RowsTotal     int    `json:"rows_total"`
	RowsSucceeded int    `json:"rows_succeeded"`
	RowsFailed    int    `json:"rows_failed"`
}

func (p *serveProc) tasks() []apiTask {
	p.t.Helper()
	var list struct {
		Tasks []apiTask `json:"tasks"`
	}
	if code := p.getJSON("/api/tasks", &list); code != http.StatusOK {
		p.t.Fatalf("GET /api/tasks: %d", code)
	}
	return list.Tasks
}

// onlyTask waits for the server's one task and returns its id.
func (p *serveProc) onlyTask() string {
	var id string
	waitFor(p.t, "the task", func() bool {
		if ts := p.tasks(); len(ts) == 1 {
			id = ts[0].TaskID
		}
		return id != ""
	})
	return id
}

// sseEvent is one event of a task's stream as a client receives it.
type sseEvent struct {
	name string
	data struct {
		State     string `json:"status"`
		RowsDone  int    `json:"rows_done"`
		RowsTotal int    `json:"rows_total"`
		ResultURL string `json:"result_url"`
	}
	// at is when it arrived; answered, what answered() said then (the
	// model server's count of answered rows), when given.
	at       time.Time
	answered int64
}

// followEvents reads task id's event stream to its end.
func (p *serveProc) followEvents(t *testing.T, id string, answered func() int64) []sseEvent {
	t.Helper()
	resp, err := http.Get(p.url + "/api/tasks/" + id + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("GET events: %d %q", resp.StatusCode, ct)
	}
	var events []sseEvent
	var cur sseEvent
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		line := lines.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data); err != nil {
				t.Fatalf("event data: %v", err)
			}
		case line == "" && cur.name != "":
			cur.at = time.Now()
			if answered != nil {
				cur.answered = answered()
			}
			events = append(events, cur)
			cur = sseEvent{}
		}
	}
	return events
}

// waitFor polls cond every 20ms until it holds or a minute has passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// dropCSV writes a sheet into the drop folder the way a careful writer
// does: a .tmp file renamed into place.
func dropCSV(t *testing.T, data, name, content string) {
	t.Helper()
	dir := filepath.Join(data, "incoming")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, name+".tmp")
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func rowsCSV(n int, label string) string {
	var b strings.Builder
	b.WriteString("sku,name\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "SKU-%03d,%s %d\n", i, label, i)
	}
	return b.String()
}

// TestServeDropFolder drops sheets into a running server's drop folder: a
// file that keeps growing and a .tmp file are left alone; a finished file
// is run with its sidecar prompt, its result lands in results/ with every
// row, and the input moves to processed/; a file that is no sheet for the
// template gets an error file.
func TestServeDropFolder(t *testing.T) {
	t.Parallel()
	model := mockserver.New(mockserver.Config{Latency: time.Millisecond})
	mock := httptest.NewServer(model)
	t.Cleanup(mock.Close)
	data := t.TempDir()
	// Looks 500ms apart here (the other tests use 50ms): a writer goroutine
	// that stalls longer than the gap between two looks is a writer that
	// stopped, as far as any stable-size rule can tell, and a busy 2-core
	// machine under -race stalls one for 100ms now and then.
	srv := startServe(t, data, mock, "--prompt", "Default copy for {{name}}", "--drop-interval", "500ms")
	incoming := filepath.Join(data, "incoming")

	// A .tmp file is never taken, however long it waits.
	writeFile(t, filepath.Join(incoming, "later.csv.tmp"), rowsCSV(2, "later"))
	// The sidecar names the template of grow.csv.
	writeFile(t, filepath.Join(incoming, "grow.prompt.txt"), "Sidecar copy for {{name}}\n")
	// grow.csv is written slowly: a line per 20ms, much faster than the
	// 500ms looks, so it is never the same at two looks until the writer stops.
	grow, err := os.OpenFile(filepath.Join(incoming, "grow.csv"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(grow, "sku,name\n")
	const growRows = 30
	tick := time.NewTicker(20 * time.Millisecond)
	for i := 1; i <= growRows; i++ {
		<-tick.C
		fmt.Fprintf(grow, "SKU-%03d,grow %d\n", i, i)
		if !exists(filepath.Join(incoming, "grow.csv")) {
			t.Fatalf("grow.csv was taken after %d of %d rows, while still being written", i, growRows)
		}
	}
	tick.Stop()
	if err := grow.Close(); err != nil {
		t.Fatal(err)
	}
	dropCSV(t, data, "bad.CSV", "sku,other\n1,2\n")

	result := filepath.Join(data, "results", "grow.result.xlsx")
	waitFor(t, "the result of grow.csv", func() bool { return exists(result) })
	rows := readResult(t, result)
	if len(rows) != growRows+1 {
		t.Fatalf("result has %d rows, want the header and %d rows: a partial file was taken", len(rows), growRows)
	}
	for i, r := range rows[1:] {
		if want := fmt.Sprintf("grow %d", i+1); r[1] != want || r[3] != "succeeded" {
			t.Errorf("result row %d = %q, want name %q succeeded", i+1, r, want)
		}
	}
	stats := model.Stats()
	if _, ok := stats.PerPrompt["Sidecar copy for grow 1"]; !ok {
		t.Errorf("the model never saw the sidecar's template; prompts: %v", keys(stats.PerPrompt))
	}
	if !exists(filepath.Join(data, "processed", "grow.csv")) || exists(filepath.Join(incoming, "grow.csv")) {
		t.Errorf("grow.csv was not moved to processed/")
	}
	errFile := filepath.Join(data, "results", "bad.CSV.error.txt")
	waitFor(t, "the error file of bad.CSV", func() bool { return exists(errFile) })
	if b, _ := os.ReadFile(errFile); !strings.Contains(string(b), "name") {
		t.Errorf("error file = %q, want the unknown placeholder named", b)
	}
	if !exists(filepath.Join(incoming, "later.csv.tmp")) || exists(filepath.Join(data, "results", "later.result.xlsx")) {
		t.Errorf("the .tmp file was taken")
	}
	// Without tokens the caller is the drop folder's owner, by default the
	// owner of `batchgen run`'s tasks and of the AWS stack's drop folder:
	// the page lists the dropped sheet's task.
	resp, err := http.Get(srv.url + "/api/tasks")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	type listed struct {
		Source string `json:"source"`
		Status string `json:"status"`
	}
	var list struct {
		Tasks []listed `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/tasks = %d (%v)", resp.StatusCode, err)
	}
	if !slices.Contains(list.Tasks, listed{Source: "incoming/grow.csv", Status: "SUCCEEDED"}) {
		t.Errorf("GET /api/tasks without a token lists %+v, want the dropped grow.csv SUCCEEDED", list.Tasks)
	}
	srv.stop()
	st, err := sqlitestore.Open(filepath.Join(data, "batchgen.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tasks, err := st.ListTasksByOwner(t.Context(), store.ListTasksByOwnerParams{Owner: pipeline.LocalOwner, Limit: 10})
	if err != nil || !slices.ContainsFunc(tasks, func(x store.Task) bool { return x.Source == "incoming/grow.csv" }) {
		t.Errorf("tasks of %q: %v (%v), want grow.csv's", pipeline.LocalOwner, tasks, err)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestServeDropTwice: a file dropped again while its task runs is the same
// task; dropped again after it finished (its result taken away meanwhile),
// it gets its result again without a model call.
func TestServeDropTwice(t *testing.T) {
	t.Parallel()
	model := mockserver.New(mockserver.Config{Latency: 100 * time.Millisecond})
	mock := httptest.NewServer(model)
	t.Cleanup(mock.Close)
	data := t.TempDir()
	srv := startServe(t, data, mock, "--prompt", "Copy for {{name}}")
	const n = 12
	content := rowsCSV(n, "twice")
	dropCSV(t, data, "twice.csv", content)
	waitFor(t, "the task to run", func() bool {
		ts := srv.tasks()
		return len(ts) == 1 && ts[0].State == "RUNNING"
	})
	dropCSV(t, data, "twice.csv", content)
	result := filepath.Join(data, "results", "twice.result.xlsx")
	waitFor(t, "the task to finish", func() bool {
		ts := srv.tasks()
		return len(ts) > 0 && ts[0].State == "SUCCEEDED" && exists(result)
	})
	waitFor(t, "the second drop to be taken", func() bool { return !exists(filepath.Join(data, "incoming", "twice.csv")) })
	if ts := srv.tasks(); len(ts) != 1 || ts[0].State != "SUCCEEDED" || ts[0].RowsSucceeded != n {
		t.Fatalf("tasks after two drops = %+v, want one SUCCEEDED task of %d rows", ts, n)
	}
	calls := model.Stats().Succeeded
	if calls != n {
		t.Errorf("%d model calls for %d rows", calls, n)
	}

	// Dropped again after it finished, with its result taken away.
	if err := os.Rename(result, filepath.Join(t.TempDir(), "taken.xlsx")); err != nil {
		t.Fatal(err)
	}
	dropCSV(t, data, "twice.csv", content)
	waitFor(t, "the result again", func() bool { return exists(result) })
	if rows := readResult(t, result); len(rows) != n+1 {
		t.Errorf("result again has %d rows, want %d", len(rows), n+1)
	}
	if got := model.Stats().Succeeded; got != calls {
		t.Errorf("the re-drop made %d model calls, want none", got-calls)
	}
	if ts := srv.tasks(); len(ts) != 1 {
		t.Errorf("tasks after the re-drop = %+v, want still one", ts)
	}
	srv.stop()
}

// TestServeRestartResumes stops the server (SIGTERM) while a dropped file's
// rows are being generated and starts it again: the calls in flight at the
// stop finish and are saved, the task finishes after the restart, every row
// has its result, and no row is paid for twice.
func TestServeRestartResumes(t *testing.T) {
	t.Parallel()
	model := mockserver.New(mockserver.Config{Latency: 100 * time.Millisecond})
	mock := httptest.NewServer(model)
	t.Cleanup(mock.Close)
	data := t.TempDir()
	srv := startServe(t, data, mock, "--prompt", "Copy for {{name}}")
	const n = 40
	dropCSV(t, data, "resume.csv", rowsCSV(n, "resume"))
	waitFor(t, "some rows done", func() bool {
		ts := srv.tasks()
		return len(ts) == 1 && ts[0].RowsSucceeded >= 6
	})
	srv.stop()
	if exists(filepath.Join(data, "results", "resume.result.xlsx")) {
		t.Fatal("the job finished before the stop; make it slower")
	}

	srv = startServe(t, data, mock, "--prompt", "Copy for {{name}}")
	result := filepath.Join(data, "results", "resume.result.xlsx")
	waitFor(t, "the result after the restart", func() bool { return exists(result) })
	rows := readResult(t, result)
	if len(rows) != n+1 {
		t.Fatalf("result has %d rows, want %d", len(rows), n+1)
	}
	for i, r := range rows[1:] {
		if r[3] != "succeeded" {
			t.Errorf("row %d = %q, want succeeded", i+1, r)
		}
	}
	// The calls in flight at the stop finished and were saved: no row was
	// paid for twice.
	if calls := model.Stats().Succeeded; calls != n {
		t.Errorf("%d successful model calls for %d rows across the restart, want %d", calls, n, n)
	}
	srv.stop()
}

// TestServeRefusesOpenAddressWithoutTokens: without API tokens the server
// listens on the loopback interface only, and says why it refuses more.
func TestServeRefusesOpenAddressWithoutTokens(t *testing.T) {
	t.Parallel()
	r := runBinary(t, context.Background(), "serve", "--addr", "0.0.0.0:0", "--data", t.TempDir())
	if r.code != 2 || !strings.Contains(r.stderr, "no API tokens are set") {
		t.Errorf("serve --addr 0.0.0.0:0: exit %d, stderr %q; want 2 and the reason", r.code, r.stderr)
	}
}

// TestServeRefusesBadLimits: a limit flag out of range stops the server
// before it starts, naming the flag.
func TestServeRefusesBadLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "negative inline bound", args: []string{"--max-inline-bytes", "-1"}, want: "--max-inline-bytes -1: must not be negative"},
		{name: "no file size", args: []string{"--max-file-bytes", "0"}, want: "--max-file-bytes must be at least 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runBinary(t, context.Background(), append([]string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir()}, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("serve %v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
			}
		})
	}
}

// TestServeEvents follows a dropped file's task over the server's event
// stream: progress events arrive while rows are still being generated (not
// all at the end), and the last event links the result, whose rows are all
// answered.
func TestServeEvents(t *testing.T) {
	t.Parallel()
	model := mockserver.New(mockserver.Config{Latency: 150 * time.Millisecond})
	mock := httptest.NewServer(model)
	t.Cleanup(mock.Close)
	data := t.TempDir()
	srv := startServe(t, data, mock, "--prompt", "Copy for {{name}}")
	const n = 24
	dropCSV(t, data, "events.csv", rowsCSV(n, "events"))
	id := srv.onlyTask()
	events := srv.followEvents(t, id, func() int64 { return model.Stats().Succeeded })
	if len(events) < 3 {
		t.Fatalf("%d events, want a snapshot, progress while running and done: %+v", len(events), events)
	}
	if events[0].name != "snapshot" {
		t.Errorf("first event %q, want snapshot", events[0].name)
	}
	midway := 0
	for _, ev := range events {
		if ev.name == "progress" && ev.data.State == "RUNNING" && ev.data.RowsDone > 0 && ev.data.RowsDone < n && ev.answered < n {
			midway++
		}
	}
	if midway == 0 {
		t.Errorf("no progress event arrived while rows were still being generated: %+v", events)
	}
	last := events[len(events)-1]
	if last.name != "done" || last.data.State != "SUCCEEDED" || last.data.RowsDone != n || last.data.ResultURL != "/api/tasks/"+id+"/result" {
		t.Errorf("last event = %+v, want done, SUCCEEDED, %d rows and the result link", last, n)
	}
	rows := readResult(t, filepath.Join(data, "results", "events.result.xlsx"))
	if len(rows) != n+1 {
		t.Fatalf("result has %d rows, want %d", len(rows), n+1)
	}
	for i, r := range rows[1:] {
		if r[3] != "succeeded" {
			t.Errorf("row %d = %q, want succeeded", i+1, r)
		}
	}
	srv.stop()
}

// TestServeEventsEveryTwoSeconds: a 400-row, ten-second job in serve moves
// its event stream at least every 2 s while rows complete, not once per
// finished batch (four batches of 100 gave a snapshot, two progress events
// and done): progress counts rows as their groups are saved.
func TestServeEventsEveryTwoSeconds(t *testing.T) {
	t.Parallel()
	// 8 rows in flight at 200 ms each: 40 rows a second, 10 s for 400.
	model := mockserver.New(mockserver.Config{Latency: 200 * time.Millisecond})
	mock := httptest.NewServer(model)
	t.Cleanup(mock.Close)
	data := t.TempDir()
	// Batches of the default 100 rows, not the helper's 5.
	srv := startServeWith(t, data, nil, "--provider", "openai", "--base-url", mock.URL+"/v1", "--concurrency", "8",
		"--batch-size", strconv.Itoa(pipeline.DefaultBatchSize), "--prompt", "Copy for {{name}}")
	const n = 400
	dropCSV(t, data, "steady.csv", rowsCSV(n, "steady"))
	events := srv.followEvents(t, srv.onlyTask(), nil)
	if len(events) == 0 || events[len(events)-1].name != "done" || events[len(events)-1].data.RowsDone != n {
		t.Fatalf("the stream did not end with all %d rows done: %+v", n, events)
	}
	// From the first event showing rows done to the last one before all
	// were: every gap at most 2 s, and many steps, not one per batch.
	var moving []sseEvent
	for _, ev := range events {
		if ev.data.RowsDone > 0 && ev.data.RowsDone < n {
			moving = append(moving, ev)
		}
	}
	if len(moving) < 8 {
		t.Fatalf("%d events while rows completed, want at least 8 (one a second or so over ~10 s): %+v", len(moving), events)
	}
	for i := 1; i < len(moving); i++ {
		if gap := moving[i].at.Sub(moving[i-1].at); gap > 2*time.Second {
			t.Errorf("no event for %v while rows completed (%d then %d rows done)", gap.Round(time.Millisecond), moving[i-1].data.RowsDone, moving[i].data.RowsDone)
		}
		if moving[i].data.RowsDone < moving[i-1].data.RowsDone {
			t.Errorf("rows done went back from %d to %d", moving[i-1].data.RowsDone, moving[i].data.RowsDone)
		}
	}
	srv.stop()
}

// TestServeTokens: with API tokens each token is its own principal; the
// drop folder's tasks belong to --drop-owner and are invisible to every
// other principal, event stream included; a request without a token is
// refused.
func TestServeTokens(t *testing.T) {
	t.Parallel()
	mock := httptest.NewServer(mockserver.New(mockserver.Config{Latency: time.Millisecond}))
	t.Cleanup(mock.Close)
	data := t.TempDir()
	tokenFile := writeFile(t, filepath.Join(t.TempDir(), "tokens"), "# who may call\nalice:alice-secret-0123456789\n")
	srv := startServeEnv(t, data, mock, []string{"BATCHGEN_API_TOKENS=ops:ops-secret-0123456789"},
		"--prompt", "Copy for {{name}}", "--token-file", tokenFile, "--drop-owner", "ops")
	dropCSV(t, data, "owned.csv", rowsCSV(3, "owned"))
	waitFor(t, "the result", func() bool { return exists(filepath.Join(data, "results", "owned.result.xlsx")) })

	get := func(path, token string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, srv.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	// With tokens, /metrics wants one too (what the deployment calls and how busy it is are the operator's).
	if code, _ := get("/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("GET /metrics without a token: %d, want 401", code)
	}
	if code, body := get("/metrics", "ops-secret-0123456789"); code != http.StatusOK || !strings.Contains(string(body), "batchgen_") {
		t.Errorf("GET /metrics with a token: %d %.80s", code, body)
	}
	var list struct {
		Tasks []apiTask `json:"tasks"`
	}
	code, body := get("/api/tasks", "ops-secret-0123456789")
	if err := json.Unmarshal(body, &list); err != nil || code != http.StatusOK || len(list.Tasks) != 1 {
		t.Fatalf("the drop owner's list: %d %s, want the one task", code, body)
	}
	id := list.Tasks[0].TaskID
	if code, body := get("/api/tasks", "alice-secret-0123456789"); code != http.StatusOK || strings.Contains(string(body), id) {
		t.Errorf("another principal's list: %d %s, want 200 without the task", code, body)
	}
	if code, _ := get("/api/tasks/"+id+"/events", "alice-secret-0123456789"); code != http.StatusNotFound {
		t.Errorf("another principal's event stream: %d, want 404", code)
	}
	if code, body := get("/api/tasks/"+id+"/events", "ops-secret-0123456789"); code != http.StatusOK || !strings.Contains(string(body), "event: done") {
		t.Errorf("the owner's event stream: %d %s, want the done event", code, body)
	}
	if code, _ := get("/api/tasks", ""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	srv.stop()
}
