//go:build chaos

package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestChaosKillLoop SIGKILLs `batchgen run` at 20 random points (during the
// split, mid-batch, during the export), restarting it each time, then lets
// it finish: every row ends with exactly one result, in order, and no row
// that already had a result was paid for again beyond the calls in flight
// at each kill. Run by `make test-chaos` (part of `make test`).
func TestChaosKillLoop(t *testing.T) {
	mock := mockserver.New(mockserver.Config{Latency: 20 * time.Millisecond, FailRate: 0.05, Seed: 7})
	srv := httptest.NewServer(mock)
	defer srv.Close()
	dir := t.TempDir()
	const rows, concurrency, kills = 2000, 4, 20
	in := productsCSV(t, dir, rows, nil)
	args := []string{"run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--provider", "openai", "--base-url", srv.URL + "/v1",
		"--concurrency", fmt.Sprint(concurrency), "--batch-size", "50", "--quiet", "--retry-delays", "100ms"}
	rng := rand.New(rand.NewPCG(42, uint64(time.Now().UnixNano())))
	phaseOf := phaseReader(t, filepath.Join(dir, ".batchgen", "batchgen.db"))
	phases := map[string]int{}
	for k := 1; k <= kills; k++ {
		cmd := exec.Command(binary, args...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// Kills 1-3 aim at the split, the last three at the export, the
		// rest land at random points mid-run.
		var at func() bool
		switch {
		case k <= 3:
			at = func() bool { return phaseOf() == "PENDING" }
		case k > kills-3:
			at = func() bool { return phaseOf() == "EXPORTING" }
		default:
			deadline := time.Now().Add(time.Duration(50+rng.IntN(400)) * time.Millisecond)
			at = func() bool { return time.Now().After(deadline) }
		}
		// Poll the kill point until it is reached or the run ends.
		poll := time.NewTicker(200 * time.Microsecond)
		for killed := false; !killed; {
			select {
			case err := <-done:
				t.Logf("kill %d: run ended before its kill point (%v)", k, err)
				killed = true
			case <-poll.C:
				if at() {
					phases[phaseOf()]++
					_ = cmd.Process.Kill()
					<-done
					killed = true
				}
			}
		}
		poll.Stop()
	}
	t.Logf("kill points by task state: %v", phases)
	twice := finishAndCheckResumed(t, mock, dir, rows, args)
	// make bench reads this line (figure 7; its target is at most 1.01).
	st := mock.Stats()
	t.Logf("successful model calls per row: %.4f (%d successful calls, %d rows, %d kills)", float64(st.Succeeded)/rows, st.Succeeded, rows, kills)
	if twice > kills*concurrency {
		t.Errorf("%d rows paid twice; at most %d calls can be in flight over %d kills", twice, kills*concurrency, kills)
	}
}

// phaseReader returns a reader of the task's state, to aim the kills and
// to show where they landed: no task yet (during validation/split), PENDING
// (split), RUNNING, EXPORTING, or a final state. It reads through one
// read-only connection kept open across the runs: the kill loop polls it
// every 200 µs, and opening the database for each poll cost more CPU than
// the run it was timing.
func phaseReader(t *testing.T, dbPath string) func() string {
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return func() string {
		var state string
		if err := db.QueryRow(`SELECT state FROM tasks LIMIT 1`).Scan(&state); err != nil {
			return "no task"
		}
		return state
	}
}

// TestDiskFullOutput writes the result onto a 64 KiB tmpfs: the run fails
// with a clear "no space left" error (exit 1) and leaves the task intact, so
// running again with room writes the result without calling the model.
// Needs root for the mount, which CI has; it fails, never skips, without.
func TestDiskFullOutput(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	if err := os.Mkdir(full, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", full).CombinedOutput(); err != nil {
		t.Fatalf("mount a tiny tmpfs (needs root): %v: %s", err, out)
	}
	defer exec.Command("umount", full).Run()
	in := productsCSV(t, dir, 1500, nil)
	args := []string{"run", "--in", in, "--prompt", "{{sku}} {{商品名称}} ------------------------------------------------", "--sim-latency", "0s", "--concurrency", "16", "--quiet"}
	r := runBinary(t, context.Background(), append(args, "--out", filepath.Join(full, "result.xlsx"))...)
	if r.code != 1 || !strings.Contains(r.stderr, "no space left on device") || !strings.Contains(r.stderr, "run the same command again") {
		t.Fatalf("disk full: exit %d, want 1 with a clear message; stderr:\n%s", r.code, r.stderr)
	}
	if entries, _ := os.ReadDir(full); len(entries) != 0 {
		t.Errorf("a partial file was left on the full disk: %v", entries)
	}
	r = runBinary(t, context.Background(), append(args, "--out", filepath.Join(dir, "result.xlsx"))...)
	if r.code != 0 || !strings.Contains(r.stdout, "requests  0 this run") {
		t.Fatalf("rerun with room: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if rows := readResult(t, filepath.Join(dir, "result.xlsx")); len(rows) != 1501 {
		t.Errorf("result has %d rows, want 1500", len(rows)-1)
	}
}
