package sheet

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/unicode"
)

// readResult is everything a Reader exposes, for one cmp.Diff per case.
type readResult struct {
	Sheet     string
	Header    []string
	Prompt    string
	HasPrompt bool
	// Encoding is the text encoding of CSV input; "" in a want means "utf-8" for CSV (see withEncoding).
	Encoding string
	// Delimiter is the field separator of CSV input; "" in a want means "," for CSV (see withEncoding).
	Delimiter string
	Records   []Record
}

// withEncoding fills in the default encoding of a CSV want: "utf-8" unless the case says otherwise. xlsx input
// (which has a sheet) has none.
func (r readResult) withEncoding(csv bool) readResult {
	if csv && r.Encoding == "" {
		r.Encoding = EncodingUTF8
	}
	if csv && r.Delimiter == "" {
		r.Delimiter = ","
	}
	return r
}

// summary is what Validate must return for a file that reads as r.
func (r readResult) summary() Summary {
	return Summary{Sheet: r.Sheet, Header: r.Header, Encoding: r.Encoding, Delimiter: r.Delimiter, Rows: len(r.Records), Prompt: r.Prompt, HasPrompt: r.HasPrompt}
}

func encode(t *testing.T, enc interface{ Bytes([]byte) ([]byte, error) }, s string) []byte {
	t.Helper()
	b, err := enc.Bytes([]byte(s))
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}

func rec(row int, vals ...string) Record {
	return Record{SheetRow: row, Values: vals}
}

func blank(row, n int) Record {
	return Record{SheetRow: row, Values: make([]string, n), Blank: true}
}

