package pipeline_test

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/export from the current export")

// goldenTask is a finished task with a row in every state the export shows: succeeded (fresh and cached),
// failed, skipped (blank), never started (the task was cancelled), and values that must stay text: formulas,
// leading zeros, long digit strings, escapes, line breaks, an input column named like a result column.
func goldenTask() (store.Task, []store.Row) {
	task := store.Task{
		ID: "golden0000000000000000000000000a", State: store.TaskExporting, Sheet: "商品",
		Header:    []string{"商品名称", "编号", "output"},
		RowsTotal: 7, BatchesTotal: 1, BatchesDone: 1,
		Spec: store.TaskSpec{Prompt: "为{{商品名称}}写一句文案", Provider: "sim", Model: "sim-1", BatchSize: 100},
	}
	rows := []store.Row{
		{No: 1, SheetRow: 2, Values: []string{"积木", "00123", "旧输出"},
			RowResult: store.RowResult{State: store.RowSucceeded, Output: "拼出想象力。", Attempts: 1, LatencyMS: 812,
				Provider: "sim/sim-1", Usage: store.Usage{InputTokens: 21, OutputTokens: 9}}},
		{No: 2, SheetRow: 3, Values: []string{"拼图", "12345678901234567890", ""},
			RowResult: store.RowResult{State: store.RowSucceeded, Output: "=SUM(A1:A2)", Attempts: 0, Cached: true}},
		{No: 3, SheetRow: 4, Values: []string{"多行\r\n名称", "_x000D_", ""},
			RowResult: store.RowResult{State: store.RowSucceeded, Output: "第一行\n第二行", Attempts: 2, LatencyMS: 1500,
				Provider: "bedrock/anthropic.claude-3-haiku-20240307-v1:0", Usage: store.Usage{InputTokens: 1200, OutputTokens: 34, CachedInputTokens: 1024}}},
		{No: 4, SheetRow: 5, Values: []string{"违规商品", "-5", ""},
			RowResult: store.RowResult{State: store.RowFailed, Error: "the provider refused the request (content filter)", ErrorClass: "content_filter", Attempts: 1, LatencyMS: 95}},
		{No: 5, SheetRow: 6, Values: []string{"", "", ""},
			RowResult: store.RowResult{State: store.RowSkipped}},
		{No: 6, SheetRow: 8, Values: []string{"@提及", "+86 138", ""},
			RowResult: store.RowResult{State: store.RowSucceeded, Output: "  前后空格  ", Attempts: 1, LatencyMS: 3}},
		{No: 7, SheetRow: 9, Values: []string{"未开始", "7", ""},
			RowResult: store.RowResult{State: store.RowPending}},
	}
	for i := range rows {
		rows[i].TaskID = task.ID
	}
	return task, rows
}

// exportGolden is what the golden file records about the result workbook.
type exportGolden struct {
	// Sheet and Dimension are the worksheet's name and declared range.
	Sheet     string
	Dimension string
	// CellTypes counts the cells by their t attribute: every cell is a string ("inlineStr").
	CellTypes map[string]int
	// Rows are the cells as batchgen's own reader reads them back, header first.
	Rows [][]string
}

