package main

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// opsCase is one operator command against a task in one state.
type opsCase struct {
	command string
	code    int
	stdout  []string
	stderr  []string
}

// TestOpsCommandsInEveryTaskState runs every operator command (tasks,
// cancel, retry, dlq list, dlq redrive) against a task that is running,
// stopped mid-run by SIGKILL, finished, cancelled, failed (rejected
// input), and an unknown id: each gives a clear message and the right exit
// code, and none panics. Each command of a stopped state works on its own
// copy of the state's data directory.
func TestOpsCommandsInEveryTaskState(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{Latency: 20 * time.Millisecond})
	watch := newCallWatch(mock)
	srv := httptest.NewServer(watch)
	t.Cleanup(srv.Close) // after the parallel subtests, unlike a defer
	base := srv.URL + "/v1"
	const rows = 200
	runArgs := func(in string) []string {
		return []string{"run", in, "--prompt", "{{sku}} {{商品名称}}", "--provider", "openai", "--base-url", base,
			"--concurrency", "1", "--batch-size", "10", "--quiet"}
	}
	notPanicked := func(t *testing.T, r result) {
		t.Helper()
		if strings.Contains(r.stderr, "panic") || strings.Contains(r.stderr, "goroutine ") {
			t.Errorf("stderr shows a panic:\n%s", r.stderr)
		}
	}

	// start runs a job in the background against a model server of its
	// own, so that waiting for its progress counts only its calls (the
	// subtests run in parallel: a shared counter let one job's calls
	// release another's wait before that job had even written its task).
	// The caller waits for the process.
	start := func(t *testing.T, dir string) (*exec.Cmd, *bytes.Buffer, *callWatch) {
		t.Helper()
		own := newCallWatch(mockserver.New(mockserver.Config{Latency: 20 * time.Millisecond}))
		ownSrv := httptest.NewServer(own)
		t.Cleanup(ownSrv.Close) // registered first, so it runs after the kill below
		in := productsCSV(t, dir, rows, nil)
		args := append(runArgs(in), "--base-url", ownSrv.URL+"/v1") // the last --base-url wins
		cmd := exec.Command(binary, args...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, &stderr, own
	}
	// progressed waits until the job behind w has made n model calls.
	progressed := func(t *testing.T, w *callWatch, n int64, stderr *bytes.Buffer) {
		t.Helper()
		select {
		case <-w.reached(n):
		case <-time.After(60 * time.Second):
			t.Fatalf("no progress; stderr:\n%s", stderr.String())
		}
	}
	taskOf := func(t *testing.T, data string) string {
		t.Helper()
		r := runBinary(t, context.Background(), "tasks", "--data", data)
		m := regexp.MustCompile(`(?m)^([0-9a-f]{20})\s`).FindStringSubmatch(r.stdout)
		if m == nil {
			t.Fatalf("no task in %s:\n%s\n%s", data, r.stdout, r.stderr)
		}
		return m[1]
	}
	stateOf := func(t *testing.T, data, id string) store.Task {
		t.Helper()
		st, err := sqlitestore.Open(filepath.Join(data, "batchgen.db"), sqlitestore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		task, err := st.GetTask(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return task
	}
	wantState := func(want store.TaskState) func(t *testing.T, data, id string) {
		return func(t *testing.T, data, id string) {
			t.Helper()
			if got := stateOf(t, data, id).State; got != want {
				t.Errorf("task is %s afterwards, want %s", got, want)
			}
		}
	}

	// Each stopped state is prepared once, in its own directory.
	type prepared struct {
		data, id string
	}
	prepare := map[string]func(t *testing.T) prepared{
		"killed": func(t *testing.T) prepared {
			dir := t.TempDir()
			cmd, stderr, own := start(t, dir)
			progressed(t, own, 15, stderr)
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			data := filepath.Join(dir, ".batchgen")
			return prepared{data, taskOf(t, data)}
		},
		"finished": func(t *testing.T) prepared {
			dir := t.TempDir()
			in := productsCSV(t, dir, 5, nil)
			if r := runBinary(t, context.Background(), runArgs(in)...); r.code != 0 {
				t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
			}
			data := filepath.Join(dir, ".batchgen")
			return prepared{data, taskOf(t, data)}
		},
		"cancelled": func(t *testing.T) prepared {
			dir := t.TempDir()
			cmd, stderr, own := start(t, dir)
			progressed(t, own, 15, stderr)
			data := filepath.Join(dir, ".batchgen")
			id := taskOf(t, data)
			if r := runBinary(t, context.Background(), "cancel", id, "--data", data); r.code != 0 {
				t.Fatalf("cancel: exit %d\n%s", r.code, r.stderr)
			}
			if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != 3 {
				t.Fatalf("cancelled run: %v, want exit 3; stderr:\n%s", err, stderr.String())
			}
			return prepared{data, id}
		},
		"failed": func(t *testing.T) prepared {
			// What the splitter records for a rejected input: a FAILED task
			// with the reason and no rows.
			dir := t.TempDir()
			data := filepath.Join(dir, ".batchgen")
			if err := os.MkdirAll(data, 0o755); err != nil {
				t.Fatal(err)
			}
			st, err := sqlitestore.Open(filepath.Join(data, "batchgen.db"), sqlitestore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			now := time.Now()
			id := "0123456789abcdef0123"
			err = st.CreateTask(context.Background(), store.Task{
				ID: id, State: store.TaskFailed, Source: "bad.xlsx", Error: `bad.xlsx: sheet "Sheet1": the header row has no data rows`,
				Spec:      store.TaskSpec{Prompt: "{{sku}}", Provider: "openai", Model: "gpt-4o-mini", BatchSize: 10},
				CreatedAt: now, UpdatedAt: now, FinishedAt: now,
			})
			if err != nil {
				t.Fatal(err)
			}
			return prepared{data, id}
		},
	}
	retry := func(id, data string) []string {
		return []string{"retry", id, "--data", data, "--provider", "openai", "--base-url", base}
	}

	matrix := map[string][]opsCase{
		"killed": {
			{command: "tasks", code: 0, stdout: []string{"RUNNING"}},
			{command: "dlq list", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "dlq redrive", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "cancel", code: 0, stdout: []string{"cancelled; partial result: "}},
			{command: "retry", code: 0, stdout: []string{"SUCCEEDED", "rows      200  (succeeded 200, failed 0"}, stderr: []string{"stopped midway; continuing it"}},
		},
		"finished": {
			{command: "tasks", code: 0, stdout: []string{"SUCCEEDED"}},
			{command: "dlq list", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "dlq redrive", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "cancel", code: 2, stderr: []string{"is SUCCEEDED; only a pending, held or running task can be cancelled"}},
			{command: "retry", code: 0, stdout: []string{"SUCCEEDED", "requests  0 this run"}, stderr: []string{"has no failed rows to retry"}},
		},
		"cancelled": {
			{command: "tasks", code: 0, stdout: []string{"CANCELLED"}},
			{command: "dlq list", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "dlq redrive", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "cancel", code: 2, stderr: []string{"is CANCELLED; only a pending, held or running task can be cancelled"}},
			{command: "retry", code: 0, stdout: []string{"SUCCEEDED", "rows      200  (succeeded 200, failed 0"}},
		},
		"failed": {
			{command: "tasks", code: 0, stdout: []string{"FAILED"}},
			{command: "dlq list", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "dlq redrive", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "cancel", code: 2, stderr: []string{"is FAILED; only a pending, held or running task can be cancelled"}},
			{command: "retry", code: 2, stderr: []string{"is FAILED; only a succeeded, partial or cancelled task can be retried"}},
		},
		"unknown": {
			{command: "cancel", code: 2, stderr: []string{"no task ffffffffffffffffffff in "}},
			{command: "retry", code: 2, stderr: []string{"no task ffffffffffffffffffff in "}},
		},
	}
	argsFor := func(command, id, data string) []string {
		switch command {
		case "retry":
			return retry(id, data)
		case "cancel":
			return []string{"cancel", id, "--data", data}
		case "tasks":
			return []string{"tasks", "--data", data}
		default:
			return append(strings.Fields(command), "--data", data)
		}
	}
	finalState := map[string]map[string]store.TaskState{
		"killed":    {"cancel": store.TaskCancelled, "retry": store.TaskSucceeded, "tasks": store.TaskRunning},
		"finished":  {"cancel": store.TaskSucceeded, "retry": store.TaskSucceeded},
		"cancelled": {"cancel": store.TaskCancelled, "retry": store.TaskSucceeded},
		"failed":    {"cancel": store.TaskFailed, "retry": store.TaskFailed},
	}

	// The running state: one live run, the commands in an order that keeps
	// it running until the cancel at the end.
	t.Run("running", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		cmd, stderr, own := start(t, dir)
		progressed(t, own, 10, stderr)
		data := filepath.Join(dir, ".batchgen")
		id := taskOf(t, data)
		for _, c := range []opsCase{
			{command: "tasks", code: 0, stdout: []string{id, "RUNNING"}},
			{command: "dlq list", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "dlq redrive", code: 0, stdout: []string{"no dead-lettered messages"}},
			{command: "retry", code: 1, stderr: []string{"is in use by another batchgen process"}},
			{command: "cancel", code: 0, stdout: []string{"cancelled; the running batchgen finishes the rows in flight"}},
		} {
			r := runBinary(t, context.Background(), argsFor(c.command, id, data)...)
			checkOps(t, c, r)
			notPanicked(t, r)
		}
		if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != 3 {
			t.Fatalf("cancelled run: %v, want exit 3; stderr:\n%s", err, stderr.String())
		}
		if got := stateOf(t, data, id); got.State != store.TaskCancelled || got.ResultKey == "" {
			t.Errorf("after cancel the task is %s with result %q, want CANCELLED with a partial result", got.State, got.ResultKey)
		}
	})

	for state, cases := range matrix {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			var p prepared
			if state == "unknown" {
				p = prepare["finished"](t)
				p.id = "ffffffffffffffffffff"
			} else {
				p = prepare[state](t)
			}
			for _, c := range cases {
				t.Run(c.command, func(t *testing.T) {
					data := copyDataDir(t, p.data)
					r := runBinary(t, context.Background(), argsFor(c.command, p.id, data)...)
					checkOps(t, c, r)
					notPanicked(t, r)
					if state == "unknown" {
						return
					}
					if want, ok := finalState[state][c.command]; ok {
						wantState(want)(t, data, p.id)
					}
					if state == "killed" && c.command == "cancel" {
						result := readResult(t, filepath.Join(data, "blobs", "results", p.id+".xlsx"))
						statuses := map[string]int{}
						for _, row := range result[1:] {
							statuses[row[3]]++
						}
						if len(result) != rows+1 || statuses["not_started"] == 0 || statuses["succeeded"] == 0 {
							t.Errorf("partial result statuses %v; want succeeded rows and not_started ones", statuses)
						}
					}
				})
			}
		})
	}

	// No data directory at all.
	t.Run("no data", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(t.TempDir(), "nothing")
		for _, command := range []string{"tasks", "cancel", "retry", "dlq list", "dlq redrive"} {
			r := runBinary(t, context.Background(), argsFor(command, "ffffffffffffffffffff", missing)...)
			checkOps(t, opsCase{command: command, code: 2, stderr: []string{"no batchgen data in " + missing}}, r)
			notPanicked(t, r)
			if _, err := os.Stat(missing); err == nil {
				t.Errorf("%s created %s", command, missing)
			}
		}
	})
}

func checkOps(t *testing.T, c opsCase, r result) {
	t.Helper()
	if r.code != c.code {
		t.Errorf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", c.command, r.code, c.code, r.stdout, r.stderr)
		return
	}
	for _, want := range c.stdout {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("%s: stdout lacks %q:\n%s\nstderr:\n%s", c.command, want, r.stdout, r.stderr)
		}
	}
	for _, want := range c.stderr {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("%s: stderr lacks %q:\n%s", c.command, want, r.stderr)
		}
	}
}

// copyDataDir copies a data directory no process is using (the database
// with its WAL, the blobs), so each command starts from the same state.
func copyDataDir(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), ".batchgen")
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}
