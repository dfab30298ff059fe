package dropdir_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/dropdir"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// recorder is an Accepter that records what it was given.
type recorder struct {
	mu       sync.Mutex
	accepted []string // key@version
	fail     error
}

func (r *recorder) Accept(_ context.Context, key, version string) (pipeline.IntakeResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return pipeline.IntakeResult{}, r.fail
	}
	r.accepted = append(r.accepted, key+"@"+version)
	return pipeline.IntakeResult{Outcome: pipeline.IntakeSplit, TaskID: "t", Taken: true}, nil
}

func hash(content string) string {
	sum := sha256.Sum256([]byte(content))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestScan: a sheet is taken at the first scan that finds it as the
// previous scan did, and moved to processed/ with its sub-path; a file that
// changed between scans waits; hidden files, .tmp files and files that are
// no sheets are never taken; the version is the content's hash, so the
// same content dropped again has the same version.
func TestScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root := t.TempDir()
	rec := &recorder{}
	f, err := dropdir.New(dropdir.Config{Root: root, Intake: rec})
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(root, "incoming")
	write(t, filepath.Join(in, "a.CSV"), "x\n1\n")
	write(t, filepath.Join(in, "team", "b.xlsx"), "not really a workbook")
	write(t, filepath.Join(in, "c.csv.tmp"), "x\n1\n")
	write(t, filepath.Join(in, ".d.csv"), "x\n1\n")
	write(t, filepath.Join(in, "a.prompt.txt"), "{{x}}")
	write(t, filepath.Join(in, ".hidden", "e.csv"), "x\n1\n")
	scan := func() int {
		t.Helper()
		n, err := f.Scan(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := scan(); n != 0 {
		t.Fatalf("first scan took %d files; a file is taken only once it looked the same twice", n)
	}
	// b.xlsx grows between the looks: it waits another scan.
	write(t, filepath.Join(in, "team", "b.xlsx"), "not really a workbook, longer")
	if n := scan(); n != 1 {
		t.Fatalf("second scan took %d files, want a.CSV only", n)
	}
	if n := scan(); n != 1 {
		t.Fatalf("third scan took %d files, want team/b.xlsx", n)
	}
	if n := scan(); n != 0 {
		t.Fatalf("fourth scan took %d files, want none", n)
	}
	want := []string{"incoming/a.CSV@" + hash("x\n1\n"), "incoming/team/b.xlsx@" + hash("not really a workbook, longer")}
	if diff := cmp.Diff(want, rec.accepted); diff != "" {
		t.Errorf("accepted (-want +got):\n%s", diff)
	}
	for _, p := range []string{"processed/a.CSV", "processed/team/b.xlsx", "incoming/c.csv.tmp", "incoming/.d.csv", "incoming/a.prompt.txt", "incoming/.hidden/e.csv"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}

	// The same content again: the same version.
	write(t, filepath.Join(in, "a.CSV"), "x\n1\n")
	scan()
	scan()
	if len(rec.accepted) != 3 || rec.accepted[2] != rec.accepted[0] {
		t.Errorf("the same content dropped again: %q, want the first key@version again", rec.accepted)
	}
}

// TestScanRetriesAfterFailure: an input whose intake failed stays in
// incoming/ and is not tried again before RetryAfter.
func TestScanRetriesAfterFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root := t.TempDir()
	rec := &recorder{fail: errors.New("disk full")}
	f, err := dropdir.New(dropdir.Config{Root: root, Intake: rec})
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "incoming", "a.csv"), "x\n1\n")
	for range 4 {
		if n, err := f.Scan(ctx); err != nil || n != 0 {
			t.Fatalf("Scan = %d, %v; want nothing taken while the intake fails", n, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "incoming", "a.csv")); err != nil {
		t.Errorf("the input left incoming/: %v", err)
	}
	rec.mu.Lock()
	rec.fail = nil
	rec.mu.Unlock()
	if n, _ := f.Scan(ctx); n != 0 {
		t.Errorf("taken again at once after a failure; want a wait of RetryAfter (30s)")
	}
}
