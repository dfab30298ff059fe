//go:build office

package sheet

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestOfficeReadsTheRoundTrip has two other spreadsheet programs read the results of the public workbooks: openpyxl
// (scripts/compare_workbooks.py) must find every original sheet and cell with its value, type and number format,
// first in the files themselves and then in the copies LibreOffice saved of input and result (headless convert), so
// that LibreOffice too reads the original cells of the result exactly as those of the input.
//
// It needs BATCHGEN_PYTHON (a Python with openpyxl: the project's virtualenv) and BATCHGEN_SOFFICE (LibreOffice);
// make test-office and scripts/test.sh install both.
func TestOfficeReadsTheRoundTrip(t *testing.T) {
	python, soffice := os.Getenv("BATCHGEN_PYTHON"), os.Getenv("BATCHGEN_SOFFICE")
	if python == "" || soffice == "" {
		t.Fatal("set BATCHGEN_PYTHON (with openpyxl) and BATCHGEN_SOFFICE (LibreOffice): make test-office does")
	}
	dir := t.TempDir()
	type pair struct {
		Name      string           `json:"name"`
		Input     string           `json:"input"`
		Result    string           `json:"result"`
		Sheet     string           `json:"sheet"`
		HeaderRow int              `json:"header_row"`
		Added     []string         `json:"added"`
		Overflow  []overflowAnswer `json:"overflow,omitempty"`
		// Prompt is the template an added prompt sheet holds in A1; empty when none is added.
		Prompt string `json:"prompt,omitempty"`
		// Dates are added date cells of the last added column, by sheet row, as ISO dates.
		Dates []addedDateCell `json:"dates,omitempty"`
	}
	var pairs []pair
	for _, sub := range []string{"in", "out", "lo/in", "lo/out"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A workbook with what the public ones lack together: dates, prices, formulas, merged cells, validation,
	// frozen panes, a defined name, a prompt sheet.
	rich := richWorkbook(t)
	richRows, err := readAddedBytes(t, rich)
	if err != nil {
		t.Fatal(err)
	}
	long := longAnswer(150_000) // too long for a cell: the answer goes to the overflow sheet
	richRows[1].Values[0] = Text(long)
	var richOut bytes.Buffer
	if err := AddColumns(bytes.NewReader(rich), int64(len(rich)), &richOut, AddColumnsParams{
		Sheet: "商品", HeaderRow: 1, Header: resultColumns, Rows: rowsOf(richRows), TempDir: dir, Dates: true}); err != nil {
		t.Fatal(err)
	}
	cases := append(publicRoundTrips(t), roundTripCase{name: "rich.xlsx", in: rich, out: richOut.Bytes(), sheet: "商品", headerRow: 1, header: resultColumns,
		rows: richRows})
	for _, c := range cases {
		p := pair{Name: c.name, Input: filepath.Join(dir, "in", c.name), Result: filepath.Join(dir, "out", c.name),
			Sheet: c.sheet, HeaderRow: c.headerRow, Added: c.header}
		if err := os.WriteFile(p.Input, c.in, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p.Result, c.out, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, r := range c.rows[:min(len(c.rows), 20)] {
			p.Dates = append(p.Dates, addedDateCell{Row: r.SheetRow, Date: addedDate(r.SheetRow).Format("2006-01-02")})
		}
		if c.name == "rich.xlsx" {
			p.Overflow = append(p.Overflow, overflowAnswer{richRows[1].SheetRow, "output", long})
		}
		if c.prompt != "" && !slices.ContainsFunc(openBook(t, c.in).GetSheetList(), func(s string) bool { return strings.EqualFold(s, "prompt") }) {
			p.Prompt = c.prompt
		}
		pairs = append(pairs, p)
	}
	compare := func(what string, pairs []pair) {
		t.Helper()
		file := filepath.Join(dir, what+".json")
		b, _ := json.Marshal(pairs)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(python, "../../scripts/compare_workbooks.py", file).CombinedOutput()
		t.Logf("%s:\n%s", what, out)
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	compare("openpyxl", pairs)

	// LibreOffice saves each input and result again as .xlsx: what it read is what it writes.
	profile := "-env:UserInstallation=file://" + filepath.Join(dir, "profile")
	for _, side := range []string{"in", "out"} {
		files, _ := filepath.Glob(filepath.Join(dir, side, "*.xlsx"))
		args := append([]string{profile, "--headless", "--convert-to", "xlsx", "--outdir", filepath.Join(dir, "lo", side)}, files...)
		cmd := exec.Command(soffice, args...)
		cmd.Env = append(os.Environ(), "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("libreoffice --convert-to xlsx: %v\n%s", err, out)
		}
	}
	var converted []pair
	for _, p := range pairs {
		q := p
		q.Input = filepath.Join(dir, "lo", "in", p.Name)
		q.Result = filepath.Join(dir, "lo", "out", p.Name)
		if _, err := os.Stat(q.Input); err != nil {
			t.Errorf("LibreOffice did not convert the input %s", p.Name)
			continue
		}
		if _, err := os.Stat(q.Result); err != nil {
			t.Errorf("LibreOffice did not convert the result of %s", p.Name)
			continue
		}
		converted = append(converted, q)
	}
	if len(converted) != len(pairs) {
		t.Fatalf("LibreOffice converted %d of %d pairs", len(converted), len(pairs))
	}
	compare("libreoffice", converted)
}

// addedDateCell is an added date cell for scripts/compare_workbooks.py to find as a date.
type addedDateCell struct {
	Row  int    `json:"row"`
	Date string `json:"date"`
}

// readAddedBytes is readAdded for a workbook in memory.
func readAddedBytes(t *testing.T, b []byte) ([]AddedRow, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "in.xlsx")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	rows, _, err := readAdded(file)
	return rows, err
}

// overflowAnswer is an answer a result holds in its overflow sheet, for scripts/compare_workbooks.py to find whole.
type overflowAnswer struct {
	Row    int    `json:"row"`
	Column string `json:"column"`
	Text   string `json:"text"`
}
