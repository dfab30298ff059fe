package pipeline_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// recordingStore is the SQLite store recording the generator's grouped
// writes and batched cache reads.
type recordingStore struct {
	*sqlitestore.Store
	mu       sync.Mutex
	groups   []int // rows per SaveRowResults call
	cached   int   // cache entries written with the groups
	lookups  int   // GetCached calls
	onSave   func(store.SaveRowResultsParams)
	lookedUp int // keys looked up
}

func (s *recordingStore) SaveRowResults(ctx context.Context, p store.SaveRowResultsParams) (store.SaveRowResultsResult, error) {
	s.mu.Lock()
	s.groups = append(s.groups, len(p.Rows))
	s.cached += len(p.Cache)
	s.mu.Unlock()
	if s.onSave != nil {
		s.onSave(p)
	}
	return s.Store.SaveRowResults(ctx, p)
}

func (s *recordingStore) GetCached(ctx context.Context, keys []string) (map[string]string, error) {
	s.mu.Lock()
	s.lookups++
	s.lookedUp += len(keys)
	s.mu.Unlock()
	return s.Store.GetCached(ctx, keys)
}

func record(e *env) *recordingStore {
	rs := &recordingStore{Store: e.store}
	e.cfg.Cache = rs
	e.useStore(rs)
	return rs
}

// TestResultsWrittenInGroups: with a long flush interval, results are
// written FlushRows (or a few more that arrived meanwhile) at a time, the
// cache entries ride with them, and each batch's cache lookups are one
// read.
func TestResultsWrittenInGroups(t *testing.T) {
	t.Parallel()
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		return llm.Response{Text: "copy for " + req.Prompt}, nil
	})
	const rows, batchSize, flushRows = 60, 30, 5
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 4, FlushRows: flushRows, FlushInterval: time.Hour})
	rs := record(e)
	id := e.splitProducts("groups", "{{id}} {{name}}", rows, batchSize).TaskID
	task := e.runToCompletion(context.Background(), id)
	if task.State != store.TaskSucceeded || task.RowsSucceeded != rows {
		t.Fatalf("task %s with %d rows succeeded, want SUCCEEDED with %d", task.State, task.RowsSucceeded, rows)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	written := 0
	for _, n := range rs.groups {
		written += n
		if n > store.MaxSaveRows {
			t.Errorf("a group of %d rows, more than MaxSaveRows %d", n, store.MaxSaveRows)
		}
	}
	if written != rows {
		t.Errorf("%d row results written in groups %v, want %d", written, rs.groups, rows)
	}
	// A full group's write may take a few more results that arrived while
	// it waited, leaving each batch's end one short group to flush.
	if max := rows / batchSize * (batchSize/flushRows + 1); len(rs.groups) > max {
		t.Errorf("%d writes for %d rows (groups %v), want at most %d", len(rs.groups), rows, rs.groups, max)
	}
	if rs.cached != rows {
		t.Errorf("%d cache entries written with the results, want %d", rs.cached, rows)
	}
	if want := rows / batchSize; rs.lookups != want || rs.lookedUp != rows {
		t.Errorf("%d cache reads for %d keys, want %d reads (one per batch) for %d keys", rs.lookups, rs.lookedUp, want, rows)
	}

	// A second task of the same prompts is answered from the cache in one
	// read per batch, without a model call.
	calls := atomic.Int32{}
	e.provider = providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		calls.Add(1)
		return llm.Response{Text: "fresh"}, nil
	})
	e.useStore(rs)
	rs.groups, rs.lookups, rs.lookedUp = nil, 0, 0
	rs.mu.Unlock()
	id2 := e.splitProducts("groups again", "{{id}} {{name}}", rows, batchSize).TaskID
	task = e.runToCompletion(context.Background(), id2)
	rs.mu.Lock()
	if task.RowsSucceeded != rows || calls.Load() != 0 {
		t.Errorf("second task: %d rows succeeded after %d model calls, want %d from the cache", task.RowsSucceeded, calls.Load(), rows)
	}
	if rs.lookups != rows/batchSize {
		t.Errorf("second task: %d cache reads, want %d", rs.lookups, rows/batchSize)
	}
}

