package sheet

import (
	"archive/zip"
	"bufio"
	"bytes"
	"compress/flate"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
)

// AddColumnsParams describes the columns a result adds to the user's own workbook.
type AddColumnsParams struct {
	// Sheet names the worksheet the rows came from (Summary.Sheet).
	Sheet string
	// HeaderRow is the 1-based sheet row of the input's header; the added header cells go there.
	HeaderRow int
	// Header names the added columns, left to right.
	Header []string
	// Rows returns the added cells of the next data row, in strictly increasing SheetRow order, and io.EOF after
	// the last. Rows below HeaderRow only; a row with no cells in the sheet (a blank row) gets one.
	Rows func() (AddedRow, error)
	// TempDir holds the answers too long for a cell until they are written to OverflowSheet. Defaults to
	// os.TempDir.
	TempDir string
	// At, when positive, is the 1-based column the added columns start at, replacing every cell the rows that
	// get added cells hold there (a result sent back in, whose own result columns are rewritten). The input's
	// column widths are then left as they are. Zero puts them right of the used columns.
	At int
	// Hidden marks added columns hidden, by position; shorter than Header leaves the rest shown.
	Hidden []bool
	// LastRow, with At, is the last sheet row that gets added cells: the sheet's rows with content end there
	// (the reader read them all), so the first pass over the sheet, which finds where the added columns go and
	// where the rows end, is not needed. Zero makes that pass.
	LastRow int
	// PromptRows are written below the template in an added prompt sheet, from row 3: the task's declaration of
	// output columns (schema.Columns.Table), read again with the template when the result is sent back in.
	PromptRows [][]string
	// Dates says the added cells may hold dates (Date values): the workbook's styles part then gets a cell format
	// for them (DateFormat) and is the one more part that changes. A workbook whose styles part cannot take one
	// gets its dates as ISO 8601 text.
	Dates bool
	// Prompt, when not blank and the workbook has no sheet named "prompt" (in any case), is written to cell A1
	// of an added sheet of that name: the result then carries the template it was made with, and sent back in
	// it is read again (Reader.Prompt) instead of being asked for.
	Prompt string
}

// AddedRow holds the cells one sheet row gets in the added columns, left to right.
type AddedRow struct {
	SheetRow int
	Values   []Value
}

// ErrMacroWorkbook is returned by AddColumns for a macro-enabled workbook (.xlsm): its copy could not be saved
// under an .xlsx name, which Excel refuses to open when the package declares macros.
var ErrMacroWorkbook = errors.New("the workbook is macro-enabled (.xlsm)")

