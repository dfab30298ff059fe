package sqlitestore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
	"github.com/batchgen/batchgen/internal/store/storetest"
)

// open opens a store on a new file in a temp dir and closes it at cleanup.
func open(t testing.TB) (*sqlitestore.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "batchgen.db")
	s, err := sqlitestore.Open(path, sqlitestore.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s, path
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, _ := open(t)
		return s
	})
}

func TestProviderBatchesConformance(t *testing.T) {
	storetest.RunProviderBatches(t, func(t *testing.T) store.ProviderBatches {
		s, _ := open(t)
		return s
	})
}

func TestAllowancesConformance(t *testing.T) {
	storetest.RunAllowances(t, func(t *testing.T) store.Allowances {
		s, _ := open(t)
		return s
	})
}

func TestCacheTTL(t *testing.T) {
	t.Parallel()
	storetest.RunCacheTTL(t, func(t *testing.T, clk clock.Clock, ttl time.Duration) store.Cache {
		s, err := sqlitestore.Open(filepath.Join(t.TempDir(), "state.db"), sqlitestore.Options{Clock: clk, CacheTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestCacheExpiredReplaced: an output cached again after its entry expired
// replaces it (a live entry keeps its first output).
func TestCacheExpiredReplaced(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(base)
	s, err := sqlitestore.Open(filepath.Join(t.TempDir(), "state.db"), sqlitestore.Options{Clock: clk, CacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	for _, step := range []struct {
		advance time.Duration
		put     string
		want    string
	}{
		{0, "first", "first"},
		{30 * time.Minute, "second", "first"},
		{31 * time.Minute, "third", "third"},
	} {
		clk.Advance(step.advance)
		if err := s.PutCached(ctx, "k", step.put); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetCached(ctx, []string{"k"})
		if err != nil {
			t.Fatal(err)
		}
		if got["k"] != step.want {
			t.Errorf("after putting %q: cached %q, want %q", step.put, got["k"], step.want)
		}
	}
}

func TestCacheConformance(t *testing.T) {
	storetest.RunCache(t, func(t *testing.T) store.Cache {
		s, _ := open(t)
		return s
	})
}

var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// seed creates task id with batches batches of size rows each.
func seed(t testing.TB, s store.Store, id string, batches, size int) {
	t.Helper()
	if err := seedStore(s, id, batches, size); err != nil {
		t.Fatal(err)
	}
}

// seedStore creates a RUNNING task with batches of size rows each.
func seedStore(s store.Store, id string, batches, size int) error {
	ctx := context.Background()
	if err := s.CreateTask(ctx, store.Task{ID: id, State: store.TaskRunning, BatchesTotal: batches, RowsTotal: batches * size, CreatedAt: base, UpdatedAt: base}); err != nil {
		return fmt.Errorf("create task: %w", err)
	}
	rows := make([]store.Row, batches*size)
	for i := range rows {
		rows[i] = store.Row{TaskID: id, No: i + 1, SheetRow: i + 2, Values: []string{fmt.Sprintf("product %d", i+1), "toys", "9.99"}}
	}
	if err := s.PutRows(ctx, rows); err != nil {
		return fmt.Errorf("put rows: %w", err)
	}
	bs := make([]store.Batch, batches)
	for i := range bs {
		bs[i] = store.Batch{TaskID: id, No: i + 1, FirstRow: i*size + 1, RowCount: size, CreatedAt: base}
	}
	if err := s.PutBatches(ctx, bs); err != nil {
		return fmt.Errorf("put batches: %w", err)
	}
	return nil
}

func TestOpenRejectsPaths(t *testing.T) {
	tests := []struct {
		name string
		path string
	}{
		{"empty", ""},
		{"memory", ":memory:"},
		{"uri", "file:x.db?mode=memory"},
		{"query", filepath.Join(t.TempDir(), "x.db?_pragma=foo")},
		{"missing directory", filepath.Join(t.TempDir(), "no", "such", "dir", "x.db")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := sqlitestore.Open(tt.path, sqlitestore.Options{})
			if err == nil {
				s.Close()
				t.Fatalf("Open(%q) succeeded, want an error", tt.path)
			}
			if !strings.Contains(err.Error(), tt.path) {
				t.Errorf("error %q does not name the path %q", err, tt.path)
			}
		})
	}
}

func TestReopenKeepsDataAndSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "batchgen.db")
	s, err := sqlitestore.Open(path, sqlitestore.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	seed(t, s, "task-1", 2, 3)
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	// Opening again must not re-run the migrations (they would fail on the
	// existing tables) and must see everything written before.
	for i := range 2 {
		s, err = sqlitestore.Open(path, sqlitestore.Options{})
		if err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		rows, err := s.ListRows(t.Context(), store.ListRowsParams{TaskID: "task-1"})
		if err != nil || len(rows) != 6 {
			t.Fatalf("reopen %d: listed %d rows, err %v; want 6", i, len(rows), err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
	}
}

// TestMigrationSplitsUsageByProvider: a database from before the per-provider
// split (schema 7) gets, on open, each task's split recounted from the rows
// of its DONE batches, so an old routed task is priced exactly too. Batch 2
// is still running: its rows' tokens are not in the task's sums, so not in
// the split either; a task without tokens gets none.
func TestMigrationSplitsUsageByProvider(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "batchgen.db")
	s, err := sqlitestore.Open(path, sqlitestore.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	seed(t, s, "routed", 2, 3)
	seed(t, s, "idle", 1, 1)
	now := base.Add(time.Minute)
	answered := map[int]string{1: "cheap", 2: "dear", 3: "cheap", 4: "dear"}
	var sum store.Usage
	split := map[string]store.Usage{}
	for no := 1; no <= 2; no++ {
		b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: "routed", BatchNo: no, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err != nil {
			t.Fatalf("claim %d: %v", no, err)
		}
		for row := b.FirstRow; row < b.FirstRow+b.RowCount; row++ {
			label, ok := answered[row]
			if !ok {
				continue
			}
			u := store.Usage{InputTokens: int64(row) * 100, OutputTokens: int64(row), CachedInputTokens: int64(row)}
			res := store.RowResult{State: store.RowSucceeded, Output: "x", Attempts: 1, Provider: label, Usage: u}
			if _, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: "routed", BatchNo: no, Attempt: b.Attempt,
				Rows: []store.RowResultWrite{{RowNo: row, Result: res}}, Now: now}); err != nil {
				t.Fatalf("save row %d: %v", row, err)
			}
			if no == 1 {
				sum = sum.Add(u)
				split[label] = split[label].Add(u)
			}
		}
		if no == 1 {
			if _, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: "routed", BatchNo: 1, Attempt: b.Attempt, Succeeded: 3,
				Usage: sum, UsageByProvider: split, Now: now}); err != nil {
				t.Fatalf("finish: %v", err)
			}
		}
	}
	// Back to schema 7: no split column (and none of the later ones).
	for _, q := range []string{
		`ALTER TABLE tasks DROP COLUMN usage_by_provider`,
		`ALTER TABLE rows DROP COLUMN fresh`,
		`ALTER TABLE tasks DROP COLUMN delimiter`,
		`ALTER TABLE tasks DROP COLUMN rerun`,
		`ALTER TABLE batches DROP COLUMN saved_succeeded`,
		`ALTER TABLE batches DROP COLUMN saved_failed`,
		`ALTER TABLE batches DROP COLUMN saved_skipped`,
		`ALTER TABLE tasks DROP COLUMN max_cost`,
		`ALTER TABLE tasks DROP COLUMN mode`,
		`ALTER TABLE tasks DROP COLUMN deadline`,
		`DROP TABLE provider_batches`,
		`ALTER TABLE tasks DROP COLUMN sample`,
		`DROP TABLE allowances`,
		`UPDATE schema_version SET version = 7 WHERE component = 'sqlitestore'`,
	} {
		if _, err := s.DB().Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	s, err = sqlitestore.Open(path, sqlitestore.Options{})
	if err != nil {
		t.Fatalf("open schema 7: %v", err)
	}
	defer s.Close()
	got, err := s.GetTask(ctx, "routed")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]store.Usage{"cheap": {InputTokens: 400, OutputTokens: 4, CachedInputTokens: 4}, "dear": {InputTokens: 200, OutputTokens: 2, CachedInputTokens: 2}}
	if d := cmp.Diff(want, got.UsageByProvider); d != "" {
		t.Errorf("split after the migration (-want +got):\n%s", d)
	}
	// The batches count their saved rows from the rows themselves: the
	// finished one its three, the running one the row saved under it.
	batches, err := s.ListBatches(ctx, store.ListBatchesParams{TaskID: "routed"})
	if err != nil {
		t.Fatal(err)
	}
	var saved []store.RowCounts
	for _, b := range batches {
		saved = append(saved, b.Saved)
	}
	if d := cmp.Diff([]store.RowCounts{{Succeeded: 3}, {Succeeded: 1}}, saved); d != "" {
		t.Errorf("saved counts after the migration (-want +got):\n%s", d)
	}
	if d := cmp.Diff(sum, got.Usage); d != "" {
		t.Errorf("usage after the migration (-want +got):\n%s", d)
	}
	idle, err := s.GetTask(ctx, "idle")
	if err != nil {
		t.Fatal(err)
	}
	if idle.UsageByProvider != nil {
		t.Errorf("split of a task without tokens = %v, want none", idle.UsageByProvider)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	s, path := open(t)
	if _, err := s.DB().Exec(`UPDATE schema_version SET version = 99 WHERE component = 'sqlitestore'`); err != nil {
		t.Fatalf("bump version: %v", err)
	}
	s2, err := sqlitestore.Open(path, sqlitestore.Options{})
	if err == nil {
		s2.Close()
		t.Fatal("Open of a database from a newer binary succeeded, want an error")
	}
	if !strings.Contains(err.Error(), "newer") {
		t.Errorf("error %q does not say the schema is newer", err)
	}
}

func TestUnknownTask(t *testing.T) {
	s, _ := open(t)
	ctx := t.Context()
	err := s.PutRows(ctx, []store.Row{{TaskID: "nope", No: 1, Values: []string{"a"}}})
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("PutRows for an unknown task: error = %v, want ErrNotFound", err)
	}
	err = s.PutBatches(ctx, []store.Batch{{TaskID: "nope", No: 1, FirstRow: 1, RowCount: 1}})
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("PutBatches for an unknown task: error = %v, want ErrNotFound", err)
	}
}

func TestInvalidInput(t *testing.T) {
	s, _ := open(t)
	ctx := t.Context()
	seed(t, s, "task-1", 1, 2)
	b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: "task-1", BatchNo: 1, Owner: "w", Now: base, LeaseUntil: base.Add(time.Minute)})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	tests := []struct {
		name         string
		call         func() error
		wantConflict bool
	}{
		{"task without ID", func() error { return s.CreateTask(ctx, store.Task{}) }, false},
		{"row without task", func() error { return s.PutRows(ctx, []store.Row{{No: 1}}) }, false},
		{"row in unknown state", func() error {
			return s.PutRows(ctx, []store.Row{{TaskID: "task-1", No: 9, RowResult: store.RowResult{State: "DONE"}}})
		}, false},
		{"result in unknown state", func() error {
			_, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: "task-1", BatchNo: 1, Attempt: b.Attempt,
				Rows: []store.RowResultWrite{{RowNo: 1, Result: store.RowResult{State: "DONE"}}}})
			return err
		}, false},
		{"result for a row outside the batch", func() error {
			_, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: "task-1", BatchNo: 1, Attempt: b.Attempt,
				Rows: []store.RowResultWrite{{RowNo: 3, Result: store.RowResult{State: store.RowSucceeded}}}})
			return err
		}, true},
		{"negative counts", func() error {
			_, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: "task-1", BatchNo: 1, Attempt: b.Attempt, Succeeded: -1})
			return err
		}, false},
		{"transition to nothing", func() error {
			_, err := s.TransitionTask(ctx, store.TransitionTaskParams{ID: "task-1", From: []store.TaskState{store.TaskRunning}})
			return err
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil {
				t.Fatal("succeeded, want an error")
			}
			if got := errors.Is(err, store.ErrConflict); got != tt.wantConflict {
				t.Errorf("error %v: is ErrConflict = %v, want %v", err, got, tt.wantConflict)
			}
		})
	}
	got, err := s.GetBatch(ctx, "task-1", 1)
	if err != nil || got.State != store.BatchRunning {
		t.Errorf("batch after refused calls = %+v, %v; want still RUNNING", got, err)
	}
}