// TestFlushIntervalWritesALoneResult: a result that finds no company is
// written after FlushInterval, while the rest of its batch is still
// running.
func TestFlushIntervalWritesALoneResult(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var first atomic.Bool
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		if first.CompareAndSwap(false, true) {
			return llm.Response{Text: "first"}, nil
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return llm.Response{}, ctx.Err()
		}
		return llm.Response{Text: "later"}, nil
	})
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2, FlushRows: 10, FlushInterval: 20 * time.Millisecond})
	rs := record(e)
	saved := make(chan int, 16)
	rs.onSave = func(p store.SaveRowResultsParams) { saved <- len(p.Rows) }
	id := e.splitProducts("lone", "{{id}}", 6, 6).TaskID
	done := make(chan store.Task, 1)
	go func() { done <- e.runToCompletion(context.Background(), id) }()
	select {
	case n := <-saved:
		if n != 1 {
			t.Errorf("the first write had %d rows, want the lone first result", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the lone result was never written while its batch ran")
	}
	close(gate)
	if task := <-done; task.RowsSucceeded != 6 {
		t.Errorf("%d rows succeeded, want 6", task.RowsSucceeded)
	}
}

// TestLargeResultsSplitIntoBoundedGroups: results whose outputs (and the
// cache entries that ride with them) would make one group heavier than a
// DynamoDB transaction holds are written in several groups, each within
// store.MaxSaveBytes and store.MaxSaveRows, and every row is saved.
func TestLargeResultsSplitIntoBoundedGroups(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 300<<10) // 300 KiB, under DynamoDB's 400 KB item
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		return llm.Response{Text: req.Prompt + big}, nil
	})
	const rows = 20
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 4, FlushRows: rows, FlushInterval: time.Hour})
	rs := record(e)
	var sizes []int
	rs.onSave = func(p store.SaveRowResultsParams) {
		rs.mu.Lock()
		sizes = append(sizes, p.Size())
		rs.mu.Unlock()
	}
	id := e.splitProducts("big", "{{id}}", rows, rows).TaskID
	task := e.runToCompletion(context.Background(), id)
	if task.State != store.TaskSucceeded || task.RowsSucceeded != rows {
		t.Fatalf("task %s with %d rows succeeded, want SUCCEEDED with %d", task.State, task.RowsSucceeded, rows)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	written := 0
	for i, n := range rs.groups {
		written += n
		if sizes[i] > store.MaxSaveBytes || n > store.MaxSaveRows {
			t.Errorf("group %d: %d rows, %d bytes; at most %d rows and %d bytes", i, n, sizes[i], store.MaxSaveRows, store.MaxSaveBytes)
		}
	}
	if written != rows {
		t.Errorf("%d rows written, want %d", written, rows)
	}
	// 20 rows of 600 KiB (output and cache entry) are 12 MiB: at least 4
	// groups of at most 3 MiB.
	if len(rs.groups) < 4 {
		t.Errorf("%d groups %v, want at least 4 for %d MiB of results", len(rs.groups), rs.groups, rows*600>>10)
	}
}

// TestFlushAtOnceGroupsCommits: with FlushAtOnce (the embedded runtime's
// setting) a fast model's results are written by whichever row finds no
// write under way, together with every result that arrived while the
// previous write ran, so a slow store sees groups, not one write per row
// (which cost the 100,000-row run a SQLite transaction per row). A row
// whose result waits for the writer keeps its concurrency slot until its
// group is written: at no moment are more results paid and unsaved than
// there are slots, so a kill bills no more rows twice than calls were in
// flight. A batch answered from the cache is written in full groups.
func TestFlushAtOnceGroupsCommits(t *testing.T) {
	t.Parallel()
	const rows, slots = 100, 8
	// answered counts the calls paid, saved the results written: their
	// difference, seen as each call starts, is what a kill would bill
	// twice.
	var answered, saved, mostUnsaved atomic.Int64
	p := providerFunc(func(ctx context.Context, req llm.Request) (llm.Response, error) {
		if unsaved := answered.Load() - saved.Load(); unsaved > mostUnsaved.Load() {
			mostUnsaved.Store(unsaved)
		}
		answered.Add(1)
		return llm.Response{Text: "copy for " + req.Prompt}, nil
	})
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: slots, FlushRows: store.MaxSaveRows, FlushInterval: pipeline.FlushAtOnce})
	rs := record(e)
	// Each write takes long enough for the rest of the batch to finish.
	rs.onSave = func(p store.SaveRowResultsParams) {
		time.Sleep(20 * time.Millisecond)
		saved.Add(int64(len(p.Rows)))
	}
	id := e.splitProducts("at once", "{{id}} {{name}}", rows, rows).TaskID
	if task := e.runToCompletion(context.Background(), id); task.RowsSucceeded != rows {
		t.Fatalf("%d rows succeeded, want %d", task.RowsSucceeded, rows)
	}
	rs.mu.Lock()
	groups := rs.groups
	rs.mu.Unlock()
	if n := mostUnsaved.Load(); n > slots {
		t.Errorf("%d results were paid and unsaved at once, more than the %d slots", n, slots)
	}
	// Grouped: far fewer writes than rows (the writer's own row, then the
	// ones that waited for it: at most the slots a group).
	if len(groups) > rows/3 {
		t.Errorf("%d writes for %d rows (groups %v), want groups of up to %d", len(groups), rows, groups, slots)
	}
	for _, n := range groups {
		if n > slots {
			t.Errorf("a group of %d results, more than the %d slots that can wait for a write (groups %v)", n, slots, groups)
		}
	}

	// The same prompts again: every row a cache hit, written 40 at a time.
	rs.mu.Lock()
	rs.groups = nil
	rs.mu.Unlock()
	id2 := e.splitProducts("at once again", "{{id}} {{name}}", rows, rows).TaskID
	if task := e.runToCompletion(context.Background(), id2); task.RowsSucceeded != rows {
		t.Fatalf("cached task: %d rows succeeded, want %d", task.RowsSucceeded, rows)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if want := []int{40, 40, 20}; !slices.Equal(rs.groups, want) {
		t.Errorf("cache hits written in groups %v, want %v", rs.groups, want)
	}
}