// AddColumns writes to out a copy of the workbook in src with the added columns to the right of the input sheet's
// used columns: the rightmost column holding a value or a formula, or covered by a merged range (one that reaches
// the last column, a title merged across the whole row, excepted). Every other zip part (other sheets, styles,
// shared strings, defined names, comments, charts, pivot caches) is copied byte for byte, compressed data included;
// the input sheet's XML is rewritten as a stream, row by row, so memory does not grow with the sheet (with Dates,
// the styles part also gets one cell format appended). In that sheet only three things change:
//   - the rows get the added cells (inline strings, numbers and booleans; a header cell takes the style of the
//     header row's last cell), and a row the sheet has no element for (a blank row) gets one;
//   - <cols> gets a width for each added column (a range an existing <col> spans is split around them);
//   - <dimension> grows to cover them.
//
// Cells the input already has are copied as they are: formulas with their cached values, types, styles. An empty
// cell (one that only carries a style) where an added cell goes is replaced by it. A text longer than a cell holds
// goes whole to OverflowSheet, which is then added to the workbook (its declaring parts rewritten, the only other
// parts that change).
func AddColumns(src io.ReaderAt, size int64, out io.Writer, p AddColumnsParams) error {
	zr, err := zip.NewReader(src, size)
	if err != nil {
		return fmt.Errorf("open the input workbook: %w", err)
	}
	if macro, err := macroEnabled(zr); err != nil {
		return err
	} else if macro {
		return ErrMacroWorkbook
	}
	names := sheetParts(zr)
	partName, ok := names[p.Sheet]
	if !ok {
		return fmt.Errorf("the input workbook has no sheet named %q", p.Sheet)
	}
	var part *zip.File
	for _, f := range zr.File {
		if strings.EqualFold(f.Name, partName) {
			part = f
			break
		}
	}
	if part == nil {
		return fmt.Errorf("sheet %q: its part %s is missing from the workbook", p.Sheet, partName)
	}
	var scan sheetScan
	if p.At > 0 && p.LastRow > 0 {
		// A result sent back in: its columns are known, and its rows end at the last one read.
		scan = sheetScan{maxCol: p.At - 1, maxRow: p.LastRow}
	} else if scan, err = scanSheet(part); err != nil {
		return fmt.Errorf("sheet %q: %w", p.Sheet, err)
	}
	first := scan.maxCol + 1
	if p.At > 0 {
		first = p.At
	}
	last := first + len(p.Header) - 1
	if last > DefaultMaxColumns {
		return fmt.Errorf("sheet %q uses columns up to %s; %d more columns would pass Excel's last column, %s",
			p.Sheet, ColumnName(scan.maxCol), len(p.Header), ColumnName(DefaultMaxColumns))
	}
	rw := &sheetRewrite{p: p, first: first, last: last, scan: scan}
	if err := rw.sample(); err != nil {
		return err
	}
	if p.Dates {
		// Any failure leaves the dates as text: nothing is lost, and Excel still reads them as dates when typed.
		rw.dates, _ = addDateStyle(zr)
	}

	rw.overflow = &overflow{tempDir: p.TempDir, sheet: freeName(OverflowSheet, func(n string) bool {
		for sheet := range names {
			if strings.EqualFold(sheet, n) {
				return true
			}
		}
		return false
	})}
	defer rw.overflow.close()

	// The three parts that declare the sheets go last: they change only when an answer overflowed, which is
	// known once the input sheet is written.
	pkg := findPackageParts(zr)
	var deferred []*zip.File
	zw := zip.NewWriter(out)
	// The rewritten sheet is compressed at flate's best speed: it is the one part compressed again, and deflating
	// it at the default level was a third of the export's time, for a file a few percent smaller.
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) { return flate.NewWriter(w, flate.BestSpeed) })
	for _, f := range zr.File {
		switch {
		case strings.EqualFold(f.Name, pkg.contentTypes), strings.EqualFold(f.Name, pkg.workbook), strings.EqualFold(f.Name, pkg.workbookRels):
			deferred = append(deferred, f)
		case rw.dates != nil && strings.EqualFold(f.Name, rw.dates.part):
			w, err := zw.CreateHeader(&zip.FileHeader{Name: f.Name, Method: zip.Deflate, Modified: f.Modified})
			if err == nil {
				_, err = w.Write(rw.dates.content)
			}
			if err != nil {
				return fmt.Errorf("write %s: %w", f.Name, err)
			}
		case f != part:
			if err := zw.Copy(f); err != nil {
				return fmt.Errorf("copy %s: %w", f.Name, err)
			}
		default:
			w, err := zw.CreateHeader(&zip.FileHeader{Name: f.Name, Method: zip.Deflate, Modified: f.Modified})
			if err != nil {
				return fmt.Errorf("write %s: %w", f.Name, err)
			}
			if err := rw.rewrite(f, w); err != nil {
				return fmt.Errorf("sheet %q: %w", p.Sheet, err)
			}
		}
	}
	var added []addedSheet
	if rw.overflow.rows > 0 {
		if err := rw.overflow.w.Flush(); err != nil {
			return fmt.Errorf("overflow sheet: %w", err)
		}
		added = append(added, addedSheet{name: rw.overflow.sheet, write: rw.overflow.writePart})
	}
	hasPrompt := false
	for name := range names {
		hasPrompt = hasPrompt || strings.EqualFold(name, promptSheet)
	}
	if strings.TrimSpace(p.Prompt) != "" && !hasPrompt {
		added = append(added, addedSheet{name: promptSheet, write: func(zw *zip.Writer, part string) error { return writePromptPart(zw, part, p.Prompt, p.PromptRows) }})
	}
	if err := addSheets(zr, zw, pkg, deferred, added); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("finish the result workbook: %w", err)
	}
	return nil
}

// addedSheet is a worksheet a result adds to the user's workbook.
type addedSheet struct {
	name  string
	write func(zw *zip.Writer, part string) error
	part  string // its part name, chosen by addSheets
}