// TestPutRowsLarge checks the split of a big sheet: 200,000 rows in one
// call, in a few seconds. Under the race detector, where timing says nothing
// about production, it checks 20,000 rows for correctness only.
func TestPutRowsLarge(t *testing.T) {
	s, _ := open(t)
	ctx := t.Context()
	n, limit := 200_000, 10*time.Second
	if raceEnabled {
		n, limit = 20_000, time.Minute
	}
	if err := s.CreateTask(ctx, store.Task{ID: "big", CreatedAt: base}); err != nil {
		t.Fatalf("create task: %v", err)
	}
	rows := make([]store.Row, n)
	for i := range rows {
		rows[i] = store.Row{TaskID: "big", No: i + 1, SheetRow: i + 2, Values: []string{fmt.Sprintf("product %d", i+1), "toys", "9.99"}}
	}
	start := time.Now()
	if err := s.PutRows(ctx, rows); err != nil {
		t.Fatalf("put rows: %v", err)
	}
	elapsed := time.Since(start)
	t.Logf("PutRows(%d rows) took %v", n, elapsed)
	// Generous enough for a slow CI machine, tight enough to catch a
	// row-per-statement or row-per-transaction regression (minutes).
	if elapsed > limit {
		t.Errorf("PutRows(%d rows) took %v, want under %v", n, elapsed, limit)
	}
	got, err := s.ListRows(ctx, store.ListRowsParams{TaskID: "big", FromNo: n - 1})
	if err != nil {
		t.Fatalf("list rows: %v", err)
	}
	var nos []int
	for _, r := range got {
		nos = append(nos, r.No)
	}
	if d := cmp.Diff([]int{n - 1, n}, nos); d != "" {
		t.Errorf("last rows (-want +got):\n%s", d)
	}
}