// TestExportGolden exports a known task and compares the result workbook with testdata/export: the cells, the
// worksheet XML byte for byte, and its structure (name, range, column order, cell types). Run
// go test ./internal/pipeline -run TestExportGolden -update to regenerate after an intended change.
func TestExportGolden(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, pipeline.GeneratorConfig{})
	task, rows := goldenTask()
	if err := e.store.CreateTask(t.Context(), task); err != nil {
		t.Fatal(err)
	}
	if err := e.store.PutRows(t.Context(), rows); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := e.exporter.WriteResult(t.Context(), task, &buf); err != nil {
		t.Fatalf("WriteResult: %v", err)
	}
	sheetXML := worksheetXML(t, buf.Bytes())

	got := exportGolden{Sheet: task.Sheet, CellTypes: map[string]int{}}
	if m := regexp.MustCompile(`<dimension ref="([^"]*)"`).FindStringSubmatch(sheetXML); m != nil {
		got.Dimension = m[1]
	}
	typeAttr := regexp.MustCompile(`\st="([^"]*)"`)
	for _, tag := range regexp.MustCompile(`<c\s[^>]*>`).FindAllString(sheetXML, -1) {
		typ := "n" // ECMA-376's default: a number
		if m := typeAttr.FindStringSubmatch(tag); m != nil {
			typ = m[1]
		}
		got.CellTypes[typ]++
	}
	path := filepath.Join(t.TempDir(), "result.xlsx")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := sheet.Open(path, sheet.Options{})
	if err != nil {
		t.Fatalf("read the result back: %v", err)
	}
	defer r.Close()
	if r.Sheet() != task.Sheet {
		t.Errorf("sheet = %q, want %q", r.Sheet(), task.Sheet)
	}
	if p, ok := r.Prompt(); !ok || p != task.Spec.Prompt {
		t.Errorf("the result's prompt sheet holds %q (%v), want the task's template %q", p, ok, task.Spec.Prompt)
	}
	got.Rows = append(got.Rows, r.Header())
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got.Rows = append(got.Rows, rec.Values)
	}

	const dir = "testdata/export"
	cellsFile, xmlFile := filepath.Join(dir, "golden.json"), filepath.Join(dir, "golden.sheet.xml")
	gotJSON, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	gotJSON = append(gotJSON, '\n')
	if *update {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{cellsFile: gotJSON, xmlFile: []byte(sheetXML)} {
			if err := os.WriteFile(name, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	var want exportGolden
	wantJSON, err := os.ReadFile(cellsFile)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/pipeline -run TestExportGolden -update)", err)
	}
	if err := json.Unmarshal(wantJSON, &want); err != nil {
		t.Fatalf("%s: %v", cellsFile, err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("result workbook differs from %s (-want +got):\n%s", cellsFile, diff)
	}
	wantXML, err := os.ReadFile(xmlFile)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(wantXML), sheetXML); diff != "" {
		t.Errorf("worksheet XML differs from %s (-want +got):\n%s", xmlFile, diff)
	}

	// What the golden files must say, whatever -update wrote: these are the export's promises.
	wantHeader := append([]string{"商品名称", "编号", "output"}, "batchgen_output", "status", "error", "error_class", "cached", "attempts", "latency_ms",
		"provider", "input_tokens", "output_tokens", "rerun", "batchgen_key")
	if diff := cmp.Diff(wantHeader, got.Rows[0]); diff != "" {
		t.Errorf("column order (-want +got):\n%s", diff)
	}
	if got.Dimension != "A1:O8" {
		t.Errorf("dimension = %q, want A1:O8 (15 columns, header and 7 rows)", got.Dimension)
	}
	// Text is inline text (never a shared string Excel could re-type, never a formula); the bookkeeping columns
	// are numbers and cached a boolean, so they sum and sort.
	for typ := range got.CellTypes {
		if typ != "inlineStr" && typ != "n" && typ != "b" {
			t.Errorf("cell types = %v, want inline strings, numbers and booleans only", got.CellTypes)
		}
	}
	if got.CellTypes["inlineStr"] == 0 || got.CellTypes["n"] == 0 || got.CellTypes["b"] == 0 {
		t.Errorf("cell types = %v, want text, numbers and booleans", got.CellTypes)
	}
	if len(got.Rows) != 1+len(rows) {
		t.Errorf("%d rows read back, want %d", len(got.Rows), 1+len(rows))
	}
}

// worksheetXML returns the result workbook's only worksheet part.
func worksheetXML(t *testing.T, data []byte) string {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	var body string
	for _, zf := range zr.File {
		if !strings.HasPrefix(zf.Name, "xl/worksheets/") {
			continue
		}
		parts = append(parts, zf.Name)
		if zf.Name != "xl/worksheets/sheet1.xml" {
			continue
		}
		rc, err := zf.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		body = string(b)
	}
	// The result sheet, then the prompt sheet that carries the template.
	if want := []string{"xl/worksheets/sheet1.xml", "xl/worksheets/sheet2.xml"}; !slices.Equal(parts, want) {
		t.Fatalf("worksheet parts %q, want %q", parts, want)
	}
	return body
}
