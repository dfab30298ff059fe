package fileblob_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/blob/blobtest"
	"github.com/batchgen/batchgen/internal/blob/fileblob"
)

// newStore returns a store on a new temp directory, and the directory.
func newStore(t *testing.T) (*fileblob.Store, string) {
	t.Helper()
	root := t.TempDir()
	s, err := fileblob.New(root)
	if err != nil {
		t.Fatalf("new: %v", err)
	}
	return s, root
}

func TestConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		s, root := newStore(t)
		// Whatever a subtest did, no temporary file may be left behind.
		t.Cleanup(func() {
			if left := tempFiles(t, root); len(left) > 0 {
				t.Errorf("temporary files left behind: %v", left)
			}
		})
		return s
	})
}

// tempFiles lists the files under root whose names mark them temporary.
func tempFiles(t *testing.T, root string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.Contains(d.Name(), ".tmp-") {
			found = append(found, path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return found
}

func TestFilesUnderRoot(t *testing.T) {
	s, root := newStore(t)
	if err := s.Put(t.Context(), "results/2025/t.xlsx", strings.NewReader("data")); err != nil {
		t.Fatalf("put: %v", err)
	}
	path := filepath.Join(root, "results", "2025", "t.xlsx")
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "data" {
		t.Fatalf("file %s = %q, %v; want data", path, got, err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat: %v", err)
	}
	if mode := info.Mode().Perm(); mode != 0o600 {
		t.Errorf("file mode = %v, want -rw------- (the owner opens the result; nobody else reads a task's data)", mode)
	}
	dir, err := os.Stat(filepath.Dir(path))
	if err != nil || dir.Mode().Perm() != 0o700 {
		t.Errorf("folder mode = %v (%v), want drwx------", dir.Mode().Perm(), err)
	}
	p, err := s.Path("results/2025/t.xlsx")
	if err != nil || p != path {
		t.Errorf("Path = %q, %v; want %q", p, err, path)
	}
}

func TestInvalidKeys(t *testing.T) {
	s, root := newStore(t)
	ctx := t.Context()
	keys := []string{"", ".", "..", "../x", "/abs", `a\b`, `..\x`, "a//b", "a/./b", "a/../b", "trailing/", "nul\x00byte"}
	for _, key := range keys {
		t.Run(key, func(t *testing.T) {
			errs := map[string]error{
				"put":    s.Put(ctx, key, strings.NewReader("x")),
				"delete": s.Delete(ctx, key),
			}
			_, errs["open"] = s.Open(ctx, key)
			_, errs["path"] = s.Path(key)
			for op, err := range errs {
				if !errors.Is(err, fileblob.ErrInvalidKey) {
					t.Errorf("%s(%q): error = %v, want %v", op, key, err, fileblob.ErrInvalidKey)
				}
			}
		})
	}
	entries, err := os.ReadDir(root)
	if err != nil || len(entries) != 0 {
		t.Errorf("root holds %d entries after invalid puts (err %v), want none", len(entries), err)
	}
}

// TestOSErrorsWrapped checks that a file-system failure reaches the caller
// as the OS error, with the path, rather than as a generic failure. ENOTDIR
// stands in for ENOSPC and EACCES, which cannot be provoked portably (tests
// may run as root, which ignores permission bits).
func TestOSErrorsWrapped(t *testing.T) {
	s, root := newStore(t)
	ctx := t.Context()
	if err := s.Put(ctx, "results", strings.NewReader("a file where a folder is wanted")); err != nil {
		t.Fatalf("put: %v", err)
	}
	err := s.Put(ctx, "results/t.xlsx", strings.NewReader("x"))
	if !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("put under a file: error = %v, want ENOTDIR", err)
	}
	if !strings.Contains(err.Error(), filepath.Join(root, "results")) {
		t.Errorf("error %q does not name the path", err)
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		t.Errorf("error %v does not carry an *fs.PathError", err)
	}
}

func TestPutOverFolderFails(t *testing.T) {
	s, _ := newStore(t)
	ctx := t.Context()
	if err := s.Put(ctx, "results/t.xlsx", strings.NewReader("x")); err != nil {
		t.Fatalf("put: %v", err)
	}
	if err := s.Put(ctx, "results", strings.NewReader("y")); err == nil {
		t.Error("put over a folder of objects succeeded, want an error")
	}
	if err := s.Delete(ctx, "results"); err != nil {
		t.Errorf("delete of a folder: %v, want nil (no such object)", err)
	}
	rc, err := s.Open(ctx, "results/t.xlsx")
	if err != nil {
		t.Fatalf("the object in the folder is gone: %v", err)
	}
	rc.Close()
}

func TestCancelledPutKeepsOld(t *testing.T) {
	s, root := newStore(t)
	if err := s.Put(t.Context(), "k", strings.NewReader("old")); err != nil {
		t.Fatalf("put: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.Put(ctx, "k", bytes.NewReader(make([]byte, 1<<20)))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("put with a cancelled context: error = %v, want context.Canceled", err)
	}
	got, err := os.ReadFile(filepath.Join(root, "k"))
	if err != nil || string(got) != "old" {
		t.Errorf("object after cancelled put = %q, %v; want old", got, err)
	}
	if left := tempFiles(t, root); len(left) > 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

func TestNew(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		root    string
		wantErr bool
	}{
		{"existing", dir, false},
		{"created with parents", filepath.Join(dir, "data", "blobs"), false},
		{"relative", ".", false},
		{"empty", "", true},
		{"a file", file, true},
		{"below a file", filepath.Join(file, "blobs"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := fileblob.New(tt.root)
			if got := err != nil; got != tt.wantErr {
				t.Fatalf("New(%q) error = %v, want error: %v", tt.root, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			info, err := os.Stat(tt.root)
			if err != nil || !info.IsDir() {
				t.Errorf("root %s is not a directory after New: %v", tt.root, err)
			}
			p, err := s.Path("x")
			if err != nil || !filepath.IsAbs(p) {
				t.Errorf("Path = %q, %v; want an absolute path", p, err)
			}
		})
	}
}

func TestDeleteKeepsSiblings(t *testing.T) {
	s, root := newStore(t)
	ctx := t.Context()
	for _, key := range []string{"a/1", "a/2"} {
		if err := s.Put(ctx, key, strings.NewReader(key)); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	if err := s.Delete(ctx, "a/1"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	entries, err := os.ReadDir(filepath.Join(root, "a"))
	if err != nil {
		t.Fatalf("read dir: %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if d := cmp.Diff([]string{"2"}, names); d != "" {
		t.Errorf("folder after delete (-want +got):\n%s", d)
	}
}

// TestLinksOutOfTheRootAreNotFollowed: a symbolic link in the store that leads out of it (a drop folder's
// incoming/x.prompt.txt -> any file of the machine) is not followed: the object is missing, and nothing of the
// file it names is read. A link within the store is an ordinary object.
func TestLinksOutOfTheRootAreNotFollowed(t *testing.T) {
	t.Parallel()
	root, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte("the first line of a private file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := fileblob.New(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Put(ctx, "incoming/real.txt", strings.NewReader("inside")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(root, "incoming", "x.prompt.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real.txt", filepath.Join(root, "incoming", "alias.txt")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(ctx, "incoming/x.prompt.txt"); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Open of a link out of the root: %v, want ErrNotFound", err)
	}
	if _, err := s.Size(ctx, "incoming/x.prompt.txt"); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Size of a link out of the root: %v, want ErrNotFound", err)
	}
	rc, err := s.Open(ctx, "incoming/alias.txt")
	if err != nil {
		t.Fatalf("a link within the root: %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "inside" {
		t.Errorf("a link within the root reads %q", b)
	}
}
