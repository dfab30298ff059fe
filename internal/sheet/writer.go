package sheet

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/xuri/excelize/v2"
	"golang.org/x/text/width"
)

// Column widths are estimated from the header and the first rows, because a stream writer must set them before
// the first row is written. The cap keeps one long answer from making a column screens wide.
//
// Only the first sizedColumns columns get a width; the rest keep Excel's default. excelize keeps one entry per
// sized column and scans them all for every cell it writes (and copies them all on every width set), so sizing
// every column of a 10,000-column sheet made the export quadratic in the column count: minutes for one row.
const (
	widthSampleRows = 100
	minColumnWidth  = 8
	maxColumnWidth  = 60
	sizedColumns    = 256
)

// Writer streams a result workbook: one sheet, a bold frozen header row, then rows, every cell written as a text
// string. Rows go to excelize's StreamWriter, which spills to a temporary file, so memory does not grow with the row
// count (excelize does hold the final compressed .xlsx in memory while WriteTo runs).
//
// Text is stored as inline strings, never as formulas or numbers: "=SUM(A1)", "+1", "-2" and "@x" read back as
// exactly that text. Characters XML 1.0 cannot hold (control characters other than tab, newline and carriage
// return; U+FFFE; U+FFFF) are stripped, invalid UTF-8 becomes U+FFFD, and a value beyond Excel's 32,767-character
// cell limit is cut, with a marker that says so and how long it was. A Writer is not safe for concurrent use.
type Writer struct {
	f       *excelize.File
	sw      *excelize.StreamWriter
	header  []string
	bold    int
	date    int       // the style of date cells (DateFormat)
	pending [][]Value // first rows, held until widths are known
	started bool
	row     int // last sheet row written
	done    bool
	prompt  string // the template for an added prompt sheet (SetPrompt)
	// promptRows go below it (SetPrompt).
	promptRows [][]string
}

// SetPrompt makes the workbook carry the template it was made with: a sheet named "prompt" with it in A1, after
// the result sheet, and rows below it from row 3 (a declaration of output columns), so the result sent back in is
// read with them (Reader.Prompt, Reader.PromptRows). A blank prompt adds none.
func (w *Writer) SetPrompt(prompt string, rows [][]string) { w.prompt, w.promptRows = prompt, rows }

// ErrWriterDone is returned by WriteRow and WriteTo after WriteTo has finished the workbook.
var ErrWriterDone = errors.New("result workbook already written")

// NewWriter starts a result workbook with one sheet named sheetName (sanitized with SanitizeSheetName) and the
// given header. The caller must Close the Writer to release its temporary files.
func NewWriter(sheetName string, header []string) (*Writer, error) {
	if len(header) == 0 {
		return nil, errors.New("new result workbook: header has no columns")
	}
	if len(header) > excelize.MaxColumns {
		return nil, fmt.Errorf("new result workbook: header has %d columns; Excel's limit is %d", len(header), excelize.MaxColumns)
	}
	name := SanitizeSheetName(sheetName)
	f := excelize.NewFile()
	w := &Writer{f: f}
	if name != f.GetSheetName(0) {
		if err := f.SetSheetName(f.GetSheetName(0), name); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("new result workbook: name sheet %q: %w", name, err)
		}
	}
	bold, err := f.NewStyle(&excelize.Style{Font: &excelize.Font{Bold: true}})
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("new result workbook: header style: %w", err)
	}
	dateFmt := DateFormat
	date, err := f.NewStyle(&excelize.Style{CustomNumFmt: &dateFmt})
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("new result workbook: date style: %w", err)
	}
	w.date = date
	sw, err := f.NewStreamWriter(name)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("new result workbook: stream sheet %q: %w", name, err)
	}
	w.sw, w.bold = sw, bold
	w.header = make([]string, len(header))
	for i, h := range header {
		w.header[i] = cleanText(h)
	}
	return w, nil
}

// WriteRow appends one row of text cells. Rows are written in call order; values may be fewer than the header (the
// rest stay empty) but not more.
func (w *Writer) WriteRow(values []string) error {
	cells := make([]Value, len(values))
	for i, v := range values {
		cells[i] = Text(v)
	}
	return w.WriteCells(cells)
}

