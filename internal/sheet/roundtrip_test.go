package sheet

import (
	"archive/zip"
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/xuri/excelize/v2"
)

// rowsOf feeds AddColumns from a slice.
func rowsOf(rows []AddedRow) func() (AddedRow, error) {
	return func() (AddedRow, error) {
		if len(rows) == 0 {
			return AddedRow{}, io.EOF
		}
		r := rows[0]
		rows = rows[1:]
		return r, nil
	}
}

// addColumns runs AddColumns over the workbook bytes in.
func addColumns(t testing.TB, in []byte, p AddColumnsParams) ([]byte, error) {
	t.Helper()
	var out bytes.Buffer
	err := AddColumns(bytes.NewReader(in), int64(len(in)), &out, p)
	return out.Bytes(), err
}

// richWorkbook is a workbook with what a user's file has: several sheets, a styled header, dates, prices with
// a number format, a formula, merged cells, data validation, frozen panes, column widths, an autofilter and a
// defined name.
func richWorkbook(t testing.TB) []byte {
	t.Helper()
	f := excelize.NewFile()
	defer f.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(f.SetSheetName("Sheet1", "商品"))
	bold, err := f.NewStyle(&excelize.Style{Font: &excelize.Font{Bold: true, Color: "FFFFFF"}, Fill: excelize.Fill{Type: "pattern", Pattern: 1, Color: []string{"4472C4"}}})
	must(err)
	price, err := f.NewStyle(&excelize.Style{NumFmt: 4}) // #,##0.00
	must(err)
	date, err := f.NewStyle(&excelize.Style{NumFmt: 14})
	must(err)
	must(f.SetSheetRow("商品", "A1", &[]any{"名称", "价格", "上架", "数量", "总价"}))
	must(f.SetCellStyle("商品", "A1", "E1", bold))
	for i := 2; i <= 4; i++ {
		must(f.SetSheetRow("商品", fmt.Sprintf("A%d", i), &[]any{fmt.Sprintf("积木%d", i), 12.5 * float64(i), time.Date(2024, 1, i, 0, 0, 0, 0, time.UTC), i}))
		must(f.SetCellFormula("商品", fmt.Sprintf("E%d", i), fmt.Sprintf("B%d*D%d", i, i)))
		must(f.SetCellValue("商品", fmt.Sprintf("E%d", i), 12.5*float64(i)*float64(i))) // cached value
		must(f.SetCellStyle("商品", fmt.Sprintf("B%d", i), fmt.Sprintf("B%d", i), price))
		must(f.SetCellStyle("商品", fmt.Sprintf("C%d", i), fmt.Sprintf("C%d", i), date))
	}
	// Row 5 is blank (the pipeline keeps it as a skipped row); row 6 holds merged cells.
	must(f.SetCellValue("商品", "A6", "合并"))
	must(f.MergeCell("商品", "A6", "B6"))
	must(f.SetColWidth("商品", "A", "A", 30))
	must(f.SetPanes("商品", &excelize.Panes{Freeze: true, YSplit: 1, TopLeftCell: "A2", ActivePane: "bottomLeft"}))
	dv := excelize.NewDataValidation(true)
	dv.SetSqref("D2:D100")
	must(dv.SetRange(0, 1000, excelize.DataValidationTypeWhole, excelize.DataValidationOperatorBetween))
	must(f.AddDataValidation("商品", dv))
	must(f.AutoFilter("商品", "A1:E4", nil))
	must(f.SetDefinedName(&excelize.DefinedName{Name: "prices", RefersTo: "商品!$B$2:$B$4"}))
	_, err = f.NewSheet("prompt")
	must(err)
	must(f.SetCellValue("prompt", "A1", "为{{名称}}写一句文案"))
	_, err = f.NewSheet("汇总")
	must(err)
	must(f.SetCellFormula("汇总", "A1", "SUM(商品!E2:E4)"))
	var buf bytes.Buffer
	must(f.Write(&buf))
	return buf.Bytes()
}

