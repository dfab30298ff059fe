//go:build emulator

package lambdafn_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/samstack/localrun"
	"github.com/batchgen/batchgen/internal/store"
)

// TestDropFolderExtensionsInAnyCase drops sheets named as Windows and Excel users name them, and files that are
// not sheets, into the emulator's drop folder. The watch (the local stand-in for the bucket notification, which
// filters on the prefix only) hands the sheets to the splitter and skips the rest.
func TestDropFolderExtensionsInAnyCase(t *testing.T) {
	e := newE2E(t, e2eOptions{})
	book := lambdatest.XLSX(t, lambdatest.Header, lambdatest.Rows(3), "为{{商品名称}}写文案")
	// Workbooks, because their prompt sheet supplies the template (the stack here has no default prompt for CSV);
	// CSV names in any case are covered by TestSplitterAcceptsExtensionsInAnyCase.
	sheets := map[string][]byte{"A.XLSX": book, "b.Xlsx": book, "c.xlsx": book, "d.XLSM": book}
	for name, body := range sheets {
		if _, err := e.stack.Upload(t.Context(), name, body); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"notes.txt", ".DS_Store", "old.xls", "e.csv.bak"} {
		if _, err := e.stack.Upload(t.Context(), name, []byte("not a sheet")); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var (
		mu     sync.Mutex
		splits []localrun.Split
	)
	err := e.stack.Watch(ctx, 10*time.Millisecond, func(s localrun.Split) {
		mu.Lock()
		defer mu.Unlock()
		splits = append(splits, s)
		if len(splits) == len(sheets) {
			cancel()
		}
	})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var keys []string
	for _, s := range splits {
		if s.Err != nil {
			t.Errorf("split %s: %v", s.Key, s.Err)
		}
		keys = append(keys, s.Key)
		task, err := e.stack.Store.GetTask(t.Context(), s.TaskID)
		if err != nil {
			t.Errorf("task of %s: %v", s.Key, err)
			continue
		}
		if task.State == store.TaskFailed || task.RowsTotal != 3 {
			t.Errorf("task of %s is %s with %d rows (%s); want 3 rows split", s.Key, task.State, task.RowsTotal, task.Error)
		}
	}
	slices.Sort(keys)
	want := []string{"incoming/A.XLSX", "incoming/b.Xlsx", "incoming/c.xlsx", "incoming/d.XLSM"}
	if !slices.Equal(keys, want) {
		t.Errorf("handed to the splitter: %q, want %q", keys, want)
	}
}