// TestTwoStoresOnOneFile stands in for two processes on one data directory:
// two Stores have separate pools, so their writes meet in SQLite's file lock
// and busy_timeout rather than in database/sql.
func TestTwoStoresOnOneFile(t *testing.T) {
	a, path := open(t)
	b, err := sqlitestore.Open(path, sqlitestore.Options{})
	if err != nil {
		t.Fatalf("open second store: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	const batches = 20
	seed(t, a, "task-1", batches, 5)
	ctx := t.Context()

	// Each batch is claimed by 3 goroutines on each store; exactly one must
	// win, and every winner finishes its batch.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins = make(map[int]int)
		errs []error
	)
	start := make(chan struct{})
	for no := 1; no <= batches; no++ {
		for i := range 6 {
			s := []*sqlitestore.Store{a, b}[i%2]
			wg.Go(func() {
				<-start
				c, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: "task-1", BatchNo: no, Owner: fmt.Sprint(i), Now: base, LeaseUntil: base.Add(time.Minute)})
				if errors.Is(err, store.ErrConflict) {
					return
				}
				if err == nil {
					_, err = s.FinishBatch(ctx, store.FinishBatchParams{TaskID: "task-1", BatchNo: no, Attempt: c.Attempt, Succeeded: 5, Now: base})
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				wins[no]++
			})
		}
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("unexpected errors: %v", err)
	}
	for no := 1; no <= batches; no++ {
		if wins[no] != 1 {
			t.Errorf("batch %d claimed %d times, want once", no, wins[no])
		}
	}
	task, err := b.GetTask(ctx, "task-1")
	if err != nil {
		t.Fatalf("get task: %v", err)
	}
	if task.BatchesDone != batches || task.RowsSucceeded != batches*5 {
		t.Errorf("task counters = %d batches, %d rows; want %d, %d", task.BatchesDone, task.RowsSucceeded, batches, batches*5)
	}
}

