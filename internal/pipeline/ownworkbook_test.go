package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// writeWorkbook saves a workbook as a user sends one: a styled sheet of products with prices, dates and a formula,
// the prompt sheet, and a sheet of notes.
func (e *env) writeWorkbook(name string, rows int) string {
	e.t.Helper()
	f := excelize.NewFile()
	defer f.Close()
	must := func(err error) {
		e.t.Helper()
		if err != nil {
			e.t.Fatal(err)
		}
	}
	must(f.SetSheetName("Sheet1", "商品"))
	price, err := f.NewStyle(&excelize.Style{NumFmt: 4})
	must(err)
	date, err := f.NewStyle(&excelize.Style{NumFmt: 14})
	must(err)
	must(f.SetSheetRow("商品", "A1", &[]any{"名称", "价格", "上架", "小计"}))
	for i := 2; i <= rows+1; i++ {
		must(f.SetSheetRow("商品", fmt.Sprintf("A%d", i), &[]any{fmt.Sprintf("积木%d", i), float64(i) + 0.5, time.Date(2024, 1, i%28+1, 0, 0, 0, 0, time.UTC)}))
		must(f.SetCellFormula("商品", fmt.Sprintf("D%d", i), fmt.Sprintf("B%d*2", i)))
		must(f.SetCellValue("商品", fmt.Sprintf("D%d", i), (float64(i)+0.5)*2))
		must(f.SetCellStyle("商品", fmt.Sprintf("B%d", i), fmt.Sprintf("B%d", i), price))
		must(f.SetCellStyle("商品", fmt.Sprintf("C%d", i), fmt.Sprintf("C%d", i), date))
	}
	_, err = f.NewSheet("prompt")
	must(err)
	must(f.SetCellValue("prompt", "A1", "为{{名称}}写一句文案"))
	_, err = f.NewSheet("备注")
	must(err)
	must(f.SetCellValue("备注", "A1", "内部使用"))
	path := filepath.Join(e.dir, name)
	must(f.SaveAs(path))
	return path
}

