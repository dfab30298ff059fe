package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/embedded"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

var taskIDPattern = regexp.MustCompile(`task\s+([0-9a-f]{20})`)

func taskIDFrom(t *testing.T, text string) string {
	t.Helper()
	m := taskIDPattern.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no task id in:\n%s", text)
	}
	return m[1]
}

// TestRetryRerunsOnlyFailedRows: a job ends PARTIAL on content-filtered
// rows; `tasks` shows it with the hint; `retry --error-class` against a
// provider that no longer filters reruns exactly those rows.
func TestRetryRerunsOnlyFailedRows(t *testing.T) {
	t.Parallel()
	first := httptest.NewServer(mockserver.New(mockserver.Config{}))
	defer first.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 40, func(i int) string {
		if i%8 == 0 {
			return " [[filter]]"
		}
		return ""
	})
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--provider", "openai", "--base-url", first.URL+"/v1")
	if r.code != 3 {
		t.Fatalf("first run: exit %d, want 3; stderr:\n%s", r.code, r.stderr)
	}
	id := taskIDFrom(t, r.stdout)
	data := filepath.Join(dir, ".batchgen")

	tasks := runBinary(t, context.Background(), "tasks", "--data", data)
	if tasks.code != 0 || !strings.Contains(tasks.stdout, id) || !strings.Contains(tasks.stdout, "PARTIAL") || !strings.Contains(tasks.stdout, "batchgen retry "+id) {
		t.Errorf("tasks: exit %d, stdout:\n%s\nstderr:\n%s", tasks.code, tasks.stdout, tasks.stderr)
	}

	healed := mockserver.New(mockserver.Config{FilterMarker: "[[never]]"})
	second := httptest.NewServer(healed)
	defer second.Close()
	out := filepath.Join(dir, "retried.xlsx")
	// As the README writes it: the task first, the flags after it.
	r = runBinary(t, context.Background(), "retry", id, "--data", data, "--out", out, "--error-class", "content_filter",
		"--provider", "openai", "--base-url", second.URL+"/v1")
	if r.code != 0 {
		t.Fatalf("retry: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	st := healed.Stats()
	if st.Succeeded != 5 || len(st.PerPrompt) != 5 {
		t.Errorf("retry called the model %d times for %d prompts, want only the 5 failed rows", st.Succeeded, len(st.PerPrompt))
	}
	for p := range st.PerPrompt {
		if !strings.Contains(p, "[[filter]]") {
			t.Errorf("retry re-billed a succeeded row: %q", p)
		}
	}
	rows := readResult(t, out)
	for _, row := range rows[1:] {
		if row[3] != "succeeded" {
			t.Errorf("row %q not succeeded after retry", row)
		}
	}
	if len(rows) != 41 {
		t.Errorf("%d result rows, want 40", len(rows)-1)
	}
}

// TestCancelRunningJob: `batchgen cancel` while a run is active: the run
// stops starting rows, finishes those in flight and writes a partial result
// that marks the rest not_started.
func TestCancelRunningJob(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{Latency: 40 * time.Millisecond})
	watch := newCallWatch(mock)
	srv := httptest.NewServer(watch)
	defer srv.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 300, nil)
	cmd := exec.Command(binary, "run", "--in", in, "--prompt", "{{sku}}", "--provider", "openai", "--base-url", srv.URL+"/v1", "--concurrency", "2", "--batch-size", "20")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-watch.reached(20):
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("no progress; stderr:\n%s", stderr.String())
	}
	data := filepath.Join(dir, ".batchgen")
	tasks := runBinary(t, context.Background(), "tasks", "--data", data)
	id := regexp.MustCompile(`(?m)^([0-9a-f]{20})\s+RUNNING`).FindStringSubmatch(tasks.stdout)
	if id == nil {
		cmd.Process.Kill()
		t.Fatalf("running task not listed:\n%s\n%s", tasks.stdout, tasks.stderr)
	}
	c := runBinary(t, context.Background(), "cancel", id[1], "--data", data)
	if c.code != 0 || !strings.Contains(c.stdout, "cancelled") {
		t.Errorf("cancel: exit %d\n%s\n%s", c.code, c.stdout, c.stderr)
	}
	err := cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 3 {
		t.Fatalf("cancelled run: %v, want exit 3; stderr:\n%s", err, stderr.String())
	}
	calls := mock.Stats().Succeeded
	rows := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	got := map[string]int{}
	for _, row := range rows[1:] {
		got[row[3]]++
	}
	if got["succeeded"] != int(calls) || got["not_started"] != 300-int(calls) || len(rows) != 301 {
		t.Errorf("statuses %v after %d calls; want each called row succeeded and the rest not_started", got, calls)
	}
	if calls > 150 {
		t.Errorf("%d rows ran; cancel should have stopped the job early", calls)
	}
	if !strings.Contains(stdout.String(), "CANCELLED") {
		t.Errorf("summary does not say CANCELLED:\n%s", stdout.String())
	}
}