func TestAddColumnsKeepsTheWorkbook(t *testing.T) {
	in := richWorkbook(t)
	out, err := addColumns(t, in, AddColumnsParams{
		Sheet: "商品", HeaderRow: 1, Header: []string{"output", "status", "attempts", "cached"},
		Rows: rowsOf([]AddedRow{
			{SheetRow: 2, Values: []Value{Text("文案2"), Text("succeeded"), Int(1), Bool(false)}},
			{SheetRow: 3, Values: []Value{Text("=SUM(A1)"), Text("succeeded"), Int(2), Bool(true)}},
			{SheetRow: 4, Values: []Value{Text(" lead\nline "), Text("failed"), Int(3)}},
			{SheetRow: 5, Values: []Value{{}, Text("skipped"), Int(0)}},
			{SheetRow: 6, Values: []Value{Text("x"), Text("succeeded"), Number(1.5)}},
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	before, after := openBook(t, in), openBook(t, out)

	// Every other part is copied byte for byte.
	inZip, outZip := zipParts(t, in), zipParts(t, out)
	if len(inZip) != len(outZip) {
		t.Errorf("parts: %d in, %d out", len(inZip), len(outZip))
	}
	for name, raw := range inZip {
		if name == "xl/worksheets/sheet1.xml" {
			continue
		}
		if !bytes.Equal(raw, outZip[name]) {
			t.Errorf("part %s changed", name)
		}
	}

	// Every original cell keeps its value, formula and style.
	for _, sh := range before.GetSheetList() {
		rows, err := before.GetRows(sh)
		if err != nil {
			t.Fatal(err)
		}
		for r, row := range rows {
			for c := range row {
				ref, _ := excelize.CoordinatesToCellName(c+1, r+1)
				sameCell(t, before, after, sh, ref)
			}
		}
	}
	if got, want := after.GetSheetList(), before.GetSheetList(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("sheets = %v, want %v", got, want)
	}

	// The added columns start right of the used ones (E), the header styled like the input's header.
	cell := func(ref string) string {
		v, err := after.GetCellValue("商品", ref)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for ref, want := range map[string]string{"F1": "output", "I1": "cached", "F2": "文案2", "F3": "=SUM(A1)", "F4": " lead\nline ",
		"H2": "1", "I2": "FALSE", "I3": "TRUE", "G5": "skipped", "F5": "", "H6": "1.5"} {
		if got := cell(ref); got != want {
			t.Errorf("%s = %q, want %q", ref, got, want)
		}
	}
	if f, _ := after.GetCellFormula("商品", "F3"); f != "" {
		t.Errorf("F3 is a formula %q; answers are text", f)
	}
	for ref, want := range map[string]excelize.CellType{"F2": excelize.CellTypeInlineString, "H2": excelize.CellTypeUnset, "I2": excelize.CellTypeBool} {
		if got, _ := after.GetCellType("商品", ref); got != want {
			t.Errorf("type of %s = %v, want %v", ref, got, want)
		}
	}
	hs, _ := after.GetCellStyle("商品", "E1")
	if got, _ := after.GetCellStyle("商品", "F1"); got != hs || hs == 0 {
		t.Errorf("header style of F1 = %d, want the header's %d", got, hs)
	}
	if w, _ := after.GetColWidth("商品", "A"); w != 30 {
		t.Errorf("width of A = %v, want the input's 30", w)
	}
	if w, _ := after.GetColWidth("商品", "F"); w < minColumnWidth {
		t.Errorf("width of F = %v", w)
	}
	if panes, _ := after.GetPanes("商品"); !panes.Freeze || panes.YSplit != 1 {
		t.Errorf("panes = %+v, want the input's frozen header", panes)
	}
	if dim, _ := after.GetSheetDimension("商品"); dim != "A1:I6" {
		t.Errorf("dimension = %q, want A1:I6", dim)
	}
	if m, _ := after.GetMergeCells("商品"); len(m) != 1 || m[0].GetStartAxis() != "A6" {
		t.Errorf("merged cells = %v", m)
	}
	if dvs, _ := after.GetDataValidations("商品"); len(dvs) != 1 {
		t.Errorf("data validations = %d, want 1", len(dvs))
	}
}

// sameCell fails when the cell at ref differs in value, formula, type or style between two workbooks.
func sameCell(t *testing.T, a, b *excelize.File, sh, ref string) {
	t.Helper()
	for _, get := range []struct {
		what string
		f    func(*excelize.File) (any, error)
	}{
		{"value", func(f *excelize.File) (any, error) {
			return f.GetCellValue(sh, ref, excelize.Options{RawCellValue: true})
		}},
		{"formula", func(f *excelize.File) (any, error) { return f.GetCellFormula(sh, ref) }},
		{"type", func(f *excelize.File) (any, error) { return f.GetCellType(sh, ref) }},
		{"style", func(f *excelize.File) (any, error) { return f.GetCellStyle(sh, ref) }},
	} {
		x, errA := get.f(a)
		y, errB := get.f(b)
		if errA != nil || errB != nil || x != y {
			t.Errorf("%s!%s %s: %v, then %v (%v, %v)", sh, ref, get.what, x, y, errA, errB)
		}
	}
}

// zipParts maps each part to its stored (compressed) bytes and header fields that matter.
func zipParts(t testing.TB, b []byte) map[string][]byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, f := range zr.File {
		rc, err := f.OpenRaw()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		out[f.Name] = append([]byte(fmt.Sprintf("%d %x %d|", f.Method, f.CRC32, f.UncompressedSize64)), raw...)
	}
	return out
}

// oneSheetBook builds a minimal workbook whose one sheet has the given worksheet XML.
func oneSheetBook(t testing.TB, worksheet string) []byte {
	t.Helper()
	return buildZip(t,
		zipEntry{name: "[Content_Types].xml", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/><Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/></Types>`)},
		zipEntry{name: "_rels/.rels", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/></Relationships>`)},
		zipEntry{name: "xl/workbook.xml", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets><sheet name="S" sheetId="1" r:id="rId1"/></sheets></workbook>`)},
		zipEntry{name: "xl/_rels/workbook.xml.rels", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/></Relationships>`)},
		zipEntry{name: "xl/worksheets/sheet1.xml", data: []byte(worksheet)},
	)
}

// TestAddColumnsSheetXML pins the rewrite of the sheet XML shapes other programs write.
func TestAddColumnsSheetXML(t *testing.T) {
	const ns = `xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"`
	tests := []struct {
		name, in, want string
		rows           []AddedRow
	}{{
		name: "rows without r, cells without r, spans dropped",
		in:   `<worksheet ` + ns + `><dimension ref="A1:B3"/><sheetData><row spans="1:2"><c t="inlineStr"><is><t>h</t></is></c><c t="inlineStr"><is><t>g</t></is></c></row><row><c><v>1</v></c></row><row r="3"><c r="B3"><v>2</v></c></row></sheetData></worksheet>`,
		rows: []AddedRow{{SheetRow: 2, Values: []Value{Text("a")}}, {SheetRow: 3, Values: []Value{Text("b")}}},
		want: `<worksheet ` + ns + `><dimension ref="A1:C3"/><cols><col min="3" max="3" width="8" customWidth="1"/></cols><sheetData><row><c t="inlineStr"><is><t>h</t></is></c><c t="inlineStr"><is><t>g</t></is></c><c r="C1" t="inlineStr"><is><t>out</t></is></c></row><row><c><v>1</v></c><c r="C2" t="inlineStr"><is><t>a</t></is></c></row><row r="3"><c r="B3"><v>2</v></c><c r="C3" t="inlineStr"><is><t>b</t></is></c></row></sheetData></worksheet>`,
	}, {
		name: "a prefixed namespace, a blank row without an element, a self-closed row",
		in:   `<x:worksheet xmlns:x="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><x:sheetData><x:row r="1"><x:c r="A1" s="3"><x:v>0</x:v></x:c></x:row><x:row r="2"><x:c r="A2"><x:v>1</x:v></x:c></x:row><x:row r="4" ht="20"/><x:row r="5"><x:c r="A5"><x:v>2</x:v></x:c></x:row></x:sheetData></x:worksheet>`,
		rows: []AddedRow{{SheetRow: 2, Values: []Value{Int(1)}}, {SheetRow: 3, Values: []Value{Int(2)}}, {SheetRow: 4, Values: []Value{Int(3)}}, {SheetRow: 5, Values: []Value{Bool(true)}}},
		want: `<x:worksheet xmlns:x="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><x:cols><x:col min="2" max="2" width="8" customWidth="1"/></x:cols><x:sheetData><x:row r="1"><x:c r="A1" s="3"><x:v>0</x:v></x:c><x:c r="B1" s="3" t="inlineStr"><x:is><x:t>out</x:t></x:is></x:c></x:row><x:row r="2"><x:c r="A2"><x:v>1</x:v></x:c><x:c r="B2"><x:v>1</x:v></x:c></x:row><x:row r="3"><x:c r="B3"><x:v>2</x:v></x:c></x:row><x:row r="4" ht="20"><x:c r="B4"><x:v>3</x:v></x:c></x:row><x:row r="5"><x:c r="A5"><x:v>2</x:v></x:c><x:c r="B5" t="b"><x:v>1</x:v></x:c></x:row></x:sheetData></x:worksheet>`,
	}, {
		name: "LibreOffice's column range and empty styled cells where the added ones go",
		in:   `<worksheet ` + ns + `><cols><col min="1" max="1024" width="11.5" style="2" customWidth="false"/></cols><sheetData><row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" s="2"/><c r="C1" s="2"></c><c r="D1" s="4"/></row><row r="2"><c r="A2"><v>5</v></c><c r="B2" s="2"/></row></sheetData></worksheet>`,
		rows: []AddedRow{{SheetRow: 2, Values: []Value{Text("a"), Text("b")}}},
		want: `<worksheet ` + ns + `><cols><col min="1" max="1" width="11.5" style="2" customWidth="false"/><col min="2" max="2" width="8" customWidth="1"/><col min="3" max="3" width="8" customWidth="1"/><col min="4" max="1024" width="11.5" style="2" customWidth="false"/></cols><sheetData><row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="inlineStr"><is><t>out</t></is></c><c r="C1" t="inlineStr"><is><t>out2</t></is></c><c r="D1" s="4"/></row><row r="2"><c r="A2"><v>5</v></c><c r="B2" t="inlineStr"><is><t>a</t></is></c><c r="C2" t="inlineStr"><is><t>b</t></is></c></row></sheetData></worksheet>`,
	}, {
		name: "a merged range and a formula reach further than the header",
		in:   `<worksheet ` + ns + `><sheetData><row r="1"><c r="A1"><v>1</v></c></row><row r="2"><c r="A2"><v>1</v></c><c r="C2"><f>A2*2</f></c></row></sheetData><mergeCells count="1"><mergeCell ref="A1:D1"/></mergeCells></worksheet>`,
		rows: []AddedRow{{SheetRow: 2, Values: []Value{Text("<&>")}}},
		want: `<worksheet ` + ns + `><cols><col min="5" max="5" width="8" customWidth="1"/></cols><sheetData><row r="1"><c r="A1"><v>1</v></c><c r="E1" t="inlineStr"><is><t>out</t></is></c></row><row r="2"><c r="A2"><v>1</v></c><c r="C2"><f>A2*2</f></c><c r="E2" t="inlineStr"><is><t>&lt;&amp;&gt;</t></is></c></row></sheetData><mergeCells count="1"><mergeCell ref="A1:D1"/></mergeCells></worksheet>`,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			header := []string{"out", "out2"}[:len(tc.rows[0].Values)]
			out, err := addColumns(t, oneSheetBook(t, tc.in), AddColumnsParams{Sheet: "S", HeaderRow: 1, Header: header, Rows: rowsOf(tc.rows)})
			if err != nil {
				t.Fatal(err)
			}
			if got := sheetXML(t, out); got != tc.want {
				t.Errorf("sheet XML:\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestAddColumnsRefuses(t *testing.T) {
	const ns = `xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"`
	full := oneSheetBook(t, `<worksheet `+ns+`><sheetData><row r="1"><c r="A1"><v>1</v></c><c r="XFC1"><v>1</v></c></row><row r="2"><c r="A2"><v>1</v></c></row></sheetData></worksheet>`)
	rows := []AddedRow{{SheetRow: 2, Values: []Value{Text("a")}}}
	if _, err := addColumns(t, full, AddColumnsParams{Sheet: "S", HeaderRow: 1, Header: []string{"a", "b"}, Rows: rowsOf(rows)}); err == nil || !strings.Contains(err.Error(), "XFD") {
		t.Errorf("a sheet at the last column: %v", err)
	}
	if _, err := addColumns(t, full, AddColumnsParams{Sheet: "T", HeaderRow: 1, Header: []string{"a"}, Rows: rowsOf(rows)}); err == nil || !strings.Contains(err.Error(), `no sheet named "T"`) {
		t.Errorf("a missing sheet: %v", err)
	}
	book := oneSheetBook(t, `<worksheet `+ns+`><sheetData><row r="1"><c r="A1"><v>1</v></c></row><row r="3"><c r="A3"><v>1</v></c></row></sheetData></worksheet>`)
	back := []AddedRow{{SheetRow: 3, Values: []Value{Text("a")}}, {SheetRow: 2, Values: []Value{Text("b")}}}
	if _, err := addColumns(t, book, AddColumnsParams{Sheet: "S", HeaderRow: 1, Header: []string{"a"}, Rows: rowsOf(back)}); err == nil || !strings.Contains(err.Error(), "sheet row 2 come after row 3") {
		t.Errorf("rows out of order: %v", err)
	}
	failing := func() (AddedRow, error) { return AddedRow{}, errors.New("store down") }
	if _, err := addColumns(t, book, AddColumnsParams{Sheet: "S", HeaderRow: 1, Header: []string{"a"}, Rows: failing}); err == nil || !strings.Contains(err.Error(), "store down") {
		t.Errorf("a failing row source: %v", err)
	}
}

// TestAddColumnsOnTheCorpus runs the rewrite over every workbook of the test corpus and checks that excelize reads
// each original cell the same afterwards.
func TestAddColumnsOnTheCorpus(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("testdata/*/*.xlsx")
	if len(files) < 10 {
		t.Fatalf("only %d corpus workbooks", len(files))
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			added, sheetName, err := readAdded(file)
			if err != nil {
				return // a workbook the reader rejects never reaches an export
			}
			in, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			out, err := addColumns(t, in, AddColumnsParams{Sheet: sheetName, HeaderRow: added[0].SheetRow - 1, Header: resultColumns, Rows: rowsOf(added), Dates: true})
			if errors.Is(err, ErrMacroWorkbook) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// excelize holds a sheet in memory to look cells up: the 8 MiB zip-bomb-ratio sheet, which only stands
			// for size, took 20 s of the package's minute under -race. Its result is still read back below.
			if unzipped(t, in) < 4<<20 {
				before, after := openBook(t, in), openBook(t, out)
				for _, sh := range before.GetSheetList() {
					sameSheet(t, before, after, sh, sh == sheetName)
				}
			}
			// The result reads again, with the added columns.
			check := filepath.Join(t.TempDir(), "result.xlsx")
			if err := os.WriteFile(check, out, 0o600); err != nil {
				t.Fatal(err)
			}
			rr, err := Open(check, Options{Sheet: sheetName})
			if err != nil {
				t.Fatalf("the result does not read: %v", err)
			}
			defer rr.Close()
			if h := rr.Header(); len(h) < len(resultColumns) || !slices.Equal(h[len(h)-len(resultColumns):], resultColumns) {
				t.Errorf("result header = %q, want it to end with %q", h, resultColumns)
			}
			// The added dates read back as the dates they are, in 1904-based workbooks too.
			for i := 0; i < 50; i++ {
				rec, err := rr.Next()
				if err != nil {
					break
				}
				want := addedDate(rec.SheetRow).Format(time.DateOnly)
				if got := rec.Values[len(rec.Values)-1]; got != want {
					t.Errorf("row %d: the added date reads %q, want %q", rec.SheetRow, got, want)
					break
				}
			}
		})
	}
}

// longAnswer is an answer longer than a cell holds, with characters of one, two and (an emoji) four bytes, two
// UTF-16 units, so that every cut is checked at a character boundary.
func longAnswer(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "第%d段 answer 😀 ", i)
	}
	return b.String()
}

// overflowText joins the parts of sheet row's answer in column from the overflow sheet.
func overflowText(t *testing.T, f *excelize.File, sheetRow int, column string) string {
	t.Helper()
	rows, err := f.GetRows(OverflowSheet)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 || !slices.Equal(rows[0], []string{"row", "column", "part", "text"}) {
		t.Fatalf("overflow header = %q", rows[:min(len(rows), 1)])
	}
	var b strings.Builder
	part := 0
	for _, r := range rows[1:] {
		if r[0] == fmt.Sprint(sheetRow) && r[1] == column {
			part++
			if r[2] != fmt.Sprint(part) {
				t.Errorf("part %s, want %d", r[2], part)
			}
			b.WriteString(r[3])
		}
	}
	return b.String()
}

func TestAddColumnsOverflow(t *testing.T) {
	in := richWorkbook(t)
	long := longAnswer(150_000) // 110,580 UTF-16 units: four overflow rows
	out, err := addColumns(t, in, AddColumnsParams{
		Sheet: "商品", HeaderRow: 1, Header: []string{"output", "status"}, TempDir: t.TempDir(),
		Rows: rowsOf([]AddedRow{
			{SheetRow: 2, Values: []Value{Text("short"), Text("succeeded")}},
			{SheetRow: 3, Values: []Value{Text(long), Text("succeeded")}},
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	f := openBook(t, out)
	if got := f.GetSheetList(); !slices.Equal(got, []string{"商品", "prompt", "汇总", OverflowSheet}) {
		t.Fatalf("sheets = %q, want the input's and %s", got, OverflowSheet)
	}
	if got := overflowText(t, f, 3, "output"); got != long {
		t.Errorf("the overflow sheet holds %d bytes of the answer, want all %d", len(got), len(long))
	}
	cell, _ := f.GetCellValue("商品", "F3")
	if n := len(utf16.Encode([]rune(cell))); n > MaxCellChars || !strings.HasPrefix(long, strings.SplitN(cell, " … [", 2)[0]) ||
		!strings.Contains(cell, "the whole answer is in sheet batchgen_overflow, rows 2 to 5]") {
		t.Errorf("F3 (%d units) = …%q, want the answer's beginning and where the rest is", n, cell[max(0, len(cell)-120):])
	}
	if v, _ := f.GetCellValue("商品", "F2"); v != "short" {
		t.Errorf("F2 = %q", v)
	}
	// Sent back in (a rerun of the result), the workbook already has the sheet: the next is numbered.
	again, err := addColumns(t, out, AddColumnsParams{
		Sheet: "商品", HeaderRow: 1, Header: []string{"output2"}, TempDir: t.TempDir(),
		Rows: rowsOf([]AddedRow{{SheetRow: 2, Values: []Value{Text(long)}}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := openBook(t, again).GetSheetList(); !slices.Equal(got, []string{"商品", "prompt", "汇总", OverflowSheet, OverflowSheet + "2"}) {
		t.Errorf("sheets = %q", got)
	}
}

// FuzzAddColumns feeds AddColumns arbitrary worksheet XML: it must never panic, and when the input sheet is
// well-formed XML its output sheet must be too, holding every added header cell.
func FuzzAddColumns(f *testing.F) {
	const ns = `xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"`
	for _, seed := range []string{
		`<worksheet ` + ns + `><sheetData><row r="1"><c r="A1"><v>1</v></c></row><row r="2"><c r="A2"><v>2</v></c></row></sheetData></worksheet>`,
		`<x:worksheet xmlns:x="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><x:cols><x:col min="1" max="1024" width="9"/></x:cols><x:sheetData><x:row r="1"><x:c r="A1" t="inlineStr"><x:is><x:t>a&gt;b</x:t></x:is></x:c></x:row><x:row r="3"/></x:sheetData></x:worksheet>`,
		`<?xml version="1.0"?><!-- a > b --><worksheet ` + ns + `><dimension ref="A1"/><sheetData><row><c t="s"><v>0</v></c><c r="C1" s="2"/></row><row><c><f>A1*2</f></c></row></sheetData><mergeCells><mergeCell ref="A1:B1"/></mergeCells></worksheet>`,
		`<worksheet ` + ns + `><sheetData/></worksheet>`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, worksheet string) {
		in := oneSheetBook(t, worksheet)
		rows := []AddedRow{{SheetRow: 2, Values: []Value{Text("answer <&>"), Int(3)}}, {SheetRow: 4, Values: []Value{Bool(true)}}}
		out, err := addColumns(t, in, AddColumnsParams{Sheet: "S", HeaderRow: 1, Header: []string{"output", "n"}, Rows: rowsOf(rows), TempDir: t.TempDir()})
		if err != nil || !wellFormed(worksheet) {
			return
		}
		got := sheetXML(t, out)
		if !wellFormed(got) {
			t.Fatalf("well-formed sheet in, malformed out:\n in %s\nout %s", worksheet, got)
		}
		if strings.Count(got, ">output<") != 1 {
			t.Fatalf("the added header is not in the sheet once:\n%s", got)
		}
	})
}

// wellFormed reports whether s parses as XML to its end.
func wellFormed(s string) bool {
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// unzipped is the sum of a zip's uncompressed sizes.
func unzipped(t *testing.T, b []byte) uint64 {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range zr.File {
		n += f.UncompressedSize64
	}
	return n
}

// TestAddColumnsCarriesThePrompt: a workbook without a prompt sheet gets one carrying the template, after an
// overflow sheet added in the same result; both are declared, and the reader reads the template back. A workbook
// with a prompt sheet of its own keeps it as it is.
func TestAddColumnsCarriesThePrompt(t *testing.T) {
	t.Parallel()
	const ns = `xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"`
	in := oneSheetBook(t, `<worksheet `+ns+`><sheetData><row r="1"><c r="A1" t="inlineStr"><is><t>名称</t></is></c></row>`+
		`<row r="2"><c r="A2" t="inlineStr"><is><t>积木</t></is></c></row></sheetData></worksheet>`)
	const prompt = "为{{名称}}写文案 <&>\n第二行"
	long := longAnswer(150_000)
	out, err := addColumns(t, in, AddColumnsParams{Sheet: "S", HeaderRow: 1, Header: []string{"output"}, TempDir: t.TempDir(), Prompt: prompt,
		Rows: rowsOf([]AddedRow{{SheetRow: 2, Values: []Value{Text(long)}}})})
	if err != nil {
		t.Fatal(err)
	}
	f := openBook(t, out)
	if got := f.GetSheetList(); !slices.Equal(got, []string{"S", OverflowSheet, "prompt"}) {
		t.Fatalf("sheets = %q", got)
	}
	if got := overflowText(t, f, 2, "output"); got != long {
		t.Errorf("the overflow sheet holds %d bytes, want %d", len(got), len(long))
	}
	path := filepath.Join(t.TempDir(), "result.xlsx")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, ok := r.Prompt(); !ok || got != prompt || r.Sheet() != "S" {
		t.Errorf("read back: sheet %q, prompt %q (%v), want S and %q", r.Sheet(), got, ok, prompt)
	}

	// The rich workbook has a prompt sheet: it stays the only one, unchanged.
	rich := richWorkbook(t)
	out, err = addColumns(t, rich, AddColumnsParams{Sheet: "商品", HeaderRow: 1, Header: []string{"output"}, Prompt: "another {{x}}",
		Rows: rowsOf([]AddedRow{{SheetRow: 2, Values: []Value{Text("a")}}})})
	if err != nil {
		t.Fatal(err)
	}
	before, after := openBook(t, rich), openBook(t, out)
	if !slices.Equal(after.GetSheetList(), before.GetSheetList()) {
		t.Errorf("sheets %q became %q", before.GetSheetList(), after.GetSheetList())
	}
	a, _ := before.GetCellValue("prompt", "A1")
	b, _ := after.GetCellValue("prompt", "A1")
	if a != b {
		t.Errorf("the workbook's own prompt %q became %q", a, b)
	}
}

// TestAddColumnsAtLastRowSkipsTheScan: rewriting a result's own columns with the last row given writes the same
// workbook as finding the rows' end by the first pass.
func TestAddColumnsAtLastRowSkipsTheScan(t *testing.T) {
	t.Parallel()
	in := richWorkbook(t)
	path := filepath.Join(t.TempDir(), "rich.xlsx")
	if err := os.WriteFile(path, in, 0o600); err != nil {
		t.Fatal(err)
	}
	rows, _, err := readAdded(path)
	if err != nil {
		t.Fatal(err)
	}
	result, err := addColumns(t, in, AddColumnsParams{Sheet: "商品", HeaderRow: 1, Header: resultColumns, Rows: rowsOf(rows)})
	if err != nil {
		t.Fatal(err)
	}
	header := firstRows(t, openBook(t, result), "商品")[0]
	at := slices.Index(header, resultColumns[0]) + 1
	again := func(lastRow int) []byte {
		out, err := addColumns(t, result, AddColumnsParams{Sheet: "商品", HeaderRow: 1, Header: resultColumns, Rows: rowsOf(rows), At: at, LastRow: lastRow})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	scanned, given := again(0), again(rows[len(rows)-1].SheetRow)
	if sheetXML(t, scanned) != sheetXML(t, given) {
		t.Errorf("the sheet rewritten with LastRow differs from the one the first pass sized:\n%s\n%s", sheetXML(t, scanned), sheetXML(t, given))
	}
}
