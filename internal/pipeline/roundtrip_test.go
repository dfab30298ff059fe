package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// oddDir is internal/sheet's corpus of inputs that are valid but unusual: formulas and external links, 10,000
// columns, merged cells, hidden sheets, rich text, odd number formats, the 1904 date system, a last row of
// 1,048,576, CSV with BOM/CRLF/lone CR, headers with spaces, case and width variants, text that looks like numbers.
const oddDir = "../sheet/testdata/odd"

// moreSheets lists, per corpus file, the sheets to run besides the default one.
var moreSheets = map[string][]string{"hidden_sheets.xlsx": {"旧数据", "机密"}}

// sheetContent is what the sheet reader returns for an input.
type sheetContent struct {
	Header []string
	Rows   [][]string
}

func readContent(t *testing.T, path string, opts sheet.Options) sheetContent {
	t.Helper()
	r, err := sheet.Open(path, opts)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer r.Close()
	c := sheetContent{Header: r.Header()}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return c
		}
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		c.Rows = append(c.Rows, rec.Values)
	}
}

// TestOddInputsRoundTrip runs every valid odd input through split, generate (sim provider) and export with the
// embedded adapters, then checks the result file gives back every input cell exactly as the reader returned it.
// A workbook comes back as itself (its cells untouched, so they read the same); a CSV comes back as a new workbook
// whose input cells hold only text: no formulas, no numbers, nothing Excel would re-type (00123, =1+1, 1e5, TRUE,
// 2024-01-15). The added columns hold text, numbers and a boolean, as ResultColumns says.
func TestOddInputsRoundTrip(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(oddDir)
	if err != nil {
		t.Fatal(err)
	}
	type run struct{ file, sheet string }
	var runs []run
	for _, e := range entries {
		runs = append(runs, run{file: e.Name()})
		for _, s := range moreSheets[e.Name()] {
			runs = append(runs, run{file: e.Name(), sheet: s})
		}
	}
	if len(runs) < 10 {
		t.Fatalf("only %d runs from %s; is the corpus there?", len(runs), oddDir)
	}
	for _, r := range runs {
		name := r.file
		if r.sheet != "" {
			name += "/" + r.sheet
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			path := filepath.Join(oddDir, r.file)
			in := readContent(t, path, sheet.Options{Sheet: r.sheet, DisplayName: r.file})

			e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{Concurrency: 4})
			spec := store.TaskSpec{Prompt: "为这一行写一句文案：{{" + in.Header[0] + "}}", Provider: "sim", Model: "sim-1", BatchSize: 2}
			id := pipeline.DeriveTaskID("roundtrip/"+name, spec)
			task, err := e.splitter.Split(ctx, pipeline.SplitParams{TaskID: id, Path: path, Source: r.file, Sheet: r.sheet, Spec: spec})
			if err != nil {
				t.Fatalf("split: %v", err)
			}
			if task.RowsTotal != len(in.Rows) {
				t.Fatalf("split made %d rows, the reader returned %d", task.RowsTotal, len(in.Rows))
			}
			done := e.runToCompletion(ctx, id)
			if done.State != store.TaskSucceeded {
				t.Fatalf("state = %s, want SUCCEEDED", done.State)
			}

			data := resultBytes(t, e, done)
			resultPath := filepath.Join(t.TempDir(), "result.xlsx")
			if err := os.WriteFile(resultPath, data, 0o600); err != nil {
				t.Fatal(err)
			}
			out := readContent(t, resultPath, sheet.Options{Sheet: r.sheet})
			n := len(in.Header)
			if len(out.Header) != n+len(pipeline.ResultColumns) {
				t.Fatalf("result has %d columns, want %d input + %d result", len(out.Header), n, len(pipeline.ResultColumns))
			}
			if diff := cmp.Diff(in.Header, out.Header[:n]); diff != "" {
				t.Errorf("input header in the result (-read +result):\n%s", diff)
			}
			got := make([][]string, len(out.Rows))
			for i, row := range out.Rows {
				got[i] = row[:n]
				if status := row[n+1]; status != "succeeded" && status != "skipped" {
					t.Errorf("result row %d has status %q", i+2, status)
				}
			}
			if diff := cmp.Diff(in.Rows, got); diff != "" {
				t.Errorf("input cells in the result (-read +result):\n%s", diff)
			}
			csv := done.Sheet == ""
			resultSheet := done.Sheet
			if csv {
				resultSheet = "result"
			}
			assertResultTypes(t, data, sheet.SanitizeSheetName(resultSheet), n, csv)
		})
	}
}

func resultBytes(t *testing.T, e *env, task store.Task) []byte {
	t.Helper()
	r, err := e.blobs.Open(context.Background(), task.ResultKey)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// assertResultTypes checks the cell types of the result sheet: the added columns (from inputCols on) hold text,
// booleans and numbers as ResultColumns says, never a formula; with inputText, so do the input columns, as inline
// text only.
func assertResultTypes(t *testing.T, data []byte, sheetName string, inputCols int, inputText bool) {
	t.Helper()
	f, err := excelize.OpenReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := f.GetRows(sheetName)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]excelize.CellType{"cached": excelize.CellTypeBool, "attempts": excelize.CellTypeUnset, "latency_ms": excelize.CellTypeUnset,
		"input_tokens": excelize.CellTypeUnset, "output_tokens": excelize.CellTypeUnset}
	merges, err := f.GetMergeCells(sheetName)
	if err != nil {
		t.Fatal(err)
	}
	merged := func(col, row int) bool { // excelize reads a merged range's cells as its top-left one
		for _, m := range merges {
			c1, r1, _ := excelize.CellNameToCoordinates(m.GetStartAxis())
			c2, r2, _ := excelize.CellNameToCoordinates(m.GetEndAxis())
			if c1 <= col && col <= c2 && r1 <= row && row <= r2 {
				return true
			}
		}
		return false
	}
	bad := 0
	for r, row := range rows {
		for c := range row {
			if merged(c+1, r+1) {
				continue
			}
			if c < inputCols && (!inputText || c >= 50) { // the first 50 columns stand for the 10,000 of the wide sheet
				continue
			}
			ref, _ := excelize.CoordinatesToCellName(c+1, r+1)
			typ, err := f.GetCellType(sheetName, ref)
			if err != nil {
				t.Fatal(err)
			}
			formula, _ := f.GetCellFormula(sheetName, ref)
			expect := excelize.CellTypeInlineString
			if c >= inputCols && r > 0 {
				if w, ok := want[pipeline.ResultColumns[c-inputCols]]; ok {
					expect = w
				}
			}
			if row[c] != "" && (typ != expect || formula != "") {
				if bad++; bad <= 10 {
					t.Errorf("result cell %s (%q) has type %v and formula %q, want type %v", ref, row[c], typ, formula, expect)
				}
			}
		}
	}
	if len(rows) < 2 {
		t.Fatal("result sheet has no data rows")
	}
}