// TestDLQListAndRedrive: poison messages dead-lettered in a task's queue
// (batchgen run's) and in the server's queue (batchgen serve's) show in
// `dlq list`, are counted against their task in `tasks`, and `dlq redrive`
// moves them all back.
func TestDLQListAndRedrive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 3, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}}", "--sim-latency", "1ms")
	if r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	id := taskIDFrom(t, r.stdout)
	data := filepath.Join(dir, ".batchgen")

	st, err := sqlitestore.Open(filepath.Join(data, "batchgen.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// deadLetter dead-letters body in the queue called name: received past
	// a max receive count of 1, on the queue's own clock, moved past the
	// visibility timeout by hand.
	deadLetter := func(name string, body []byte) {
		t.Helper()
		clk := clock.NewFake(time.Now())
		q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: name, Visibility: time.Minute, MaxReceive: 1, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		// A finished task's queue may still hold a duplicate of a batch's
		// message: the run's sweeper re-sends the message of a batch that
		// sat unclaimed too long (on a loaded machine), and the run ends
		// before it is received. It would be dead-lettered with the body
		// below; acknowledge it, as the next run would (its batch is done).
		left, err := q.Receive(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range left {
			if err := q.Delete(ctx, d.Receipt); err != nil {
				t.Fatal(err)
			}
		}
		if err := q.Send(ctx, []queue.Outgoing{{Body: body}}); err != nil {
			t.Fatal(err)
		}
		if ds, err := q.Receive(ctx, 1); err != nil || len(ds) != 1 {
			t.Fatalf("receive: %v %v", ds, err)
		}
		clk.Advance(2 * time.Minute)
		if ds, err := q.Receive(ctx, 1); err != nil || len(ds) != 0 {
			t.Fatalf("receive past the max receive count: %v %v, want the message dead-lettered", ds, err)
		}
	}
	deadLetter(embedded.TaskQueue(id), pipeline.EncodeBatchMessage(id, 1))
	deadLetter(embedded.TaskQueue(id), []byte("not json"))
	deadLetter(embedded.ServeQueue, pipeline.EncodeBatchMessage(id, 2))
	st.Close()

	list := runBinary(t, ctx, "dlq", "list", "--data", data)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^` + id + ` +1 +1 `),
		regexp.MustCompile(`(?m)^` + id + ` +2 +1 `),
		regexp.MustCompile(`(?m)^\? +\? +1 .*"not json"`),
	} {
		if list.code != 0 || !want.MatchString(list.stdout) {
			t.Errorf("dlq list: exit %d, want a line matching %s\n%s\n%s", list.code, want, list.stdout, list.stderr)
		}
	}
	tasks := runBinary(t, ctx, "tasks", "--data", data)
	if !strings.Contains(tasks.stdout, "stuck: 2 dead-lettered") {
		t.Errorf("tasks does not count the task's two dead letters:\n%s", tasks.stdout)
	}
	redrive := runBinary(t, ctx, "dlq", "redrive", "--data", data)
	if redrive.code != 0 || !strings.Contains(redrive.stdout, "3 message(s) moved back to their queues") {
		t.Errorf("dlq redrive: exit %d\n%s\n%s", redrive.code, redrive.stdout, redrive.stderr)
	}
	if again := runBinary(t, ctx, "dlq", "list", "--data", data); !strings.Contains(again.stdout, "no dead-lettered messages") {
		t.Errorf("after redrive, dlq list:\n%s", again.stdout)
	}
}
