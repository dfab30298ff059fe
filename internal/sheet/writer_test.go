package sheet

import (
	"archive/zip"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"
)

// writeWorkbook writes header and rows with a Writer and returns the .xlsx bytes.
func writeWorkbook(t testing.TB, sheet string, header []string, rows [][]string) []byte {
	t.Helper()
	w, err := NewWriter(sheet, header)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	for _, r := range rows {
		if err := w.WriteRow(r); err != nil {
			t.Fatalf("WriteRow: %v", err)
		}
	}
	var buf bytes.Buffer
	n, err := w.WriteTo(&buf)
	if err != nil {
		t.Fatalf("WriteTo: %v", err)
	}
	if n != int64(buf.Len()) {
		t.Errorf("WriteTo returned %d, wrote %d bytes", n, buf.Len())
	}
	return buf.Bytes()
}

func openBook(t testing.TB, data []byte) *excelize.File {
	t.Helper()
	f, err := excelize.OpenReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("open written workbook: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// sheetXML returns the raw worksheet XML of the first sheet.
func sheetXML(t testing.TB, data []byte) string {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	for _, zf := range zr.File {
		if zf.Name == "xl/worksheets/sheet1.xml" {
			rc, err := zf.Open()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			b, err := io.ReadAll(rc)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
	t.Fatal("no xl/worksheets/sheet1.xml in the written workbook")
	return ""
}

var formulaLooking = []string{"=SUM(A1)", "+1", "-2", "@x", "=1+1", "=HYPERLINK(\"http://evil\",\"x\")", "0012", "1e5", "TRUE"}

func TestWriterStoresFormulaLookingTextAsText(t *testing.T) {
	t.Parallel()
	header := []string{"input", "output"}
	var rows [][]string
	for _, v := range formulaLooking {
		rows = append(rows, []string{v, v})
	}
	data := writeWorkbook(t, "结果", header, rows)
	f := openBook(t, data)
	for i, v := range formulaLooking {
		for col := 1; col <= 2; col++ {
			cell, _ := excelize.CoordinatesToCellName(col, i+2)
			formula, err := f.GetCellFormula("结果", cell)
			if err != nil || formula != "" {
				t.Errorf("%s formula = %q, %v; want none", cell, formula, err)
			}
			got, err := f.GetCellValue("结果", cell)
			if err != nil || got != v {
				t.Errorf("%s value = %q, %v; want %q", cell, got, err, v)
			}
			typ, err := f.GetCellType("结果", cell)
			if err != nil || typ != excelize.CellTypeInlineString {
				t.Errorf("%s type = %v, %v; want inline string", cell, typ, err)
			}
		}
	}
	if x := sheetXML(t, data); regexp.MustCompile(`<f[ >/]`).MatchString(x) {
		t.Errorf("worksheet XML has a formula element:\n%s", x)
	}
}

func TestWriterHeaderBoldFrozenAndWidths(t *testing.T) {
	t.Parallel()
	header := []string{"id", "商品名称", "output"}
	rows := [][]string{{"1", "苹果", strings.Repeat("很长的文案", 100)}}
	f := openBook(t, writeWorkbook(t, "Sheet1", header, rows))

	for _, cell := range []string{"A1", "B1", "C1"} {
		id, err := f.GetCellStyle("Sheet1", cell)
		if err != nil {
			t.Fatal(err)
		}
		st, err := f.GetStyle(id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Font == nil || !st.Font.Bold {
			t.Errorf("%s is not bold (style %d)", cell, id)
		}
	}
	if id, _ := f.GetCellStyle("Sheet1", "A2"); id != 0 {
		t.Errorf("A2 has style %d, want the default", id)
	}
	panes, err := f.GetPanes("Sheet1")
	if err != nil {
		t.Fatal(err)
	}
	if !panes.Freeze || panes.YSplit != 1 || panes.TopLeftCell != "A2" {
		t.Errorf("panes = %+v, want the header row frozen", panes)
	}
	var widths []float64
	for _, col := range []string{"A", "B", "C"} {
		wd, err := f.GetColWidth("Sheet1", col)
		if err != nil {
			t.Fatal(err)
		}
		widths = append(widths, wd)
	}
	// id: minimum; 商品名称: 4 wide characters + bold + padding; output: capped.
	if diff := cmp.Diff([]float64{minColumnWidth, 11, maxColumnWidth}, widths); diff != "" {
		t.Errorf("column widths (-want +got):\n%s", diff)
	}
}

func TestWriterStripsCharactersXMLCannotHold(t *testing.T) {
	t.Parallel()
	in := "a\x00b\x01c\x1Fd\te\nf\rg\uFFFEh\xFFi"
	want := "abcd\te\nf\rgh\uFFFDi"
	data := writeWorkbook(t, "Sheet1", []string{"h\x00"}, [][]string{{in}})
	f := openBook(t, data)
	got, err := f.GetCellValue("Sheet1", "A2")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("value (-want +got):\n%s", diff)
	}
	if h, _ := f.GetCellValue("Sheet1", "A1"); h != "h" {
		t.Errorf("header = %q, want %q", h, "h")
	}
}

func TestWriterErrors(t *testing.T) {
	t.Parallel()
	if _, err := NewWriter("x", nil); err == nil {
		t.Error("NewWriter with no header: want an error")
	}
	w, err := NewWriter("x", []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.WriteRow([]string{"1", "2"}); err == nil || !strings.Contains(err.Error(), "2 values for 1 columns") {
		t.Errorf("WriteRow with too many values = %v", err)
	}
	if _, err := w.WriteTo(io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteRow([]string{"1"}); !errors.Is(err, ErrWriterDone) {
		t.Errorf("WriteRow after WriteTo = %v, want ErrWriterDone", err)
	}
	if _, err := w.WriteTo(io.Discard); !errors.Is(err, ErrWriterDone) {
		t.Errorf("second WriteTo = %v, want ErrWriterDone", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestSanitizeSheetName(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"商品", "商品"},
		{"", "Sheet1"},
		{"   ", "Sheet1"},
		{"a[b]c:d*e?f/g\\h", "a_b_c_d_e_f_g_h"},
		{"'quoted'", "quoted"},
		{"history", "history_"},
		{"line\nbreak\x00", "line break"},
		{strings.Repeat("x", 40), strings.Repeat("x", 31)},
		{strings.Repeat("长", 40), strings.Repeat("长", 31)},
		{strings.Repeat("😀", 20), strings.Repeat("😀", 15)}, // two UTF-16 units each
		{strings.Repeat("x", 30) + "'y", strings.Repeat("x", 30)},
	}
	for _, c := range cases {
		got := SanitizeSheetName(c.in)
		if got != c.want {
			t.Errorf("SanitizeSheetName(%q) = %q, want %q", c.in, got, c.want)
		}
		f := excelize.NewFile()
		if got != "Sheet1" {
			if err := f.SetSheetName("Sheet1", got); err != nil {
				t.Errorf("excelize rejects sanitized name %q: %v", got, err)
			}
		}
		_ = f.Close()
	}
}

// TestRoundTrip writes with Writer and reads back with Reader: every value must come back identical.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	header := []string{"名称", "描述", "output", "status"}
	special := []string{
		"=SUM(A1)", "+1", "-2", "@x", "  leading and trailing  ", "多行\n文本\n", "crlf\r\nline", "tab\there",
		strings.Repeat("长文本", 10000), "_x0041_ stays literal", "<b>&amp;</b>", "emoji 😀", "0012", "3.14159",
	}
	var rows [][]string
	var want []Record
	for i := 0; i < 250; i++ { // past the width sample, so held and streamed rows are both covered
		v := special[i%len(special)]
		r := []string{fmt.Sprintf("商品%d", i), v, "为商品写的文案：" + v, "SUCCEEDED"}
		if i == 120 {
			r = []string{"", "", "", ""} // a blank row in the middle stays in place
		}
		if i == 121 {
			r = []string{"短"} // fewer values than the header
		}
		rows = append(rows, r)
		vals := append(append([]string(nil), r...), make([]string, len(header)-len(r))...)
		want = append(want, Record{SheetRow: i + 2, Values: vals, Blank: i == 120})
	}
	data := writeWorkbook(t, "结果/2024", header, rows)
	path := writeFile(t, t.TempDir(), "out.xlsx", data)
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Sheet() != "结果_2024" {
		t.Errorf("sheet = %q", r.Sheet())
	}
	if diff := cmp.Diff(header, r.Header()); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, readAll(t, r)); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

func TestWriterHeaderOnly(t *testing.T) {
	t.Parallel()
	data := writeWorkbook(t, "Sheet1", []string{"a", "b"}, nil)
	path := writeFile(t, t.TempDir(), "empty.xlsx", data)
	_, err := Validate(path, Options{})
	want := `empty.xlsx: sheet "Sheet1": the header row (row 1) has no data rows below it`
	if err == nil || err.Error() != want {
		t.Errorf("Validate = %v, want %q", err, want)
	}
}

// maxWriteRecorder records the largest single Write it receives.
type maxWriteRecorder struct {
	total, largest int
}

func (m *maxWriteRecorder) Write(p []byte) (int, error) {
	m.total += len(p)
	m.largest = max(m.largest, len(p))
	return len(p), nil
}

// TestWriterStreamsTheWorkbook checks that WriteTo streams the zip to its
// writer in small pieces instead of assembling the whole file in memory
// first, so export memory does not grow with the row count.
func TestWriterStreamsTheWorkbook(t *testing.T) {
	t.Parallel()
	w, err := NewWriter("result", []string{"id", "text"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Random text, so the zip really is large.
	rng := rand.New(rand.NewPCG(1, 2))
	raw := make([]byte, 192)
	// 22,000 rows make a workbook of about 4.6 MB, enough to tell streaming
	// (writes of the zip's own chunks) from buffering (one large write).
	for i := 0; i < 22000; i++ {
		for j := range raw {
			raw[j] = byte(rng.Uint32())
		}
		if err := w.WriteRow([]string{fmt.Sprint(i), base64.StdEncoding.EncodeToString(raw)}); err != nil {
			t.Fatal(err)
		}
	}
	var rec maxWriteRecorder
	n, err := w.WriteTo(&rec)
	if err != nil {
		t.Fatal(err)
	}
	if int(n) != rec.total {
		t.Errorf("WriteTo reported %d bytes, wrote %d", n, rec.total)
	}
	if rec.total < 4<<20 {
		t.Fatalf("workbook is only %d bytes; the test needs a large one", rec.total)
	}
	if rec.largest > 1<<20 {
		t.Errorf("largest single write %d bytes of %d: the workbook was buffered, not streamed", rec.largest, rec.total)
	}
}

// dimensionRef is the ref of the first worksheet's <dimension> element, read from the zip as a reader that trusts
// it (openpyxl in read-only mode) would.
func dimensionRef(t testing.TB, data []byte) string {
	t.Helper()
	m := regexp.MustCompile(`<dimension ref="([^"]*)"`).FindAllStringSubmatch(sheetXML(t, data), -1)
	if len(m) != 1 {
		t.Fatalf("worksheet has %d <dimension> elements, want 1", len(m))
	}
	return m[0][1]
}

// TestWriterDeclaresItsRange checks the result's <dimension> covers the header's columns and every row written,
// including rows held back for column widths and rows with fewer values than the header.
func TestWriterDeclaresItsRange(t *testing.T) {
	t.Parallel()
	rows := func(n int, vals ...string) [][]string {
		out := make([][]string, n)
		for i := range out {
			out[i] = vals
		}
		return out
	}
	cases := []struct {
		name   string
		header []string
		rows   [][]string
		want   string
	}{
		{"one cell", []string{"a"}, nil, "A1"},
		{"header only", []string{"a", "b"}, nil, "A1:B1"},
		{"one column", []string{"a"}, rows(3, "x"), "A1:A4"},
		{"held rows only", []string{"a", "b", "c"}, rows(5, "x", "y", "z"), "A1:C6"},
		{"past the width sample", []string{"a", "b", "c"}, rows(widthSampleRows+50, "x"), "A1:C151"},
		{"short and empty rows", []string{"a", "b", "c", "d"}, [][]string{{"x"}, {}, {"", "", "", ""}}, "A1:D4"},
		{"column AA", wideHeader()[:27], rows(2, "x"), "A1:AA3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			data := writeWorkbook(t, "Sheet1", c.header, c.rows)
			if got := dimensionRef(t, data); got != c.want {
				t.Errorf("dimension = %q, want %q", got, c.want)
			}
			// excelize reads the rewritten part like any other: the element did not break the XML.
			if got, err := openBook(t, data).GetSheetDimension("Sheet1"); err != nil || got != c.want {
				t.Errorf("excelize GetSheetDimension = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// TestWriterDeclaresItsRangeWhenStreaming checks the dimension of a workbook large enough that excelize streams the
// sheet from its temporary file in many pieces.
func TestWriterDeclaresItsRangeWhenStreaming(t *testing.T) {
	t.Parallel()
	const n = 20000
	w, err := NewWriter("result", []string{"id", "text", "more"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range n {
		if err := w.WriteRow([]string{fmt.Sprint(i), strings.Repeat("文本", 50)}); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if got, want := dimensionRef(t, buf.Bytes()), fmt.Sprintf("A1:C%d", n+1); got != want {
		t.Errorf("dimension = %q, want %q", got, want)
	}
}

// TestWriterMarksACutAnswer: the new workbook has no overflow sheet, so an answer past the cell limit is cut, and
// the cell says so.
func TestWriterMarksACutAnswer(t *testing.T) {
	long := longAnswer(150_000)
	data := writeWorkbook(t, "result", []string{"output"}, [][]string{{long}})
	f := openBook(t, data)
	v, err := f.GetCellValue("result", "A2")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(utf16.Encode([]rune(v))); n > MaxCellChars || !strings.HasSuffix(v, "… [cut at Excel's limit of 32767 characters a cell; the answer had 110580]") ||
		!strings.HasPrefix(long, strings.TrimSuffix(v, " … [cut at Excel's limit of 32767 characters a cell; the answer had 110580]")) {
		t.Errorf("A2 (%d units) ends %q", n, v[max(0, len(v)-100):])
	}
}
