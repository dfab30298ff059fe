//go:build emulator

package lambdafn_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/store"
)

// TestResultSentBackInOnAWS: on the stack, a result edited and dropped back into incoming/ continues as a task: the
// splitter recognises it, only the cleared and the flagged rows go to the model, and the exporter writes the
// answers into the result's own columns.
func TestResultSentBackInOnAWS(t *testing.T) {
	t.Parallel()
	e := newE2E(t, e2eOptions{rows: 30})
	up := e.upload("商品.xlsx", nil)
	if err := e.stack.Splitter.Handle(t.Context(), up); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	first := e.pump(e.taskID(up), 90*time.Second)
	if first.State != store.TaskSucceeded {
		t.Fatalf("first task = %s", first.State)
	}
	f, err := excelize.OpenReader(bytes.NewReader(e.result(first.ResultKey)))
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := f.GetRows("商品")
	col := func(name string) string {
		n, _ := excelize.ColumnNumberToName(slices.Index(rows[0], name) + 1)
		return n
	}
	_ = f.SetCellStr("商品", col("output")+"3", "")    // cleared
	_ = f.SetCellStr("商品", col("rerun")+"7", "再写一次") // flagged
	var edited bytes.Buffer
	if err := f.Write(&edited); err != nil {
		t.Fatal(err)
	}
	f.Close()

	calls := e.mock.Stats().Requests
	ev, err := e.stack.Upload(t.Context(), "商品.result.xlsx", edited.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.stack.Splitter.Handle(t.Context(), ev); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	second := e.pump(e.taskID(ev), 90*time.Second)
	if second.State != store.TaskSucceeded || second.RowsTotal != 30 {
		t.Fatalf("second task = %s with %d rows", second.State, second.RowsTotal)
	}
	if got := e.mock.Stats().Requests - calls; got != 2 {
		t.Errorf("%d model calls for the result sent back in, want 2 (the cleared and the flagged row)", got)
	}
	result := e.resultRows(second.ResultKey)
	if !slices.Equal(result[0], rows[0]) {
		t.Errorf("header = %q, want the result's own %q", result[0], rows[0])
	}
	out3 := result[2][slices.Index(result[0], "output")]
	if out3 == "" || result[6][slices.Index(result[0], "rerun")] != "" {
		t.Errorf("row 3 output %q, row 7 rerun %q: want an answer and the flag cleared", out3, result[6][slices.Index(result[0], "rerun")])
	}
}

// TestCSVResultOnAWS: with the DropResultFormat parameter at csv, a sheet dropped into incoming/ gets a CSV result
// named after it: UTF-8 with a byte-order mark, the input's cells as read, then the result columns.
func TestCSVResultOnAWS(t *testing.T) {
	t.Parallel()
	e := newE2E(t, e2eOptions{rows: 12, env: map[string]string{"DROP_RESULT_FORMAT": "csv"}})
	up := e.upload("商品.xlsx", nil)
	if err := e.stack.Splitter.Handle(t.Context(), up); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	task := e.pump(e.taskID(up), 90*time.Second)
	if task.State != store.TaskSucceeded || task.ResultKey != "results/商品.result.csv" {
		t.Fatalf("task = %s, result %s", task.State, task.ResultKey)
	}
	text, ok := strings.CutPrefix(string(e.result(task.ResultKey)), "\uFEFF")
	lines := strings.Split(strings.TrimSuffix(text, "\r\n"), "\r\n")
	if !ok || len(lines) != 13 || !strings.HasPrefix(lines[0], strings.Join(lambdatest.Header, ",")+",output,status,") {
		t.Fatalf("result (%d lines):\n%s", len(lines), text)
	}
	for i, l := range lines[1:] {
		if !strings.HasPrefix(l, strings.Join(e2eRow(i+1, nil), ",")+",") || !strings.Contains(l, ",succeeded,") {
			t.Errorf("line %d = %s", i+2, l)
		}
	}
}