// addSheets writes the added sheets and the package parts that declare them, or, when there are none, those parts
// as they were.
func addSheets(zr *zip.Reader, zw *zip.Writer, pkg packageEdit, deferred []*zip.File, added []addedSheet) error {
	if len(added) == 0 {
		for _, f := range deferred {
			if err := zw.Copy(f); err != nil {
				return fmt.Errorf("copy %s: %w", f.Name, err)
			}
		}
		return nil
	}
	taken := map[string]bool{}
	for _, f := range zr.File {
		taken[strings.ToLower(f.Name)] = true
	}
	for i, a := range added {
		base := strings.TrimPrefix(path.Dir(pkg.workbook)+"/worksheets/"+strings.ToLower(a.name), "./")
		added[i].part = freeName(base, func(n string) bool { return taken[strings.ToLower(n)+".xml"] }) + ".xml"
		taken[strings.ToLower(added[i].part)] = true
	}
	edited, err := declareSheets(zr, pkg, added)
	if err != nil {
		return err
	}
	for _, a := range added {
		if err := a.write(zw, a.part); err != nil {
			return err
		}
	}
	for _, f := range deferred {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: f.Name, Method: zip.Deflate, Modified: f.Modified})
		if err != nil {
			return fmt.Errorf("write %s: %w", f.Name, err)
		}
		b := edited[f.Name]
		if b == nil {
			for name, e := range edited {
				if strings.EqualFold(name, f.Name) {
					b = e
				}
			}
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("write %s: %w", f.Name, err)
		}
	}
	return nil
}

// macroEnabled reports whether the package declares a macro-enabled workbook.
func macroEnabled(zr *zip.Reader) (bool, error) {
	rc, err := openPart(zr, "[Content_Types].xml")
	if err != nil {
		return false, nil // no declared types: not a macro workbook; the reader judged the rest
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 16<<20))
	if err != nil {
		return false, fmt.Errorf("read [Content_Types].xml: %w", err)
	}
	return bytes.Contains(b, []byte("sheet.macroEnabled.main+xml")), nil
}

// sheetScan is what the first pass over the sheet learns.
type sheetScan struct {
	maxCol int // rightmost column with a value or formula, or inside a merged range
	maxRow int // last row with an element
}

// scanSheet reads the sheet once to find where the added columns can go.
func scanSheet(f *zip.File) (sheetScan, error) {
	var s sheetScan
	rc, err := f.Open()
	if err != nil {
		return s, err
	}
	defer rc.Close()
	sc := newXMLScanner(rc)
	inData, openCell := false, false
	row, col, cellCol := 0, 0, 0
	for {
		raw, err := sc.next(nil)
		if errors.Is(err, io.EOF) {
			return s, nil
		}
		if err != nil {
			return s, err
		}
		m := parseMarkup(raw)
		if openCell { // the markup after <c ...>: a child means the cell holds something
			openCell = false
			if !m.closes("c") {
				s.maxCol = max(s.maxCol, cellCol)
			}
		}
		switch {
		case m.is("sheetData"):
			inData = !m.empty
		case m.closes("sheetData"):
			inData = false
		case inData && m.is("row"):
			row = positionAttr(m, "r", row, cellRow)
			col = 0
			s.maxRow = max(s.maxRow, row)
		case inData && m.is("c"):
			col = positionAttr(m, "r", col, cellColumn)
			cellCol, openCell = col, !m.empty
		case m.is("mergeCell"):
			if ref, ok := m.attr("ref"); ok {
				// A merge out to the last column (a title across the whole row) cannot be cleared; cells added under
				// it are hidden there, as anything else would be.
				if end := cellColumn(ref[strings.LastIndexByte(ref, ':')+1:]); end < DefaultMaxColumns {
					s.maxCol = max(s.maxCol, end)
				}
			}
		}
	}
}

// positionAttr reads a row or cell position from its "r" attribute, or, without one, takes the next after prev.
func positionAttr(m markup, name string, prev int, parse func(string) int) int {
	if v, ok := m.attr(name); ok {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
		if n := parse(v); n > 0 {
			return n
		}
	}
	return prev + 1
}

// sheetRewrite is the second pass: the sheet copied with the added cells.
type sheetRewrite struct {
	p           AddColumnsParams
	first, last int
	scan        sheetScan
	widths      []int
	rows        []AddedRow // read ahead, in order
	eof         bool
	lastRow     int
	prefix      string // the worksheet's namespace prefix ("x:"), if it has one
	headerStyle string
	headerDone  bool
	colsDone    bool
	w           *bufio.Writer
	overflow    *overflow
	err         error // the first failure to spool an overflowing answer
	// dates is the style date cells take (Dates); nil writes them as ISO text.
	dates *dateStyle
}

// widthSample is how many rows the added columns' widths are measured on, as for a new workbook.
const widthSample = widthSampleRows

