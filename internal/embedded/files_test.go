package embedded_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/embedded"
)

// failingReader yields some bytes, then fails: a result that cannot be
// read whole.
type failingReader struct{ sent bool }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.sent {
		return 0, errors.New("disk gone")
	}
	r.sent = true
	return copy(p, "half a workbook"), nil
}

// TestWriteFileAtomic: a write that fails leaves the file that was there
// and no temporary file; one that succeeds replaces it whole, readable by
// others.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "skus.result.xlsx")
	if err := os.WriteFile(path, []byte("the earlier result"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := embedded.WriteFileAtomic(path, &failingReader{}); err == nil {
		t.Fatal("no error from a failed read")
	}
	if b, _ := os.ReadFile(path); string(b) != "the earlier result" {
		t.Errorf("after a failed write the file holds %q, want the earlier result", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("after a failed write the folder holds %d files, want only the result", len(entries))
	}
	if err := embedded.WriteFileAtomic(path, strings.NewReader("the new result")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "the new result" {
		t.Errorf("the file holds %q, want the new result", b)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the result's mode is %v (%v), want 0644", fi.Mode().Perm(), err)
	}
}

// TestFileIdentity: the identity is the content's, wherever the file lies.
func TestFileIdentity(t *testing.T) {
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a.csv"), filepath.Join(dir, "sub-b.csv"), filepath.Join(dir, "c.csv")
	for p, body := range map[string]string{a: "sku,name\n1,x\n", b: "sku,name\n1,x\n", c: "sku,name\n2,y\n"} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	id := func(p string) string {
		t.Helper()
		s, err := embedded.FileIdentity(p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if id(a) != id(b) {
		t.Error("the same content in two files has two identities")
	}
	if id(a) == id(c) {
		t.Error("other content has the same identity")
	}
	if _, err := embedded.FileIdentity(filepath.Join(dir, "missing.csv")); err == nil || strings.Contains(err.Error(), dir) {
		t.Errorf("missing file: %v, want an error that does not repeat the path", err)
	}
}
