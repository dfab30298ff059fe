package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// TestCSVResult: a task that asks for a CSV result gets one for CSV files that other programs wrote (Excel in
// Germany: Windows-1252 and semicolons; a public ISO-8859-1 file; Excel's "CSV UTF-8"; classic-Mac line ends; values
// that look like numbers, formulas and dates; a bare quote and a multi-line field). The result is UTF-8 with a
// byte-order mark, in the input's delimiter, and every input field reads back exactly as the input's own did,
// followed by the result columns; the result sent back in is recognised and costs no model call.
func TestCSVResult(t *testing.T) {
	t.Parallel()
	testdata := filepath.Join("..", "sheet", "testdata")
	cases := []struct {
		file      string
		delimiter string
		// fields are input fields as the result must hold them.
		fields []string
	}{
		{file: filepath.Join(testdata, "encodings", "excel_de_windows-1252.csv"), delimiter: ";"},
		{file: filepath.Join(testdata, "encodings", "public_basic_iso-8859-1_crlf.csv"), delimiter: ","},
		{file: filepath.Join(testdata, "encodings", "excel_utf8_bom.csv"), delimiter: ","},
		{file: filepath.Join(testdata, "odd", "lone_cr.csv"), delimiter: ","},
		{file: filepath.Join(testdata, "odd", "text_values.csv"), delimiter: ",",
			// Quotes the field needs are kept; those it does not ("00123") are dropped, as Excel's own CSV does:
			// they change nothing a reader sees.
			fields: []string{`00123`, `=SUM(A1:A2)`, `-5`, `@提及`, ` 前后空格 `, `"""带引号"""`, `'00123`}},
		{file: "bare-quote.tsv", delimiter: "\t", fields: []string{`"TV 40"" screen"`, "\"two\nlines\""}},
	}
	for _, c := range cases {
		t.Run(filepath.Base(c.file), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{Concurrency: 4})
			in := filepath.Join(e.dir, filepath.Base(c.file))
			if c.file == "bare-quote.tsv" {
				writeTestFile(t, in, "name\tnote\r\nTV 40\" screen\t\"two\nlines\"\r\n=1+1\tplain\r\n")
			} else {
				copyTestFile(t, c.file, in)
			}
			want := readSheetRows(t, in)
			first := want.header[0]
			spec := store.TaskSpec{Prompt: "{{" + first + "}}", Provider: "sim", Model: "sim-1", BatchSize: 7, ResultFormat: store.ResultCSV}
			task := e.runWorkbook(ctx, in, "csv "+c.file, spec)
			if task.Delimiter != c.delimiter || !strings.HasSuffix(task.ResultKey, ".csv") {
				t.Fatalf("task delimiter %q, result %s", task.Delimiter, task.ResultKey)
			}
			out := resultBytes(t, e, task)
			if !bytes.HasPrefix(out, []byte("\uFEFF")) || !utf8.Valid(out) {
				t.Fatalf("the result is not UTF-8 with a byte-order mark: % x", out[:min(len(out), 8)])
			}
			for _, f := range c.fields {
				if !bytes.Contains(out, []byte(c.delimiter+f+c.delimiter)) && !bytes.Contains(out, []byte("\n"+f+c.delimiter)) {
					t.Errorf("the input field %s is not in the result as it was", f)
				}
			}
			result := filepath.Join(e.dir, "result.csv")
			writeTestFile(t, result, string(out))
			got := readSheetRows(t, result)
			if got.delimiter != c.delimiter {
				t.Errorf("result delimiter %q, want the input's %q", got.delimiter, c.delimiter)
			}
			if wantHeader := append(slices.Clone(want.header), pipeline.ResultColumns...); !slices.Equal(got.header, wantHeader) {
				t.Fatalf("header = %q, want %q", got.header, wantHeader)
			}
			if len(got.rows) != len(want.rows) {
				t.Fatalf("%d result rows, want %d", len(got.rows), len(want.rows))
			}
			status := slices.Index(got.header, "status")
			for i, row := range got.rows {
				if !slices.Equal(row[:len(want.header)], want.rows[i]) {
					t.Errorf("row %d: input fields %q, want %q", i+2, row[:len(want.header)], want.rows[i])
				}
				if row[status] != "succeeded" {
					t.Errorf("row %d: status %q", i+2, row[status])
				}
			}

			// Sent back in, the CSV result is a result: every row is kept.
			v, err := pipeline.Validate(pipeline.SplitParams{TaskID: "again", Path: result, Source: "result.csv", Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			if v.Rerun == nil || v.Rerun.ToRun() != 0 || v.Rerun.Kept != task.RowsSucceeded {
				t.Errorf("sent back in: %+v, want all %d rows kept", v.Rerun, task.RowsSucceeded)
			}
		})
	}
}

// sheetRows is what the sheet reader makes of a file.
type sheetRows struct {
	header    []string
	delimiter string
	rows      [][]string
}

func readSheetRows(t *testing.T, path string) sheetRows {
	t.Helper()
	r, err := sheet.Open(path, sheet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out sheetRows
	out.header = slices.Clone(r.Header())
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(out.header))
		copy(row, rec.Values)
		out.rows = append(out.rows, row)
	}
	out.delimiter = r.Summary().Delimiter
	return out
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyTestFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, to, string(b))
}