// helperEnv names the environment variable that turns the test binary into
// the process that TestRecoverAfterKill kills.
const helperEnv = "SQLITESTORE_KILL_HELPER_DB"

// TestMain turns the test binary into the process TestRecoverAfterKill
// kills when helperEnv is set, so that helper is not a test that passes.
func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		os.Exit(killHelper(path))
	}
	os.Exit(m.Run())
}

// killHelper writes to the database at path, reports "ready" and waits to
// be killed with its transactions committed but the WAL not checkpointed.
func killHelper(path string) int {
	s, err := sqlitestore.Open(path, sqlitestore.Options{})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if err := seedStore(s, "task-1", 2, 3); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if _, err := s.ClaimBatch(context.Background(), store.ClaimBatchParams{TaskID: "task-1", BatchNo: 1, Owner: "killed", Now: base, LeaseUntil: base.Add(time.Minute)}); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ready")
	// Wait for SIGKILL. Waiting on a signal channel (which SIGKILL never
	// reaches) keeps the runtime from calling a bare select{} a deadlock.
	wait := make(chan os.Signal, 1)
	signal.Notify(wait, syscall.SIGTERM)
	<-wait
	return 1
}

func TestRecoverAfterKill(t *testing.T) {
	path := filepath.Join(t.TempDir(), "batchgen.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$") // TestMain runs killHelper instead of tests
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("stdout pipe: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper said %q, %v; want ready", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("kill helper: %v", err)
	}
	cmd.Wait() // reports the kill; the exit status is expected
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Fatalf("the killed process left no WAL to recover: %v", err)
	}

	s, err := sqlitestore.Open(path, sqlitestore.Options{})
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	rows, err := s.ListRows(ctx, store.ListRowsParams{TaskID: "task-1"})
	if err != nil || len(rows) != 6 {
		t.Fatalf("rows after kill: %d, %v; want 6", len(rows), err)
	}
	// The killed worker's claim survived and expires like any other.
	_, err = s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: "task-1", BatchNo: 1, Owner: "next", Now: base.Add(30 * time.Second), LeaseUntil: base.Add(time.Hour)})
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("claim within the dead worker's lease: error = %v, want ErrConflict", err)
	}
	b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: "task-1", BatchNo: 1, Owner: "next", Now: base.Add(2 * time.Minute), LeaseUntil: base.Add(time.Hour)})
	if err != nil || b.Attempt != 2 {
		t.Fatalf("claim after the dead worker's lease = %+v, %v; want attempt 2", b, err)
	}
}

func BenchmarkPutRows(b *testing.B) {
	s, _ := open(b)
	ctx := context.Background()
	const n = 10_000
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("task-%d", i)
		if err := s.CreateTask(ctx, store.Task{ID: id, CreatedAt: base}); err != nil {
			b.Fatal(err)
		}
		rows := make([]store.Row, n)
		for j := range rows {
			rows[j] = store.Row{TaskID: id, No: j + 1, SheetRow: j + 2, Values: []string{fmt.Sprintf("product %d", j+1), "toys", "9.99"}}
		}
		if err := s.PutRows(ctx, rows); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
}

func BenchmarkClaimBatch(b *testing.B) {
	s, _ := open(b)
	ctx := context.Background()
	seed(b, s, "task-1", 1, 1)
	now := base
	for b.Loop() {
		// Each claim takes over the previous one's expired lease.
		now = now.Add(2 * time.Minute)
		if _, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: "task-1", BatchNo: 1, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
			b.Fatal(err)
		}
	}
}