// sample reads the first rows ahead and sizes the added columns from them and the header.
func (rw *sheetRewrite) sample() error {
	for len(rw.rows) < widthSample {
		if ok, err := rw.readRow(); err != nil || !ok {
			return err
		}
	}
	return nil
}

// readRow reads one more row into rw.rows; false at the end.
func (rw *sheetRewrite) readRow() (bool, error) {
	if rw.eof {
		return false, nil
	}
	r, err := rw.p.Rows()
	if errors.Is(err, io.EOF) {
		rw.eof = true
		return false, nil
	}
	if err != nil {
		return false, err
	}
	switch {
	case r.SheetRow <= max(rw.lastRow, rw.p.HeaderRow):
		return false, fmt.Errorf("added cells for sheet row %d come after row %d", r.SheetRow, max(rw.lastRow, rw.p.HeaderRow))
	case len(r.Values) > len(rw.p.Header):
		return false, fmt.Errorf("sheet row %d: %d added cells for %d added columns", r.SheetRow, len(r.Values), len(rw.p.Header))
	}
	rw.lastRow = r.SheetRow
	rw.rows = append(rw.rows, r)
	return true, nil
}

// peek returns the next row to add cells to, or nil.
func (rw *sheetRewrite) peek() (*AddedRow, error) {
	if len(rw.rows) == 0 {
		if ok, err := rw.readRow(); err != nil || !ok {
			return nil, err
		}
	}
	return &rw.rows[0], nil
}

func (rw *sheetRewrite) pop() { rw.rows = rw.rows[1:] }

func (rw *sheetRewrite) columnWidths() []int {
	widths := make([]int, len(rw.p.Header))
	for i, h := range rw.p.Header {
		widths[i] = displayWidth(h) + 1
	}
	for _, r := range rw.rows {
		for i, v := range r.Values {
			widths[i] = max(widths[i], displayWidth(v.String()))
		}
	}
	for i, w := range widths {
		widths[i] = min(max(w+2, minColumnWidth), maxColumnWidth)
	}
	return widths
}

// rewrite copies the sheet part f to out with the added cells.
func (rw *sheetRewrite) rewrite(f *zip.File, out io.Writer) error {
	rc, err := f.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	rw.widths = rw.columnWidths()
	rw.w = bufio.NewWriterSize(out, 64<<10)
	sc := newXMLScanner(rc)
	var cols [][]byte // the input's <col> elements
	inData, inCols, rooted := false, false, false
	adding, cellsDone, skipCell := false, false, false
	var adds *AddedRow
	row, col := 0, 0
	for {
		raw, err := sc.next(rw.w)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		m := parseMarkup(raw)
		if !rooted && m.local != "" {
			rooted, rw.prefix = true, m.prefix
		}
		switch {
		case skipCell:
			// An empty styled cell where an added cell goes: dropped up to its end tag.
			skipCell = !m.closes("c")
			continue
		case !inData && m.is("dimension"):
			ref, _ := m.attr("ref")
			rw.w.Write(m.rebuild([][2]string{{"ref", rw.dimension(ref)}}))
			continue
		case !inData && m.is("cols"):
			if m.empty {
				rw.writeCols(nil)
			} else {
				inCols = true
			}
			continue
		case inCols && m.is("col"):
			if !m.empty { // <col ...></col>, as excelize writes it: kept self-closed
				m.empty = true
				raw = m.rebuild(nil)
			}
			cols = append(cols, slices.Clone(raw))
			continue
		case inCols && m.closes("col"):
			continue
		case inCols && m.closes("cols"):
			inCols = false
			rw.writeCols(cols)
			continue
		case m.is("sheetData"):
			if !rw.colsDone {
				rw.writeCols(nil)
			}
			if m.empty {
				fmt.Fprintf(rw.w, "<%ssheetData>", rw.prefix)
				if err := rw.finishRows(); err != nil {
					return err
				}
				fmt.Fprintf(rw.w, "</%ssheetData>", rw.prefix)
				continue
			}
			inData = true
		case m.closes("sheetData"):
			if err := rw.finishRows(); err != nil {
				return err
			}
			inData = false
		case inData && m.is("row"):
			row = positionAttr(m, "r", row, cellRow)
			col = 0
			if err := rw.rowsBefore(row); err != nil {
				return err
			}
			adds, adding, cellsDone = nil, false, false
			if row == rw.p.HeaderRow {
				adding, rw.headerDone = true, true
			} else if next, err := rw.peek(); err != nil {
				return err
			} else if next != nil && next.SheetRow == row {
				adds, adding = next, true
				rw.pop()
			}
			if !adding {
				break
			}
			empty := m.empty
			m.empty = false
			rw.w.Write(m.rebuild(nil, "spans")) // spans is a hint that would no longer hold
			if empty {
				rw.writeCells(row, adds)
				fmt.Fprintf(rw.w, "</%srow>", m.prefix)
				adding = false
			}
			continue
		case inData && adding && m.is("c"):
			col = positionAttr(m, "r", col, cellColumn)
			if col < rw.first {
				if row == rw.p.HeaderRow {
					rw.headerStyle, _ = m.attr("s")
				}
				break
			}
			if !cellsDone {
				rw.writeCells(row, adds)
				cellsDone = true
			}
			if col <= rw.last { // an empty cell, or with At one of the columns rewritten
				skipCell = !m.empty
				continue
			}
		case inData && adding && m.closes("row"):
			if !cellsDone {
				rw.writeCells(row, adds)
			}
			adding = false
		}
		rw.w.Write(raw)
	}
	if rw.err != nil {
		return rw.err
	}
	if !rw.headerDone {
		return fmt.Errorf("the header row %d is not in the sheet", rw.p.HeaderRow)
	}
	if next, err := rw.peek(); err != nil {
		return err
	} else if next != nil {
		return fmt.Errorf("sheet row %d got no added cells: the sheet has no <sheetData> to hold it", next.SheetRow)
	}
	return rw.w.Flush()
}

