package main

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestRetryRebuildsALostResult: a finished task whose stored result file was
// deleted from the data directory gets it back, rebuilt from its stored
// rows, from `batchgen retry` (and from running the same job again), with no
// model call and the same rows as the first result.
func TestRetryRebuildsALostResult(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 60, nil)
	data := filepath.Join(dir, ".batchgen")
	args := []string{"run", "--in", in, "--data", data, "--prompt", "为{{商品名称}}写文案", "--sim-latency", "1ms", "--batch-size", "25"}
	first := runBinary(t, context.Background(), args...)
	if first.code != 0 {
		t.Fatalf("run: exit %d\n%s", first.code, first.stderr)
	}
	want := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	id := strings.Fields(strings.SplitN(first.stdout, "\n", 2)[0])[1]

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"retry", []string{"retry", id, "--data", data, "--out", filepath.Join(dir, "retry.xlsx")}},
		{"run again", append(append([]string{}, args...), "--out", filepath.Join(dir, "again.xlsx"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			removeStoredResults(t, filepath.Join(data, "blobs"))
			r := runBinary(t, context.Background(), tc.args...)
			if r.code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stdout, "requests  0 this run") {
				t.Errorf("the rebuild called the model:\n%s", r.stdout)
			}
			got := readResult(t, tc.args[len(tc.args)-1])
			if !reflect.DeepEqual(got, want) {
				t.Errorf("rebuilt result differs from the first one:\ngot  %q\nwant %q", got[:3], want[:3])
			}
		})
	}
}

// removeStoredResults deletes every stored result workbook under a data
// directory's blob root, as someone cleaning up by hand would, and fails
// when there was none to delete (the test would prove nothing).
func removeStoredResults(t *testing.T, root string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".xlsx") && strings.Contains(filepath.ToSlash(path), "/results/") {
			n++
			return os.Remove(path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatalf("no stored result under %s", root)
	}
}
