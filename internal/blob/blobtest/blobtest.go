// Package blobtest is the conformance suite for blob.Store adapters.
//
// What the suite asks of an adapter beyond the doc comments in package blob:
//   - newStore returns an empty store (a fresh directory, bucket or prefix)
//     that no other test writes to; subtests run in parallel.
//   - Put streams: it must accept a reader of unknown length that is not
//     an io.Seeker (the suite's 5 MB object comes through an io.Pipe).
//   - Keys that are empty, absolute or contain a ".." element are refused by
//     Put, Open, Delete and Move with an error, so a key taken from user input can
//     never reach outside the store.
package blobtest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/batchgen/batchgen/internal/blob"
)

// Run runs the blob store conformance suite.
func Run(t *testing.T, newStore func(t *testing.T) blob.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s blob.Store)
	}{
		{"RoundTrip", testRoundTrip},
		{"Streamed", testStreamed},
		{"Overwrite", testOverwrite},
		{"OpenMissing", testOpenMissing},
		{"DeleteIdempotent", testDeleteIdempotent},
		{"FailedPutKeepsOld", testFailedPutKeepsOld},
		{"SubFolders", testSubFolders},
		{"InvalidKeys", testInvalidKeys},
		{"ConcurrentPuts", testConcurrentPuts},
		{"Move", testMove},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// put stores data under key and fails the test if it cannot.
func put(t *testing.T, s blob.Store, key string, data []byte) {
	t.Helper()
	if err := s.Put(t.Context(), key, bytes.NewReader(data)); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// read returns the content under key and fails the test if it cannot.
func read(t *testing.T, s blob.Store, key string) []byte {
	t.Helper()
	rc, err := s.Open(t.Context(), key)
	if err != nil {
		t.Fatalf("open %s: %v", key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return data
}

// wantContent fails the test unless key holds want.
func wantContent(t *testing.T, s blob.Store, key string, want []byte) {
	t.Helper()
	if got := read(t, s, key); !bytes.Equal(got, want) {
		t.Errorf("%s holds %d bytes %q, want %d bytes %q", key, len(got), abbrev(got), len(want), abbrev(want))
	}
}

// wantMissing fails the test unless Open of key reports blob.ErrNotFound.
func wantMissing(t *testing.T, s blob.Store, key string) {
	t.Helper()
	rc, err := s.Open(t.Context(), key)
	if err == nil {
		rc.Close()
		t.Fatalf("open %s succeeded, want %v", key, blob.ErrNotFound)
	}
	if !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("open %s: error = %v, want %v", key, err, blob.ErrNotFound)
	}
}

// abbrev shortens data for messages.
func abbrev(data []byte) []byte {
	if len(data) > 40 {
		return append(data[:40:40], "..."...)
	}
	return data
}

// payload returns n deterministic pseudo-random bytes.
func payload(seed uint64, n int) []byte {
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	data := make([]byte, n)
	r.Read(data)
	return data
}

func testRoundTrip(t *testing.T, s blob.Store) {
	tests := []struct {
		name string
		key  string
		data []byte
	}{
		{"one byte", "one", []byte{0x42}},
		{"empty", "empty.txt", []byte{}},
		{"text", "incoming/商品 list.csv", []byte("名称,类目\n积木,玩具\n")},
		{"binary", "bin", payload(1, 64<<10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			put(t, s, tt.key, tt.data)
			wantContent(t, s, tt.key, tt.data)
		})
	}
}

func testStreamed(t *testing.T, s blob.Store) {
	const size, chunk = 5 << 20, 32 << 10
	pr, pw := io.Pipe()
	want := sha256.New()
	go func() {
		// Write a chunk at a time so the adapter never sees the whole
		// object at once, as when an export is streamed.
		for i := 0; i < size/chunk; i++ {
			data := payload(uint64(i), chunk)
			want.Write(data)
			if _, err := pw.Write(data); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.Close()
	}()
	if err := s.Put(t.Context(), "results/big.xlsx", pr); err != nil {
		pr.CloseWithError(err)
		t.Fatalf("put: %v", err)
	}
	rc, err := s.Open(t.Context(), "results/big.xlsx")
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer rc.Close()
	got := sha256.New()
	n, err := io.Copy(got, rc)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if n != size || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Errorf("read back %d bytes with sha256 %x, want %d bytes with %x", n, got.Sum(nil), size, want.Sum(nil))
	}
}

func testOverwrite(t *testing.T, s blob.Store) {
	steps := [][]byte{
		[]byte("first version, rather long"),
		[]byte("short"), // a longer old object must not leave a tail
		{},
		[]byte("last"),
	}
	for _, data := range steps {
		put(t, s, "results/t.xlsx", data)
		wantContent(t, s, "results/t.xlsx", data)
	}
}

func testOpenMissing(t *testing.T, s blob.Store) {
	put(t, s, "results/present", []byte("x"))
	for _, key := range []string{"missing", "results/missing", "no/such/folder/key", "results/present/below"} {
		t.Run(key, func(t *testing.T) { wantMissing(t, s, key) })
	}
}

func testDeleteIdempotent(t *testing.T, s blob.Store) {
	ctx := t.Context()
	put(t, s, "results/t.xlsx", []byte("x"))
	for i := range 2 {
		if err := s.Delete(ctx, "results/t.xlsx"); err != nil {
			t.Fatalf("delete #%d: %v", i+1, err)
		}
		wantMissing(t, s, "results/t.xlsx")
	}
	if err := s.Delete(ctx, "never/there"); err != nil {
		t.Errorf("delete of a key never put: %v", err)
	}
	// The key can be used again.
	put(t, s, "results/t.xlsx", []byte("again"))
	wantContent(t, s, "results/t.xlsx", []byte("again"))
}

// errReader returns data, then err.
type errReader struct {
	data []byte
	err  error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func testFailedPutKeepsOld(t *testing.T, s blob.Store) {
	ctx := t.Context()
	old := []byte("the complete old export")
	put(t, s, "results/t.xlsx", old)
	errBroken := errors.New("source broke halfway")
	err := s.Put(ctx, "results/t.xlsx", &errReader{data: payload(2, 256<<10), err: errBroken})
	if err == nil {
		t.Fatal("Put from a failing reader succeeded, want an error")
	}
	wantContent(t, s, "results/t.xlsx", old)

	err = s.Put(ctx, "results/new.xlsx", &errReader{data: []byte("partial"), err: errBroken})
	if err == nil {
		t.Fatal("Put of a new key from a failing reader succeeded, want an error")
	}
	wantMissing(t, s, "results/new.xlsx")
}

func testSubFolders(t *testing.T, s blob.Store) {
	ctx := t.Context()
	objects := map[string][]byte{
		"top":                          []byte("0"),
		"results/task.xlsx":            []byte("1"),
		"results/2025/03/01/task.xlsx": []byte("2"),
		"results/2025/03/01/other.txt": []byte("3"),
		"incoming/a b/c.d/名.xlsx":      []byte("4"),
	}
	for key, data := range objects {
		put(t, s, key, data)
	}
	for key, data := range objects {
		wantContent(t, s, key, data)
	}
	if err := s.Delete(ctx, "results/2025/03/01/task.xlsx"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	wantMissing(t, s, "results/2025/03/01/task.xlsx")
	wantContent(t, s, "results/2025/03/01/other.txt", objects["results/2025/03/01/other.txt"])
	wantContent(t, s, "results/task.xlsx", objects["results/task.xlsx"])
}

func testInvalidKeys(t *testing.T, s blob.Store) {
	ctx := t.Context()
	for _, key := range []string{"", "../x", "/abs", "/etc/passwd", "a/../../x", "results/../../escape", ".."} {
		t.Run(fmt.Sprintf("%q", key), func(t *testing.T) {
			if err := s.Put(ctx, key, bytes.NewReader([]byte("x"))); err == nil {
				t.Errorf("Put(%q) succeeded, want an error", key)
			}
			if rc, err := s.Open(ctx, key); err == nil {
				rc.Close()
				t.Errorf("Open(%q) succeeded, want an error", key)
			}
			if err := s.Delete(ctx, key); err == nil {
				t.Errorf("Delete(%q) succeeded, want an error", key)
			}
			put(t, s, "valid", []byte("x"))
			if err := s.Move(ctx, key, "moved"); err == nil {
				t.Errorf("Move(%q, \"moved\") succeeded, want an error", key)
			}
			if err := s.Move(ctx, "valid", key); err == nil {
				t.Errorf("Move(\"valid\", %q) succeeded, want an error", key)
			}
			wantContent(t, s, "valid", []byte("x"))
		})
	}
}

// testConcurrentPuts overwrites one key from several goroutines while others
// read it: every read must see one whole version, never a mix or a prefix.
func testConcurrentPuts(t *testing.T, s blob.Store) {
	ctx := t.Context()
	const writers, puts, size = 4, 5, 64 << 10
	versions := make(map[[32]byte]bool)
	var data [][]byte
	for i := range writers * puts {
		d := payload(uint64(100+i), size)
		data = append(data, d)
		versions[sha256.Sum256(d)] = true
	}
	put(t, s, "results/t.xlsx", data[0])

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		errs    []error
		written = make(chan struct{})
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	var writersWG sync.WaitGroup
	for w := range writers {
		writersWG.Go(func() {
			for p := range puts {
				if err := s.Put(ctx, "results/t.xlsx", bytes.NewReader(data[w*puts+p])); err != nil {
					fail(fmt.Errorf("writer %d put %d: %w", w, p, err))
				}
			}
		})
	}
	go func() { writersWG.Wait(); close(written) }()
	for r := range 2 {
		wg.Go(func() {
			for {
				select {
				case <-written:
					return
				default:
				}
				rc, err := s.Open(ctx, "results/t.xlsx")
				if err != nil {
					fail(fmt.Errorf("reader %d open: %w", r, err))
					return
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil {
					fail(fmt.Errorf("reader %d read: %w", r, err))
					return
				}
				if !versions[sha256.Sum256(got)] {
					fail(fmt.Errorf("reader %d saw %d bytes that are no version that was put", r, len(got)))
					return
				}
			}
		})
	}
	wg.Wait()
	<-written
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := read(t, s, "results/t.xlsx"); !versions[sha256.Sum256(got)] {
		t.Errorf("final object (%d bytes) is no version that was put", len(got))
	}
}

// testMove moves objects as a drop folder moves its inputs to processed/:
// into new sub-folders, over an earlier object of the same name, and a
// second time after the object is gone (a repeated event), which must be
// blob.ErrNotFound and leave the moved object alone.
func testMove(t *testing.T, s blob.Store) {
	ctx := t.Context()
	tests := []struct {
		name, from, to string
		data, old      []byte // old: an object already at to, nil for none
	}{
		{"into a new folder", "incoming/商品 list+1.csv", "processed/商品 list+1.csv", []byte("名称\n积木\n"), nil},
		{"sub-folders", "incoming/a b/c.d/名.xlsx", "processed/a b/c.d/名.xlsx", payload(3, 64<<10), nil},
		{"over an older object", "incoming/again.csv", "processed/again.csv", []byte("new"), []byte("the older, longer content")},
		{"empty object", "incoming/empty.csv", "processed/empty.csv", []byte{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.old != nil {
				put(t, s, tt.to, tt.old)
			}
			put(t, s, tt.from, tt.data)
			if err := s.Move(ctx, tt.from, tt.to); err != nil {
				t.Fatalf("move %s to %s: %v", tt.from, tt.to, err)
			}
			wantContent(t, s, tt.to, tt.data)
			wantMissing(t, s, tt.from)
			err := s.Move(ctx, tt.from, tt.to)
			if !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("second move of %s: error = %v, want %v", tt.from, err, blob.ErrNotFound)
			}
			wantContent(t, s, tt.to, tt.data)
		})
	}
	t.Run("missing source leaves the target", func(t *testing.T) {
		put(t, s, "processed/kept.csv", []byte("kept"))
		if err := s.Move(ctx, "incoming/never.csv", "processed/kept.csv"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("move of a key never put: error = %v, want %v", err, blob.ErrNotFound)
		}
		wantContent(t, s, "processed/kept.csv", []byte("kept"))
		if err := s.Move(ctx, "incoming/never.csv", "processed/nothing.csv"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("move of a key never put: error = %v, want %v", err, blob.ErrNotFound)
		}
		wantMissing(t, s, "processed/nothing.csv")
	})
}