// rowsBefore writes a row element for each row to add cells to that the sheet has none for, up to before row.
func (rw *sheetRewrite) rowsBefore(row int) error {
	for {
		next, err := rw.peek()
		if err != nil || next == nil || next.SheetRow >= row {
			return err
		}
		fmt.Fprintf(rw.w, `<%srow r="%d">`, rw.prefix, next.SheetRow)
		rw.writeCells(next.SheetRow, next)
		fmt.Fprintf(rw.w, "</%srow>", rw.prefix)
		rw.pop()
	}
}

// finishRows writes the rows still to add at the end of <sheetData>.
func (rw *sheetRewrite) finishRows() error {
	return rw.rowsBefore(1<<31 - 1)
}

// writeCells writes the added cells of one row: the header's names on the header row, else r's values.
func (rw *sheetRewrite) writeCells(row int, r *AddedRow) {
	if r == nil {
		for i, h := range rw.p.Header {
			rw.writeCell(row, rw.first+i, Text(h), rw.headerStyle)
		}
		return
	}
	for i, v := range r.Values {
		rw.writeCell(row, rw.first+i, v, "")
	}
}

func (rw *sheetRewrite) writeCell(row, col int, v Value, style string) {
	if v.kind == dateValue {
		switch {
		case rw.dates == nil:
			v = Text(v.text)
		case rw.dates.date1904 && v.num < 1462:
			v = Text(v.text) // before 1904: a 1904-based workbook cannot show it
		case rw.dates.date1904:
			v.num -= 1462 // days from 1900-01-01 to 1904-01-01, as Excel counts them
			style = strconv.Itoa(rw.dates.index)
		default:
			style = strconv.Itoa(rw.dates.index)
		}
	}
	if v.kind == textValue {
		text := cleanText(v.text)
		if _, fits := truncateCell(text); !fits {
			var err error
			if text, err = rw.overflow.add(row, rw.p.Header[col-rw.first], text); err != nil && rw.err == nil {
				rw.err = err
			}
		}
		v.text = text
	}
	writeCellXML(rw.w, rw.prefix, row, col, v, style)
}