// WriteCells appends one row whose cells may be numbers, booleans and dates as well as text, under the same rules
// as WriteRow.
func (w *Writer) WriteCells(values []Value) error {
	if w.done {
		return ErrWriterDone
	}
	if len(values) > len(w.header) {
		return fmt.Errorf("write result row %d: %d values for %d columns", w.row+len(w.pending)+1, len(values), len(w.header))
	}
	clean := make([]Value, len(values))
	for i, v := range values {
		if v.kind == textValue {
			v.text = fitCell(cleanText(v.text))
		}
		clean[i] = v
	}
	if !w.started {
		w.pending = append(w.pending, clean)
		if len(w.pending) < widthSampleRows {
			return nil
		}
		return w.start()
	}
	return w.writeRow(clean, nil)
}

// start fixes column widths and the frozen header, then writes the header and the held rows.
func (w *Writer) start() error {
	w.started = true
	widths := make([]int, min(len(w.header), sizedColumns))
	for i := range widths {
		widths[i] = displayWidth(w.header[i]) + 1 // bold text is a little wider
	}
	for _, row := range w.pending {
		for i, v := range row[:min(len(row), len(widths))] {
			widths[i] = max(widths[i], displayWidth(v.String()))
		}
	}
	for i, wd := range widths {
		wd = min(max(wd+2, minColumnWidth), maxColumnWidth)
		if err := w.sw.SetColWidth(i+1, i+1, float64(wd)); err != nil {
			return fmt.Errorf("write result header: width of column %s: %w", ColumnName(i+1), err)
		}
	}
	if err := w.sw.SetPanes(&excelize.Panes{
		Freeze: true, YSplit: 1, TopLeftCell: "A2", ActivePane: "bottomLeft",
		Selection: []excelize.Selection{{SQRef: "A2", ActiveCell: "A2", Pane: "bottomLeft"}},
	}); err != nil {
		return fmt.Errorf("write result header: freeze: %w", err)
	}
	header := make([]Value, len(w.header))
	for i, h := range w.header {
		header[i] = Text(h)
	}
	if err := w.writeRow(header, &w.bold); err != nil {
		return err
	}
	for _, row := range w.pending {
		if err := w.writeRow(row, nil); err != nil {
			return err
		}
	}
	w.pending = nil
	return nil
}

// writeRow writes the next sheet row; empty values get no cell at all, which keeps the file small.
func (w *Writer) writeRow(values []Value, style *int) error {
	if w.row >= excelize.TotalRows {
		return fmt.Errorf("write result row %d: Excel's limit is %d rows", w.row+1, excelize.TotalRows)
	}
	w.row++
	cells := make([]any, len(values))
	for i, v := range values {
		var value any
		switch v.kind {
		case emptyValue:
			continue
		case numberValue:
			value = v.num
		case boolValue:
			value = v.num != 0
		case dateValue:
			value = excelize.Cell{StyleID: w.date, Value: v.num}
		default:
			value = v.text
		}
		if style != nil {
			value = excelize.Cell{StyleID: *style, Value: value}
		}
		cells[i] = value
	}
	cell, err := excelize.CoordinatesToCellName(1, w.row)
	if err != nil {
		return fmt.Errorf("write result row %d: %w", w.row, err)
	}
	if err := w.sw.SetRow(cell, cells); err != nil {
		return fmt.Errorf("write result row %d: %w", w.row, err)
	}
	return nil
}

