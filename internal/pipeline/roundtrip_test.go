package pipeline_test

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

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
// embedded adapters, then checks the result file gives back every input cell exactly as the reader returned it,
// and holds only text: no formulas, no numbers, nothing Excel would re-type (00123, =1+1, 1e5, TRUE, 2024-01-15).
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
			out := readContent(t, resultPath, sheet.Options{})
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
			assertAllText(t, data)
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

// xmlCell is a worksheet <c> element as stored, before any reader formats it.
type xmlCell struct {
	Ref     string    `xml:"r,attr"`
	Type    string    `xml:"t,attr"`
	Formula *struct{} `xml:"f"`
	Value   *string   `xml:"v"`
}

// assertAllText checks every cell of the result's worksheet is an inline string: no formula, no number, no shared
// string, no boolean, no date, so the text reaches whoever opens the file exactly as written.
func assertAllText(t *testing.T, data []byte) {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	var sheets []*zip.File
	for _, zf := range zr.File {
		if strings.HasPrefix(zf.Name, "xl/worksheets/") && strings.HasSuffix(zf.Name, ".xml") {
			sheets = append(sheets, zf)
		}
	}
	if len(sheets) != 1 {
		t.Fatalf("result has %d worksheets, want 1", len(sheets))
	}
	rc, err := sheets[0].Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	d := xml.NewDecoder(rc)
	cells, bad := 0, 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("result worksheet: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "c" {
			continue
		}
		var c xmlCell
		if err := d.DecodeElement(&c, &se); err != nil {
			t.Fatalf("result cell: %v", err)
		}
		cells++
		if c.Type != "inlineStr" || c.Formula != nil || c.Value != nil {
			if bad++; bad <= 10 {
				t.Errorf("result cell %s is not plain text: %s", c.Ref, describe(c))
			}
		}
	}
	if cells == 0 {
		t.Fatal("result worksheet has no cells")
	}
}

func describe(c xmlCell) string {
	s := fmt.Sprintf("t=%q", c.Type)
	if c.Formula != nil {
		s += " with a formula"
	}
	if c.Value != nil {
		s += fmt.Sprintf(" <v>%s</v>", *c.Value)
	}
	return s
}
