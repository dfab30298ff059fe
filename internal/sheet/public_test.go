package sheet

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"
)

// publicModules are Go modules whose test documents are workbooks other programs wrote: Excel for Windows and for
// Mac, LibreOffice, Google Sheets, Numbers, WPS and Tencent Office (testdata/README.md lists them). They come
// from the Go module proxy, checked against the hashes pinned here, so the tests read exactly these files without
// the repository carrying them.
var publicModules = []struct{ path, version, sum, dir string }{
	{"github.com/tealeg/xlsx/v3", "v3.3.13", "h1:Zk1Stj11MGRnOYI1st6av/Z2lIXp/jFZomrSWSeJLmY=", "testdocs"},
	{"github.com/thedatashed/xlsxreader", "v1.2.8", "h1:8aGbkXIPEThQbA8KzUZqIa4v4oqFrJFKLQ36vWePI5U=", "test"},
	{"github.com/xuri/excelize/v2", "v2.11.1", "h1:tm/FVufArvfUiJXJtGv8jna/zZS1t9Uji2ImsnS9iBo=", "test"},
}

var (
	publicOnce  sync.Once
	publicFiles []string
	publicErr   error
)

// publicWorkbooks returns the .xlsx files of publicModules, downloading the modules into the module cache the first
// time (go mod download, which checks the proxy's copy against the checksum database).
func publicWorkbooks(t testing.TB) []string {
	t.Helper()
	publicOnce.Do(func() {
		for _, m := range publicModules {
			cmd := exec.Command("go", "mod", "download", "-json", m.path+"@"+m.version)
			cmd.Dir = os.TempDir() // outside this module: go.mod and go.sum stay as they are
			out, err := cmd.Output()
			var info struct{ Dir, Sum, Error string }
			if jerr := json.Unmarshal(out, &info); err != nil || jerr != nil || info.Error != "" {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					err = errors.New(string(ee.Stderr))
				}
				publicErr = errors.Join(publicErr, errors.New("go mod download "+m.path+"@"+m.version+": "+info.Error), err, jerr)
				continue
			}
			if m.sum != "" && info.Sum != m.sum {
				publicErr = errors.Join(publicErr, errors.New(m.path+"@"+m.version+" has hash "+info.Sum+", pinned "+m.sum))
				continue
			}
			files, _ := filepath.Glob(filepath.Join(info.Dir, m.dir, "*.xlsx"))
			for _, f := range files {
				// The two sheets of 7 and 11 MB stand for size, which the bench measures; here they would only
				// take half a minute.
				if fi, err := os.Stat(f); err == nil && fi.Size() < 2<<20 {
					publicFiles = append(publicFiles, f)
				}
			}
		}
	})
	if publicErr != nil {
		t.Fatalf("public workbooks: %v", publicErr)
	}
	if dir := os.Getenv("BATCHGEN_MORE_WORKBOOKS"); dir != "" {
		// Workbooks of one's own (a user's file that came back wrong) checked the same way.
		more, _ := filepath.Glob(filepath.Join(dir, "*.xlsx"))
		return append(slices.Clone(publicFiles), more...)
	}
	if len(publicFiles) < 35 {
		t.Fatalf("only %d public workbooks", len(publicFiles))
	}
	return publicFiles
}

// roundTripCase is one public workbook the pipeline accepts, with the result AddColumns made of it.
type roundTripCase struct {
	name      string
	in, out   []byte
	sheet     string
	headerRow int
	header    []string
	// prompt is the template the result carries in its prompt sheet, one added when the input has none.
	prompt string
	// rows are the added cells.
	rows []AddedRow
}

// roundTripPrompt is the template the public workbooks' results carry: several lines, characters XML escapes.
const roundTripPrompt = "为{{名称}}写一段文案 <b> & \"引号\"\n第二行"

// resultColumns stand for the pipeline's added columns: text, a number, a boolean and a date.
var resultColumns = []string{"output", "status", "attempts", "cached", "launched"}

// addedDate is the date readAdded puts in a row's launched cell: one that differs row by row, so a misplaced cell
// shows.
func addedDate(sheetRow int) time.Time {
	return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, sheetRow%400)
}

// publicRoundTrips runs AddColumns over every public workbook the reader accepts, as an export would.
func publicRoundTrips(t *testing.T) []roundTripCase {
	t.Helper()
	var cases []roundTripCase
	rejected := 0
	for _, file := range publicWorkbooks(t) {
		rows, sheetName, err := readAdded(file)
		if err != nil {
			rejected++ // the split refuses it; no export ever reads it
			if testing.Verbose() {
				t.Logf("rejected: %v", err)
			}
			continue
		}
		in, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		header := rows[0].SheetRow - 1
		err = AddColumns(bytes.NewReader(in), int64(len(in)), &out, AddColumnsParams{
			Sheet: sheetName, HeaderRow: header, Header: resultColumns, Rows: rowsOf(rows), Prompt: roundTripPrompt, Dates: true})
		if errors.Is(err, ErrMacroWorkbook) {
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(file), err)
			continue
		}
		cases = append(cases, roundTripCase{name: filepath.Base(file), in: in, out: out.Bytes(), sheet: sheetName, headerRow: header, header: resultColumns,
			prompt: roundTripPrompt, rows: rows})
	}
	t.Logf("%d public workbooks round-tripped, %d rejected by the reader", len(cases), rejected)
	if len(cases) < 12 {
		t.Fatalf("only %d public workbooks are accepted; the corpus shrank?", len(cases))
	}
	return cases
}