func TestExportReturnsTheUserWorkbook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{Concurrency: 4})
	path := e.writeWorkbook("商品.xlsx", 5)
	spec := store.TaskSpec{Provider: "sim", Model: "sim-1", BatchSize: 2} // the prompt sheet's template
	id := pipeline.DeriveTaskID("own", spec)
	if _, err := e.splitter.Split(ctx, pipeline.SplitParams{TaskID: id, Path: path, Source: "商品.xlsx", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	done := e.runToCompletion(ctx, id)
	if done.State != store.TaskSucceeded {
		t.Fatalf("state = %s", done.State)
	}
	got, err := excelize.OpenReader(bytes.NewReader(resultBytes(t, e, done)))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	want, err := excelize.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()

	if s := got.GetSheetList(); !slices.Equal(s, []string{"商品", "prompt", "备注"}) {
		t.Errorf("sheets = %v, want the input's three", s)
	}
	if v, _ := got.GetCellValue("prompt", "A1"); v != "为{{名称}}写一句文案" {
		t.Errorf("prompt!A1 = %q", v)
	}
	for _, ref := range []string{"B2", "C2", "D2", "D6"} {
		for _, read := range []func(*excelize.File) (string, error){
			func(f *excelize.File) (string, error) { return f.GetCellValue("商品", ref) },
			func(f *excelize.File) (string, error) { return f.GetCellFormula("商品", ref) },
			func(f *excelize.File) (string, error) {
				s, err := f.GetCellStyle("商品", ref)
				return fmt.Sprint(s), err
			},
		} {
			a, _ := read(want)
			b, _ := read(got)
			if a != b {
				t.Errorf("商品!%s: %q became %q", ref, a, b)
			}
		}
	}
	rows, err := got.GetRows("商品")
	if err != nil {
		t.Fatal(err)
	}
	if h := rows[0]; len(h) != 4+len(pipeline.ResultColumns) || h[4] != "output" || h[5] != "status" {
		t.Fatalf("header = %q", h)
	}
	for i, r := range rows[1:] {
		if !strings.Contains(r[4], r[0]) || r[5] != "succeeded" {
			t.Errorf("row %d: output %q status %q, want the answer to %q", i+2, r[4], r[5], r[0])
		}
	}
	if typ, _ := got.GetCellType("商品", "J2"); typ != excelize.CellTypeUnset { // attempts: a number
		t.Errorf("attempts cell type = %v, want a number", typ)
	}
}

// TestExportWithoutTheKeptInput: a task whose input copy is gone (split before inputs were kept) still exports, as
// a new workbook of the input sheet's values.
func TestExportWithoutTheKeptInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{Concurrency: 4})
	path := e.writeWorkbook("old.xlsx", 3)
	spec := store.TaskSpec{Provider: "sim", Model: "sim-1", BatchSize: 10}
	id := pipeline.DeriveTaskID("old", spec)
	if _, err := e.splitter.Split(ctx, pipeline.SplitParams{TaskID: id, Path: path, Source: "old.xlsx", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if err := e.blobs.Delete(ctx, pipeline.InputKey(id)); err != nil {
		t.Fatal(err)
	}
	done := e.runToCompletion(ctx, id)
	got, err := excelize.OpenReader(bytes.NewReader(resultBytes(t, e, done)))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if s := got.GetSheetList(); !slices.Equal(s, []string{"商品", "prompt"}) {
		t.Errorf("sheets = %v, want the input sheet and the prompt sheet that carries the template", s)
	}
	if v, _ := got.GetCellValue("prompt", "A1"); v != done.Spec.Prompt || v == "" {
		t.Errorf("prompt!A1 = %q, want the task's template %q", v, done.Spec.Prompt)
	}
	if v, _ := got.GetCellValue("商品", "E2"); !strings.Contains(v, "积木2") {
		t.Errorf("E2 = %q, want the answer to 积木2", v)
	}
}

// TestSplitRefusesASheetTheResultCannotWiden: a workbook whose header already reaches so far right that the result
// columns would pass Excel's last column is refused before any model call, naming the numbers.
func TestSplitRefusesASheetTheResultCannotWiden(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, pipeline.GeneratorConfig{})
	f := excelize.NewFile()
	defer f.Close()
	sw, err := f.NewStreamWriter("Sheet1")
	if err != nil {
		t.Fatal(err)
	}
	cols := 16_384 - len(pipeline.ResultColumns) + 1 // one column too many for the result columns
	header, data := make([]any, cols), make([]any, cols)
	for i := range header {
		header[i], data[i] = fmt.Sprintf("c%d", i+1), "x"
	}
	if err := sw.SetRow("A1", header); err != nil {
		t.Fatal(err)
	}
	if err := sw.SetRow("A2", data); err != nil {
		t.Fatal(err)
	}
	if err := sw.Flush(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(e.dir, "wide.xlsx")
	if err := f.SaveAs(path); err != nil {
		t.Fatal(err)
	}
	_, err = pipeline.Validate(pipeline.SplitParams{TaskID: "wide", Path: path, Source: "wide.xlsx", Spec: store.TaskSpec{Prompt: "{{c1}}"}})
	var rejected *pipeline.RejectedError
	if !errors.As(err, &rejected) || !strings.Contains(err.Error(), fmt.Sprintf(`sheet "Sheet1" has %d columns and the result adds %d`, cols, len(pipeline.ResultColumns))) || !strings.Contains(err.Error(), "XFD") {
		t.Fatalf("Validate = %v, want a rejection naming the columns", err)
	}
}

// TestValidateJudgesFormulasWithoutResults: a generated workbook's formulas without a saved result are computed
// and said in a note, and one the prompt needs but batchgen cannot compute refuses the input, naming the column.
func TestValidateJudgesFormulasWithoutResults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, pipeline.GeneratorConfig{})
	f := excelize.NewFile()
	defer f.Close()
	for ref, v := range map[string]string{"A1": "名称", "B1": "单价", "C1": "含税价", "D1": "备注"} {
		if err := f.SetCellStr("Sheet1", ref, v); err != nil {
			t.Fatal(err)
		}
	}
	for r := 2; r <= 4; r++ {
		_ = f.SetCellStr("Sheet1", fmt.Sprintf("A%d", r), fmt.Sprintf("积木%d", r))
		_ = f.SetCellInt("Sheet1", fmt.Sprintf("B%d", r), int64(r*10))
		// excelize saves formulas without a result, as openpyxl does.
		_ = f.SetCellFormula("Sheet1", fmt.Sprintf("C%d", r), fmt.Sprintf("B%d*1.13", r))
		_ = f.SetCellFormula("Sheet1", fmt.Sprintf("D%d", r), fmt.Sprintf("NOSUCHFUNCTION(A%d)", r))
	}
	path := filepath.Join(e.dir, "generated.xlsx")
	if err := f.SaveAs(path); err != nil {
		t.Fatal(err)
	}
	v, err := pipeline.Validate(pipeline.SplitParams{TaskID: "g", Path: path, Source: "generated.xlsx", Spec: store.TaskSpec{Prompt: "{{名称}} {{含税价}}"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`column "含税价" (C): 3 formulas with no saved result were computed by batchgen`,
		`column "备注" (D): 3 formulas with no saved result read as blank (batchgen cannot compute them; the prompt does not use the column)`,
	}
	if !slices.Equal(v.Notes, want) {
		t.Errorf("notes = %q, want %q", v.Notes, want)
	}
	_, err = pipeline.Validate(pipeline.SplitParams{TaskID: "g", Path: path, Source: "generated.xlsx", Spec: store.TaskSpec{Prompt: "{{名称}} {{备注}}"}})
	var rejected *pipeline.RejectedError
	if !errors.As(err, &rejected) || !strings.Contains(err.Error(), `column "备注" (D) has 3 formulas with no saved result, first in row 2, that batchgen cannot compute`) {
		t.Errorf("Validate with {{备注}} = %v, want a rejection naming column D", err)
	}
}

// TestSplitFromTheSpool: with Spool, Validate keeps the records it read and Split writes the rows from them, the
// sheet decoded once; the rows are the same as a split that reads the sheet again, and Close removes the spool.
func TestSplitFromTheSpool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, nil, pipeline.GeneratorConfig{})
	path := e.writeWorkbook("spool.xlsx", 40)
	spec := store.TaskSpec{Prompt: "{{名称}} {{价格}} {{上架}}", BatchSize: 7}
	var rows [2][]store.Row
	for i, spool := range []bool{false, true} {
		tmp := t.TempDir()
		p := pipeline.SplitParams{TaskID: fmt.Sprintf("spool-%v", spool), Path: path, Source: "spool.xlsx", Spec: spec, Spool: spool, TempDir: tmp}
		v, err := pipeline.Validate(p)
		if err != nil {
			t.Fatal(err)
		}
		if spooled, _ := os.ReadDir(tmp); len(spooled) != map[bool]int{false: 0, true: 1}[spool] {
			t.Errorf("spool %v: %d files in the temporary directory", spool, len(spooled))
		}
		p.Validated = &v
		task, err := e.splitter.Split(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("spool %v: %d files left after Close", spool, len(left))
		}
		got, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: task.ID})
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			got[i].TaskID = ""
		}
		rows[i] = got
	}
	if len(rows[0]) != 40 || !reflect.DeepEqual(rows[0], rows[1]) {
		t.Errorf("rows split from the spool differ from the sheet's (%d and %d rows)", len(rows[0]), len(rows[1]))
	}
}