// writeCellXML writes one cell element: text as an inline string (never a formula), numbers and booleans as such.
// Text must be clean (cleanText) and fit a cell.
func writeCellXML(w *bufio.Writer, x string, row, col int, v Value, style string) {
	if v.IsEmpty() {
		return
	}
	// Written piece by piece, not with fmt: an export writes a dozen cells a row, and fmt's boxing was most of
	// the garbage a 100,000-row export made.
	var num [24]byte
	open := func(name string) {
		w.WriteByte('<')
		w.WriteString(x)
		w.WriteString(name)
		w.WriteByte('>')
	}
	closeTag := func(name string) {
		w.WriteString("</")
		w.WriteString(x)
		w.WriteString(name)
		w.WriteByte('>')
	}
	w.WriteByte('<')
	w.WriteString(x)
	w.WriteString(`c r="`)
	w.WriteString(ColumnName(col))
	w.Write(strconv.AppendInt(num[:0], int64(row), 10))
	w.WriteByte('"')
	if style != "" {
		w.WriteString(` s="`)
		w.WriteString(style)
		w.WriteByte('"')
	}
	switch v.kind {
	case numberValue, dateValue:
		w.WriteByte('>')
		open("v")
		w.WriteString(formatNumber(v.num))
		closeTag("v")
	case boolValue:
		w.WriteString(` t="b">`)
		open("v")
		w.Write(strconv.AppendInt(num[:0], int64(v.num), 10))
		closeTag("v")
	default:
		w.WriteString(` t="inlineStr">`)
		open("is")
		w.WriteByte('<')
		w.WriteString(x)
		w.WriteByte('t')
		if v.text != strings.TrimSpace(v.text) || strings.ContainsAny(v.text, "\n\r\t") {
			w.WriteString(` xml:space="preserve"`)
		}
		w.WriteByte('>')
		escapeText(w, v.text)
		closeTag("t")
		closeTag("is")
	}
	closeTag("c")
}

// escapeText writes s as XML character data: &, < and > escaped, and a carriage return as a reference so that
// XML's line-end normalisation keeps it. It does not copy s, as xml.EscapeText's []byte would.
func escapeText(w *bufio.Writer, s string) {
	last := 0
	for i := 0; i < len(s); i++ {
		var esc string
		switch s[i] {
		case '&':
			esc = "&amp;"
		case '<':
			esc = "&lt;"
		case '>':
			esc = "&gt;"
		case '\r':
			esc = "&#xD;"
		default:
			continue
		}
		w.WriteString(s[last:i])
		w.WriteString(esc)
		last = i + 1
	}
	w.WriteString(s[last:])
}

// writeCols writes <cols> with the input's columns and a width for each added one.
func (rw *sheetRewrite) writeCols(input [][]byte) {
	rw.colsDone = true
	if rw.p.At > 0 { // the columns are the input's own: their widths stay as the user left them
		if len(input) > 0 {
			fmt.Fprintf(rw.w, "<%scols>", rw.prefix)
			for _, c := range input {
				rw.w.Write(c)
			}
			fmt.Fprintf(rw.w, "</%scols>", rw.prefix)
		}
		return
	}
	type col struct {
		min int
		raw []byte
	}
	var out []col
	for _, raw := range input {
		m := parseMarkup(raw)
		lo, _ := strconv.Atoi(attrOr(m, "min"))
		hi, _ := strconv.Atoi(attrOr(m, "max"))
		if hi < rw.first || lo > rw.last {
			out = append(out, col{lo, raw})
			continue
		}
		// The input styles or sizes columns the added ones fall in (LibreOffice writes one <col> up to column
		// 1024): keep its setting on either side of them.
		if lo < rw.first {
			out = append(out, col{lo, m.rebuild([][2]string{{"max", strconv.Itoa(rw.first - 1)}})})
		}
		if hi > rw.last {
			out = append(out, col{rw.last + 1, m.rebuild([][2]string{{"min", strconv.Itoa(rw.last + 1)}})})
		}
	}
	for i, w := range rw.widths {
		c := rw.first + i
		hidden := ""
		if i < len(rw.p.Hidden) && rw.p.Hidden[i] {
			hidden = ` hidden="1"`
		}
		out = append(out, col{c, fmt.Appendf(nil, `<%scol min="%d" max="%d" width="%d" customWidth="1"%s/>`, rw.prefix, c, c, w, hidden)})
	}
	slices.SortStableFunc(out, func(a, b col) int { return a.min - b.min })
	fmt.Fprintf(rw.w, "<%scols>", rw.prefix)
	for _, c := range out {
		rw.w.Write(c.raw)
	}
	fmt.Fprintf(rw.w, "</%scols>", rw.prefix)
}

func attrOr(m markup, name string) string {
	v, _ := m.attr(name)
	return v
}

// dimension grows the sheet's declared range to the added columns.
func (rw *sheetRewrite) dimension(ref string) string {
	corners := strings.Split(ref, ":")
	start, end := corners[0], corners[len(corners)-1]
	if cellColumn(start) == 0 || cellRow(start) == 0 {
		start = "A1"
	}
	endCol := max(cellColumn(end), rw.last)
	endRow := max(cellRow(end), rw.scan.maxRow, 1)
	return start + ":" + ColumnName(endCol) + strconv.Itoa(endRow)
}