// WriteTo finishes the workbook and writes the .xlsx bytes to out. It can be called once; the Writer still needs
// Close afterwards.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	if w.done {
		return 0, ErrWriterDone
	}
	w.done = true
	if !w.started {
		if err := w.start(); err != nil {
			return 0, err
		}
	}
	if err := w.sw.Flush(); err != nil {
		return 0, fmt.Errorf("finish result workbook: %w", err)
	}
	if strings.TrimSpace(w.prompt) != "" && !strings.EqualFold(w.f.GetSheetName(0), promptSheet) {
		// After the result sheet, so its part stays xl/worksheets/sheet1.xml (see dimensionZip).
		if _, err := w.f.NewSheet(promptSheet); err != nil {
			return 0, fmt.Errorf("add the prompt sheet: %w", err)
		}
		if err := w.f.SetCellStr(promptSheet, "A1", w.prompt); err != nil {
			return 0, fmt.Errorf("add the prompt sheet: %w", err)
		}
		if err := w.f.SetColWidth(promptSheet, "A", "A", 100); err != nil {
			return 0, fmt.Errorf("add the prompt sheet: %w", err)
		}
		for i, r := range w.promptRows {
			cells := make([]any, len(r))
			for j, v := range r {
				if v != "" { // an empty cell is no cell
					cells[j] = fitCell(cleanText(v))
				}
			}
			if err := w.f.SetSheetRow(promptSheet, "A"+strconv.Itoa(i+3), &cells); err != nil {
				return 0, fmt.Errorf("add the prompt sheet: %w", err)
			}
		}
	}
	// excelize's WriteTo assembles the whole zip in a bytes.Buffer. Handing
	// it a zip writer over out instead makes it stream the workbook: the
	// buffer it is given stays empty, and memory stays flat whatever the row
	// count (the rows themselves come from the StreamWriter's temp file).
	cw := &countingWriter{w: out}
	zw := &dimensionZip{Writer: zip.NewWriter(cw), ref: w.dimension()}
	w.f.SetZipWriter(func(io.Writer) excelize.ZipWriter { return zw })
	if _, err := w.f.WriteTo(io.Discard); err != nil {
		return cw.n, fmt.Errorf("write result workbook: %w", err)
	}
	if zw.err != nil { // the zip is complete but its sheet declares the wrong range
		return cw.n, fmt.Errorf("write result workbook: %w", zw.err)
	}
	return cw.n, nil
}

// dimension is the sheet's used range: the header's columns by the rows written ("A1" for a one-cell sheet).
func (w *Writer) dimension() string {
	last := ColumnName(len(w.header)) + strconv.Itoa(max(w.row, 1))
	if last == "A1" {
		return last
	}
	return "A1:" + last
}

// resultSheetPart is the part of the result sheet, the workbook's first (an added prompt sheet comes after it).
const resultSheetPart = "xl/worksheets/sheet1.xml"

// dimensionZip is the zip writer excelize writes the workbook through. excelize's StreamWriter writes the
// worksheet's <dimension ref="A1"/> before the first row, when the range is not known yet, and never corrects it;
// readers that trust the element (openpyxl in read-only mode, some BI tools) then see only the header row. It
// rewrites the element as the worksheet part passes through, looking only at the part's first bytes, so the sheet
// is still streamed, never held in memory.
type dimensionZip struct {
	*zip.Writer
	ref string
	cur *dimensionWriter // the worksheet part being written, if any
	err error            // set when a worksheet part had no <dimension> where excelize writes it
}

// Create starts a zip entry; worksheet parts get the rewriting writer.
func (z *dimensionZip) Create(name string) (io.Writer, error) {
	if err := z.finish(); err != nil {
		return nil, err
	}
	zw, err := z.Writer.Create(name)
	if err != nil || name != resultSheetPart {
		return zw, err
	}
	z.cur = &dimensionWriter{w: zw, z: z}
	return z.cur, nil
}

// Close finishes the last entry and the archive.
func (z *dimensionZip) Close() error {
	if err := z.finish(); err != nil {
		return err
	}
	return z.Writer.Close()
}

// finish writes what the current worksheet part still holds back (a part shorter than its <dimension> search).
func (z *dimensionZip) finish() error {
	d := z.cur
	z.cur = nil
	if d == nil || d.done {
		return nil
	}
	return d.flush(nil)
}

// maxDimensionHead bounds how far into a worksheet part the <dimension> element is looked for: excelize writes it
// right after the XML declaration, the namespaces and <sheetPr>, well inside the first few KiB.
const maxDimensionHead = 64 << 10

// dimensionElement matches the element as encoding/xml writes it, or self-closed.
var dimensionElement = regexp.MustCompile(`<dimension ref="[^"]*"\s*(?:/>|></dimension>)`)

// dimensionWriter holds back a worksheet part's first bytes until its <dimension> element has gone past, replaces
// the element's range, then passes everything through.
type dimensionWriter struct {
	w    io.Writer
	z    *dimensionZip
	head []byte
	done bool
}

