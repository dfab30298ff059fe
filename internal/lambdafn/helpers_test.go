package lambdafn_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

var epoch = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// countingBlobs is the file blob store plus the Size the splitter needs
// (S3's HeadObject), counting downloads per key so tests can tell one was
// avoided.
type countingBlobs struct {
	*fileblob.Store
	sizeErr error
	mu      sync.Mutex
	opened  map[string]int
}

func (s *countingBlobs) Size(_ context.Context, key string) (int64, error) {
	if s.sizeErr != nil {
		return 0, s.sizeErr
	}
	p, err := s.Path(key)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, blob.ErrNotFound
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (s *countingBlobs) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	s.mu.Lock()
	s.opened[key]++
	s.mu.Unlock()
	return s.Store.Open(ctx, key)
}

func (s *countingBlobs) opens(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened[key]
}

// env is the embedded adapters the handlers run on in unit tests.
type env struct {
	t     *testing.T
	dir   string
	clock *clock.Fake
	store *sqlitestore.Store
	queue *sqlitequeue.Queue
	blobs *countingBlobs
	logs  *syncBuffer
	log   *slog.Logger
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	clk := clock.NewFake(epoch)
	st, err := sqlitestore.Open(filepath.Join(dir, "db.sqlite"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: "work", Visibility: 30 * time.Minute, MaxReceive: 5, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := fileblob.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	return &env{
		t: t, dir: dir, clock: clk, store: st, queue: q,
		blobs: &countingBlobs{Store: fb, opened: map[string]int{}},
		logs:  logs,
		log:   slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of handlers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lines returns the JSON lines written so far.
func (b *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// put stores content under key.
func (e *env) put(key string, content []byte) {
	e.t.Helper()
	if err := e.blobs.Put(e.t.Context(), key, bytes.NewReader(content)); err != nil {
		e.t.Fatalf("put %s: %v", key, err)
	}
}

// get returns the content at key, or fails.
func (e *env) get(key string) string {
	e.t.Helper()
	p, err := e.blobs.Path(key)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		e.t.Fatalf("read %s: %v", key, err)
	}
	return string(b)
}

// drain receives every visible message.
func (e *env) drain() []queue.Delivery {
	e.t.Helper()
	var all []queue.Delivery
	for {
		ds, err := e.queue.Receive(e.t.Context(), 10)
		if err != nil {
			e.t.Fatalf("receive: %v", err)
		}
		if len(ds) == 0 {
			return all
		}
		all = append(all, ds...)
	}
}

func (e *env) tasks() []store.Task {
	e.t.Helper()
	ts, err := e.store.ListTasks(e.t.Context(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return ts
}

// xlsx builds a workbook with a data sheet and, when promptText is not
// empty, a "prompt" sheet holding it in A1.
func xlsx(t *testing.T, header []string, rows [][]string, promptText string) []byte {
	t.Helper()
	f := excelize.NewFile()
	defer f.Close()
	if err := f.SetSheetName("Sheet1", "商品"); err != nil {
		t.Fatal(err)
	}
	write := func(sheet string, r int, values []string) {
		for c, v := range values {
			cell, err := excelize.CoordinatesToCellName(c+1, r)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.SetCellStr(sheet, cell, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("商品", 1, header)
	for i, r := range rows {
		write("商品", i+2, r)
	}
	if promptText != "" {
		if _, err := f.NewSheet("prompt"); err != nil {
			t.Fatal(err)
		}
		write("prompt", 1, []string{promptText})
	}
	var buf bytes.Buffer
	if err := f.Write(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func csvBytes(header []string, rows [][]string) []byte {
	var b strings.Builder
	b.WriteString(strings.Join(header, ",") + "\n")
	for _, r := range rows {
		b.WriteString(strings.Join(r, ",") + "\n")
	}
	return []byte(b.String())
}

// readJSON decodes a testdata file into v.
func readJSON(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
}