func TestReadGoodInputs(t *testing.T) {
	t.Parallel()
	zh := "名称,价格,描述\r\n苹果,3,\"红色的,\r\n很甜\"\r\n\r\n香蕉,2,黄色\r\n,,\r\n"
	zhRecords := []Record{
		rec(2, "苹果", "3", "红色的,\n很甜"),
		blank(3, 3), // the empty line: encoding/csv skips it, the Reader keeps Excel's numbering
		rec(4, "香蕉", "2", "黄色"),
	}
	formulas := row(1, "数量", "单价", "合计", "标签") +
		`<row r="2"><c r="A2"><v>2</v></c><c r="B2"><v>3</v></c><c r="C2"><f>A2*B2</f><v>6</v></c>` +
		`<c r="D2" t="str"><f>A2&amp;"件"</f><v>2件</v></c></row>`

	cases := []struct {
		name string
		file string
		data func(t *testing.T) []byte
		opts Options
		want readResult
	}{
		{
			name: "utf8 bom crlf quoted newline blank lines",
			file: "商品.csv",
			data: func(t *testing.T) []byte { return append([]byte("\xEF\xBB\xBF"), zh...) },
			want: readResult{Header: []string{"名称", "价格", "描述"}, Records: zhRecords},
		},
		{
			name: "gb18030 csv",
			file: "gbk.csv",
			data: func(t *testing.T) []byte { return encode(t, simplifiedchinese.GB18030.NewEncoder(), zh) },
			want: readResult{Header: []string{"名称", "价格", "描述"}, Encoding: EncodingGB18030, Records: zhRecords},
		},
		{
			name: "utf16le tab separated (Excel unicode text)",
			file: "unicode.txt",
			data: func(t *testing.T) []byte {
				return encode(t, unicode.UTF16(unicode.LittleEndian, unicode.UseBOM).NewEncoder(), "名称\t价格\r\n苹果,红\t3\r\n")
			},
			want: readResult{Header: []string{"名称", "价格"}, Encoding: EncodingUTF16LE, Delimiter: "\t", Records: []Record{rec(2, "苹果,红", "3")}},
		},
		{
			name: "utf16be with bom",
			file: "be.csv",
			data: func(t *testing.T) []byte {
				return encode(t, unicode.UTF16(unicode.BigEndian, unicode.UseBOM).NewEncoder(), "a,b\n1,2\n")
			},
			want: readResult{Header: []string{"a", "b"}, Encoding: EncodingUTF16BE, Records: []Record{rec(2, "1", "2")}},
		},
		{
			name: "tsv by extension keeps commas in values",
			file: "data.tsv",
			data: func(t *testing.T) []byte { return []byte("a,b\tc\nx,y\tz\n") },
			want: readResult{Header: []string{"a,b", "c"}, Delimiter: "\t", Records: []Record{rec(2, "x,y", "z")}},
		},
		{
			name: "header trimmed, trailing blank header cells ignored, short rows padded",
			file: "pad.csv",
			data: func(t *testing.T) []byte { return []byte("\n  名称 , 价格 ,,\n苹果\n") },
			want: readResult{Header: []string{"名称", "价格"}, Records: []Record{rec(3, "苹果", "")}},
		},
		{
			name: "xlsx chinese, prompt sheet, blank middle rows, trailing blank rows",
			file: "商品.xlsx",
			data: func(t *testing.T) []byte {
				return buildXLSX(t,
					testSheet{name: "商品", rows: row(2, "名称", "类目") + row(3, "苹果", "水果") +
						row(4, " ", "") + row(6, "青菜", "蔬菜") + row(7, "") + row(9, " ")},
					testSheet{name: "PROMPT", rows: row(1, "  为商品{{名称}}写文案  ")})
			},
			want: readResult{Sheet: "商品", Header: []string{"名称", "类目"}, Prompt: "为商品{{名称}}写文案", HasPrompt: true,
				Records: []Record{rec(3, "苹果", "水果"), blank(4, 2), blank(5, 2), rec(6, "青菜", "蔬菜")}},
		},
		{
			name: "xlsx formulas give cached values",
			file: "f.xlsx",
			data: func(t *testing.T) []byte { return buildXLSX(t, testSheet{name: "Sheet1", rows: formulas}) },
			want: readResult{Sheet: "Sheet1", Header: []string{"数量", "单价", "合计", "标签"}, Records: []Record{rec(2, "2", "3", "6", "2件")}},
		},
		{
			name: "hidden first sheet and prompt are skipped by default",
			file: "hidden.xlsx",
			data: func(t *testing.T) []byte {
				return buildXLSX(t,
					testSheet{name: "prompt", rows: row(1, "")},
					testSheet{name: "旧数据", state: "hidden", rows: row(1, "old") + row(2, "x")},
					testSheet{name: "新数据", rows: row(1, "new") + row(2, "y")})
			},
			want: readResult{Sheet: "新数据", Header: []string{"new"}, Records: []Record{rec(2, "y")}},
		},
		{
			name: "options select a hidden sheet case-insensitively",
			file: "pick.xlsx",
			data: func(t *testing.T) []byte {
				return buildXLSX(t,
					testSheet{name: "Main", rows: row(1, "a") + row(2, "1")},
					testSheet{name: "Extra", state: "hidden", rows: row(1, "b") + row(2, "2")})
			},
			opts: Options{Sheet: "extra"},
			want: readResult{Sheet: "Extra", Header: []string{"b"}, Records: []Record{rec(2, "2")}},
		},
		{
			name: "cells beyond the header that are blank are fine",
			file: "wide.csv",
			data: func(t *testing.T) []byte { return []byte("a,b\n1,2,, \n") },
			want: readResult{Header: []string{"a", "b"}, Records: []Record{rec(2, "1", "2")}},
		},
		{
			name: "display name decides tsv",
			file: "upload-1234",
			data: func(t *testing.T) []byte { return []byte("a\tb\n1\t2\n") },
			opts: Options{DisplayName: "x.tsv"},
			want: readResult{Header: []string{"a", "b"}, Delimiter: "\t", Records: []Record{rec(2, "1", "2")}},
		},
		{
			name: "csv content in a file named xlsx is read as csv",
			file: "really.xlsx",
			data: func(t *testing.T) []byte { return []byte("a\n1\n") },
			want: readResult{Header: []string{"a"}, Records: []Record{rec(2, "1")}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, t.TempDir(), c.file, c.data(t))
			r, err := Open(path, c.opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer r.Close()
			got := readResult{Sheet: r.Sheet(), Header: r.Header(), Encoding: r.Encoding(), Delimiter: r.Delimiter()}
			got.Prompt, got.HasPrompt = r.Prompt()
			got.Records = readAll(t, r)
			want := c.want.withEncoding(r.Sheet() == "")
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("read (-want +got):\n%s", diff)
			}
			if _, err := r.Next(); !errors.Is(err, io.EOF) {
				t.Errorf("Next after EOF = %v, want io.EOF again", err)
			}
			if err := r.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}

			sum, err := Validate(path, c.opts)
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			wantSum := want.summary()
			if diff := cmp.Diff(wantSum, sum); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReadFormattedValues checks that cells come back as the user sees them (number formats applied), not as the
// raw stored numbers.
func TestReadFormattedValues(t *testing.T) {
	t.Parallel()
	f := excelize.NewFile()
	defer f.Close()
	pct, err := f.NewStyle(&excelize.Style{NumFmt: 10}) // 0.00%
	if err != nil {
		t.Fatal(err)
	}
	thousands, err := f.NewStyle(&excelize.Style{NumFmt: 4}) // #,##0.00
	if err != nil {
		t.Fatal(err)
	}
	for cell, v := range map[string]any{"A1": "折扣", "B1": "价格", "A2": 0.125, "B2": 1234.5} {
		if err := f.SetCellValue("Sheet1", cell, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.SetCellStyle("Sheet1", "A2", "A2", pct); err != nil {
		t.Fatal(err)
	}
	if err := f.SetCellStyle("Sheet1", "B2", "B2", thousands); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fmt.xlsx")
	if err := f.SaveAs(path); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if diff := cmp.Diff([]Record{rec(2, "12.50%", "1,234.50")}, readAll(t, r)); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// TestNextStopsAtFirstBadRow checks that rows before a bad one are returned, then the *InputError, and that the
// error is sticky.
func TestNextStopsAtFirstBadRow(t *testing.T) {
	t.Parallel()
	path := writeFile(t, t.TempDir(), "x.csv", []byte("a\n1\n2\n3\x00\n4\n"))
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var rows []int
	var gotErr error
	for {
		rec, err := r.Next()
		if err != nil {
			gotErr = err
			break
		}
		rows = append(rows, rec.SheetRow)
	}
	if diff := cmp.Diff([]int{2, 3}, rows); diff != "" {
		t.Errorf("rows before the error (-want +got):\n%s", diff)
	}
	var ie *InputError
	if !errors.As(gotErr, &ie) || ie.Row != 4 || ie.Column != "A" || ie.Header != "a" {
		t.Fatalf("error = %#v, want *InputError at row 4 column A", gotErr)
	}
	if _, err := r.Next(); err != gotErr {
		t.Errorf("second Next = %v, want the same error", err)
	}
}

func TestMaxRowsCountsBlankMiddleRowsButNotTrailing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		data    string
		wantErr string
	}{
		{name: "three rows with a blank one fit", data: "a\n1\n,\n3\n\n\n,\n"},
		{name: "a fourth row does not", data: "a\n1\n\n3\n4\n", wantErr: "x.csv: row 5: too many data rows: the limit is 3 (configurable)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, t.TempDir(), "x.csv", []byte(c.data))
			_, err := Validate(path, Options{Limits: Limits{MaxRows: 3}})
			got := ""
			if err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(c.wantErr, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOpenMissingFileIsNotInputError(t *testing.T) {
	t.Parallel()
	_, err := Open(filepath.Join(t.TempDir(), "nope.csv"), Options{})
	var ie *InputError
	if err == nil || errors.As(err, &ie) {
		t.Fatalf("err = %v, want a plain I/O error", err)
	}
	if !strings.Contains(err.Error(), `open spreadsheet "nope.csv"`) {
		t.Errorf("err = %v, want context naming the file", err)
	}
}

func TestColumnName(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]string{0: "", 1: "A", 26: "Z", 27: "AA", 52: "AZ", 703: "AAA", 16384: "XFD", 16385: "XFE"} {
		if got := ColumnName(n); got != want {
			t.Errorf("ColumnName(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 bytes", 1023: "1023 bytes", 1024: "1 KiB", 1536: "1.5 KiB", 100 << 20: "100 MiB", 1 << 30: "1 GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestFormulasWithoutCachedResults: a workbook a program wrote (openpyxl, a report generator) holds formulas but no
// results for them. The reader computes what excelize's calculator can and says, by column, what it computed and
// what it could not; a cell it could not compute reads as "".
func TestFormulasWithoutCachedResults(t *testing.T) {
	t.Parallel()
	rows := `<row r="1"><c r="A1" t="inlineStr"><is><t>数量</t></is></c><c r="B1" t="inlineStr"><is><t>两倍</t></is></c>` +
		`<c r="C1" t="inlineStr"><is><t>未知</t></is></c><c r="D1" t="inlineStr"><is><t>合计</t></is></c></row>` +
		`<row r="2"><c r="A2"><v>2</v></c><c r="B2"><f>A2*2</f></c><c r="C2"><f>NOSUCHFUNCTION(A2)</f></c><c r="D2"><f>SUM(A2:B2)</f></c></row>` +
		`<row r="3"><c r="A3"><v>5</v></c><c r="B3"><f>A3*2</f></c><c r="C3"><f>NOSUCHFUNCTION(A3)</f></c></row>`
	path := filepath.Join(t.TempDir(), "generated.xlsx")
	if err := os.WriteFile(path, buildXLSX(t, testSheet{name: "Sheet1", rows: rows}), 0o600); err != nil {
		t.Fatal(err)
	}
	sum, err := Validate(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []UncachedColumn{{Column: 2, Computed: 2}, {Column: 3, NotComputed: 2, FirstNotComputed: 2}, {Column: 4, Computed: 1}}
	if diff := cmp.Diff(want, sum.Uncached); diff != "" {
		t.Errorf("Uncached (-want +got):\n%s", diff)
	}
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := readAll(t, r)
	wantRows := []Record{rec(2, "2", "4", "", "6"), rec(3, "5", "10", "", "")}
	if diff := cmp.Diff(wantRows, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// TestChartSheetIsNeverTheDefault: a workbook whose first sheet is a chart sheet (Excel's "Move chart to a new
// sheet") is read from its first worksheet, not refused as a sheet without a header.
func TestChartSheetIsNeverTheDefault(t *testing.T) {
	t.Parallel()
	const main = `http://schemas.openxmlformats.org/spreadsheetml/2006/main`
	const rels = `http://schemas.openxmlformats.org/officeDocument/2006/relationships`
	data := buildZip(t,
		zipEntry{name: "[Content_Types].xml", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/><Override PartName="/xl/chartsheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.chartsheet+xml"/><Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/></Types>`)},
		zipEntry{name: "_rels/.rels", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="` + rels + `/officeDocument" Target="xl/workbook.xml"/></Relationships>`)},
		zipEntry{name: "xl/workbook.xml", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><workbook xmlns="` + main + `" xmlns:r="` + rels + `"><sheets><sheet name="Chart1" sheetId="2" r:id="rId2"/><sheet name="数据" sheetId="1" r:id="rId1"/></sheets></workbook>`)},
		zipEntry{name: "xl/_rels/workbook.xml.rels", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId2" Type="` + rels + `/chartsheet" Target="chartsheets/sheet1.xml"/><Relationship Id="rId1" Type="` + rels + `/worksheet" Target="worksheets/sheet1.xml"/></Relationships>`)},
		zipEntry{name: "xl/chartsheets/sheet1.xml", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><chartsheet xmlns="` + main + `"><sheetViews><sheetView workbookViewId="0"/></sheetViews></chartsheet>`)},
		zipEntry{name: "xl/worksheets/sheet1.xml", data: []byte(`<?xml version="1.0" encoding="UTF-8"?><worksheet xmlns="` + main + `"><sheetData>` +
			`<row r="1"><c r="A1" t="inlineStr"><is><t>名称</t></is></c></row><row r="2"><c r="A2" t="inlineStr"><is><t>积木</t></is></c></row></sheetData></worksheet>`)},
	)
	path := filepath.Join(t.TempDir(), "chart_first.xlsx")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum, err := Validate(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Sheet != "数据" || sum.Rows != 1 {
		t.Errorf("read sheet %q with %d rows, want 数据 with 1", sum.Sheet, sum.Rows)
	}
}