func (d *dimensionWriter) Write(p []byte) (int, error) {
	if d.done {
		return d.w.Write(p)
	}
	d.head = append(d.head, p...)
	loc := dimensionElement.FindIndex(d.head)
	if loc == nil && len(d.head) < maxDimensionHead {
		return len(p), nil
	}
	if err := d.flush(loc); err != nil {
		return 0, err
	}
	return len(p), nil
}

// flush writes the held bytes, with the element at loc replaced; nil loc means the part has no element.
func (d *dimensionWriter) flush(loc []int) error {
	d.done = true
	out := d.head
	if loc != nil {
		out = make([]byte, 0, len(d.head)+len(d.z.ref))
		out = append(out, d.head[:loc[0]]...)
		out = append(out, `<dimension ref="`+d.z.ref+`"/>`...)
		out = append(out, d.head[loc[1]:]...)
	} else {
		d.z.err = errors.New("the worksheet has no <dimension> element to correct")
	}
	d.head = nil
	_, err := d.w.Write(out)
	return err
}

// countingWriter counts what passes through to w.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Close releases the temporary files excelize streamed the rows to. It is safe to call more than once.
func (w *Writer) Close() error {
	w.done = true
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("close result workbook: %w", err)
	}
	return nil
}

// SanitizeSheetName turns any text into a name Excel accepts: the characters []:*?/\ become "_", characters XML
// cannot hold are dropped, leading and trailing apostrophes are removed, the name is cut to 31 UTF-16 units (at a
// character boundary), "History" (reserved by Excel) gets a "_" suffix and an empty result becomes "Sheet1".
func SanitizeSheetName(name string) string {
	name = cleanText(name)
	name = strings.Map(func(r rune) rune {
		switch r {
		case '[', ']', ':', '*', '?', '/', '\\':
			return '_'
		case '\t', '\n', '\r':
			return ' '
		}
		return r
	}, name)
	name = strings.Trim(name, "'")
	units := 0
	for i, r := range name {
		units += utf16.RuneLen(r)
		if units > excelize.MaxSheetNameLength {
			name = name[:i]
			break
		}
	}
	name = strings.Trim(name, "'")
	switch {
	case strings.TrimSpace(name) == "":
		return "Sheet1"
	case strings.EqualFold(name, "History"):
		return name + "_"
	}
	return name
}

// cleanText drops what XML 1.0 cannot hold so the workbook can never be corrupt, and replaces invalid UTF-8 with
// U+FFFD. The common case (clean text) returns s without allocating.
func cleanText(s string) string {
	clean := true
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && c != '\t' && c != '\n' && c != '\r' {
				clean = false
				break
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if !xmlChar(r) || (r == utf8.RuneError && size == 1) {
			clean = false
			break
		}
		i += size
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s { // invalid UTF-8 arrives here as U+FFFD, which XML allows
		if xmlChar(r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// xmlChar reports whether r is allowed in XML 1.0 character data.
func xmlChar(r rune) bool {
	switch {
	case r == '\t', r == '\n', r == '\r':
		return true
	case r < 0x20:
		return false
	case r <= 0xD7FF:
		return true
	case r < 0xE000:
		return false
	case r <= 0xFFFD:
		return true
	case r < 0x10000:
		return false
	default:
		return r <= 0x10FFFF
	}
}

// displayWidth is the widest line of s in Excel width units: East Asian wide characters take two.
func displayWidth(s string) int {
	widest, cur := 0, 0
	for _, r := range s {
		if r == '\n' {
			widest, cur = max(widest, cur), 0
			continue
		}
		switch width.LookupRune(r).Kind() {
		case width.EastAsianWide, width.EastAsianFullwidth:
			cur += 2
		default:
			cur++
		}
		if cur > maxColumnWidth { // wide enough to hit the cap; no need to measure the rest
			return cur
		}
	}
	return max(widest, cur)
}

// fitCell cuts text too long for a cell, ending it with a marker that says so.
func fitCell(text string) string {
	if _, fits := truncateCell(text); fits {
		return text
	}
	n := len(utf16.Encode([]rune(text)))
	marker := fmt.Sprintf(" … [cut at Excel's limit of %d characters a cell; the answer had %d]", MaxCellChars, n)
	head, _ := truncateUnits(text, MaxCellChars-len(marker))
	return head + marker
}