// readAdded reads a workbook as the splitter does and makes each data row's added cells: the answer quotes the
// row's first cell, so a misplaced cell shows.
func readAdded(file string) ([]AddedRow, string, error) {
	r, err := Open(file, Options{})
	if err != nil {
		return nil, "", err
	}
	defer r.Close()
	var rows []AddedRow
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return rows, r.Sheet(), nil
		}
		if err != nil {
			return nil, "", err
		}
		rows = append(rows, AddedRow{SheetRow: rec.SheetRow, Values: []Value{
			Text("answer to " + rec.Values[0]), Text("succeeded"), Int(int64(rec.SheetRow)), Bool(rec.SheetRow%2 == 0),
			Date(addedDate(rec.SheetRow))}})
	}
}

// TestAddColumnsOnPublicWorkbooks checks the result of every public workbook against its input with excelize: the
// same sheets, every other zip part byte for byte, every original cell with its value, formula, type and style, and
// the added header where it belongs.
func TestAddColumnsOnPublicWorkbooks(t *testing.T) {
	t.Parallel()
	for _, c := range publicRoundTrips(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			before, after := openBook(t, c.in), openBook(t, c.out)
			// A workbook without a prompt sheet gets one, last, carrying the template; the parts that declare the
			// sheets change with it.
			// The styles part gets the added dates' cell format.
			wantSheets, wantChanged, wantAdded := before.GetSheetList(), 2, 0
			if !slices.ContainsFunc(wantSheets, func(s string) bool { return strings.EqualFold(s, "prompt") }) {
				wantSheets, wantChanged, wantAdded = append(slices.Clone(wantSheets), "prompt"), 5, 1
				if v, _ := after.GetCellValue("prompt", "A1"); v != c.prompt {
					t.Errorf("prompt!A1 = %q, want %q", v, c.prompt)
				}
			}
			if got := after.GetSheetList(); !slices.Equal(got, wantSheets) {
				t.Errorf("sheets = %v, want %v", got, wantSheets)
			}
			inParts, outParts := zipParts(t, c.in), zipParts(t, c.out)
			changed := 0
			for name, raw := range inParts {
				if !bytes.Equal(raw, outParts[name]) {
					changed++
				}
			}
			if changed != wantChanged || len(outParts) != len(inParts)+wantAdded {
				t.Errorf("%d of %d parts changed (want %d), %d parts after", changed, len(inParts), wantChanged, len(outParts))
			}
			// The added header sits on the header row, right of every used column. (Read before any cell is looked
			// up: excelize then holds the sheet in memory and streams it by encoding it all again.)
			header := firstRows(t, after, c.sheet)
			for _, sh := range before.GetSheetList() {
				sameSheet(t, before, after, sh, c.sheet == sh)
			}
			got := header[c.headerRow-1]
			if len(got) < len(c.header) || !slices.Equal(got[len(got)-len(c.header):], c.header) {
				t.Errorf("header row %d = %q, want it to end with %q", c.headerRow, got, c.header)
			}
			// The added dates are date cells: a serial number that Excel shows as the ISO date.
			dateCol := len(got)
			for _, r := range c.rows[:min(len(c.rows), 20)] {
				ref, _ := excelize.CoordinatesToCellName(dateCol, r.SheetRow)
				want := addedDate(r.SheetRow).Format(time.DateOnly)
				if v, err := after.GetCellValue(c.sheet, ref); err != nil || v != want {
					t.Errorf("%s shows %q (%v), want %q", ref, v, err, want)
				}
				if typ, _ := after.GetCellType(c.sheet, ref); typ == excelize.CellTypeInlineString || typ == excelize.CellTypeSharedString {
					t.Errorf("%s is text, want a date cell", ref)
				}
			}
		})
	}
}

// sameSheet compares a sheet of two workbooks over its first 2,000 rows: every cell's raw value, and the first
// rows' formulas, types and styles cell by cell (excelize looks each up from the row's start, which under -race
// costs seconds a sheet); on the input sheet only the columns the input had (the result's are added beside them).
func sameSheet(t *testing.T, before, after *excelize.File, sh string, input bool) {
	t.Helper()
	want, got := firstRows(t, before, sh), firstRows(t, after, sh)
	if len(got) < len(want) {
		t.Fatalf("%s: %d rows, then %d", sh, len(want), len(got))
	}
	for r, row := range want {
		g := got[r]
		if !input && len(g) != len(row) || len(g) < len(row) || !slices.Equal(g[:len(row)], row) {
			t.Errorf("%s row %d: %q, then %q", sh, r+1, row, g)
		}
	}
	for r, row := range want[:min(len(want), 40)] {
		for col := range row[:min(len(row), 30)] {
			ref, _ := excelize.CoordinatesToCellName(col+1, r+1)
			sameCell(t, before, after, sh, ref)
		}
	}
}

// firstRows reads the raw values of a sheet's first 2,000 rows with excelize's iterator: GetRows would build every
// row up to the last, a million for a sheet whose last row is 1,048,576.
func firstRows(t *testing.T, f *excelize.File, sh string) [][]string {
	t.Helper()
	rows, err := f.Rows(sh)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out [][]string
	for len(out) < 2000 && rows.Next() {
		cols, err := rows.Columns(excelize.Options{RawCellValue: true})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, cols)
	}
	for len(out) > 0 && len(out[len(out)-1]) == 0 { // trailing empty rows are not rows
		out = out[:len(out)-1]
	}
	return out
}
