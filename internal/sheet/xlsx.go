package sheet

import (
	"archive/zip"
	"bufio"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/xuri/excelize/v2"
)

// promptSheet is the name (case-insensitive) of the optional sheet whose A1 holds the prompt template.
const promptSheet = "prompt"

// openXLSX checks the zip's central directory (format and zip-bomb guard) before excelize sees the file, opens the
// workbook, picks the sheet and reads the prompt. It closes f: excelize reopens the file by path.
func (r *Reader) openXLSX(f *os.File, size int64, want string) (rowSource, error) {
	keepFile := false // the check of the sheet read, running beside the reader, owns f then
	defer func() {
		if !keepFile {
			f.Close()
		}
	}()
	zr, err := zip.NewReader(f, size)
	if err != nil {
		return nil, r.fileErr(fmt.Sprintf("the file is a damaged zip archive and cannot be read as .xlsx (%v)", err))
	}
	names := make(map[string]bool, len(zr.File))
	var total uint64
	limit := uint64(r.lim.MaxUnzippedBytes)
	over := false
	for _, zf := range zr.File {
		names[strings.ToLower(zf.Name)] = true
		if zf.UncompressedSize64 > limit-total {
			over = true
		} else {
			total += zf.UncompressedSize64
		}
	}
	if !names["[content_types].xml"] || !names["xl/workbook.xml"] {
		return nil, r.fileErr(zipKindReason(zr, names))
	}
	if over {
		var claimed uint64
		for _, zf := range zr.File {
			claimed += zf.UncompressedSize64 // may wrap on absurd directories; only used in the message
		}
		return nil, r.fileErr(fmt.Sprintf("the workbook expands to %s when unzipped; the limit is %s (zip-bomb guard, configurable)",
			formatBytes(int64(min(claimed, 1<<62))), formatBytes(r.lim.MaxUnzippedBytes)))
	}

	if err := verifyEntries(zr); err != nil {
		return nil, r.fileErr(fmt.Sprintf("the workbook is damaged and cannot be read (%v)", err))
	}

	// The directory has been checked; UnzipSizeLimit is excelize's own second line of defence. Worksheets and
	// shared strings bigger than an eighth of the budget (at most excelize's 16 MiB default) are unzipped to
	// temporary files and streamed from there, so the parts held in memory stay a fraction of the budget.
	xf, err := excelize.OpenFile(f.Name(), excelize.Options{
		UnzipSizeLimit:    r.lim.MaxUnzippedBytes,
		UnzipXMLSizeLimit: max(1, min(r.lim.MaxUnzippedBytes/8, excelize.StreamChunkSize)),
		ShortDatePattern:  shortDatePattern,
		CultureInfo:       excelize.CultureNameZhCN,
	})
	if err != nil {
		if xf != nil {
			_ = xf.Close()
		}
		// Only failing to open the file is I/O; everything else excelize reports is about the content (for
		// example a ReadAt at a negative offset computed from a damaged header).
		var pe *fs.PathError
		if errors.As(err, &pe) && pe.Op == "open" {
			return nil, fmt.Errorf("open workbook %q: %w", r.file, err)
		}
		return nil, r.fileErr(fmt.Sprintf("the workbook is damaged and cannot be read (%v)", err))
	}
	parts := sheetParts(zr)
	nf := newNumFormatter(xf)
	damaged := func(err error) error {
		ie := r.fileErr(fmt.Sprintf("the workbook is damaged and cannot be read (%v)", err))
		ie.whole = true
		return ie
	}
	// A chart sheet has no cells: it is never the default sheet. (With no part map, excelize judges alone.)
	worksheet := func(sheet string) bool { _, ok := parts[sheet]; return ok || len(parts) == 0 }
	sheet, chooseErr := r.chooseSheet(xf, want, worksheet)
	// Every part but the sheet read is checked now. That one is checked while it is read, the two passes over
	// its XML side by side on two cores (sheetCheck): it is the largest part, and checking it first was a third
	// of the time it took to read a workbook.
	readPart := strings.ToLower(parts[sheet])
	if chooseErr != nil || readPart == "" || strings.EqualFold(sheet, promptSheet) {
		readPart = ""
	}
	escapes, uncached, err := checkXMLParts(zr, parts, nf, xf.CharsetReader, readPart)
	if err == nil && chooseErr != nil {
		err = chooseErr
	}
	if err != nil {
		nf.close()
		_ = xf.Close()
		var ie *InputError
		if errors.As(err, &ie) {
			return nil, err
		}
		return nil, damaged(err)
	}
	readGeneralInFull(xf)
	src, err := r.startSheet(xf, sheet, func(sheet string) cellEscapes { return escapes[strings.ToLower(parts[sheet])] })
	if err != nil {
		nf.close()
		_ = xf.Close()
		return nil, err
	}
	if readPart == "" {
		nf.close()
		r.computeFormulas(xf, src, uncached[strings.ToLower(parts[sheet])])
		return src, nil
	}
	var zf *zip.File
	for _, x := range zr.File {
		if strings.EqualFold(x.Name, readPart) {
			zf = x
		}
	}
	keepFile = true
	src.check = startSheetCheck(zf, nf, xf.CharsetReader, f)
	src.damaged = damaged
	src.formula = func(row, col int) (string, bool) { return r.computeFormula(xf, row, col) }
	return src, nil
}

// sheetCheck checks the XML of the sheet being read (scanXMLPart) in a goroutine of its own while excelize reads
// it, and hands the reader, row by row, what the check finds: the cells excelize reads differently, the formulas
// without a cached result, and damage. excelize's iterator ends quietly at an XML error, so the reader waits for
// the check to pass a row before returning it, and for the end of the check before its own end.
//
// Rows are matched by number: a sheet whose rows are out of order (no spreadsheet writes one) may get a cell's
// correction after its row was returned; damage is still found before the end.
type sheetCheck struct {
	mu       sync.Mutex
	cond     sync.Cond
	upTo     int // the rows up to this one are checked
	done     bool
	err      error
	esc      cellEscapes
	uncached map[int][]int // row -> columns
	stop     atomic.Bool
	exited   chan struct{}
}

// startSheetCheck starts checking zf. It owns nf and f (the workbook file zf reads from) and closes them when done.
func startSheetCheck(zf *zip.File, nf *numFormatter, charsetReader func(string, io.Reader) (io.Reader, error), f *os.File) *sheetCheck {
	c := &sheetCheck{esc: cellEscapes{}, uncached: map[int][]int{}, exited: make(chan struct{})}
	c.cond.L = &c.mu
	go func() {
		defer close(c.exited)
		defer f.Close()
		defer nf.close()
		err := scanXMLPart(zf, true, nf, charsetReader, c)
		c.mu.Lock()
		if err != nil && !errors.Is(err, errStopped) {
			c.err = fmt.Errorf("%s: %w", zf.Name, err)
		}
		c.done = true
		c.cond.Broadcast()
		c.mu.Unlock()
	}()
	return c
}

func (c *sheetCheck) escape(row, col int, text string) {
	c.mu.Lock()
	if c.esc[row] == nil {
		c.esc[row] = map[int]string{}
	}
	c.esc[row][col] = text
	c.mu.Unlock()
}

func (c *sheetCheck) uncachedFormula(row, col int) {
	c.mu.Lock()
	c.uncached[row] = append(c.uncached[row], col)
	c.mu.Unlock()
}

func (c *sheetCheck) rowDone(row int) bool {
	c.mu.Lock()
	if row > c.upTo {
		c.upTo = row
		c.cond.Broadcast()
	}
	c.mu.Unlock()
	return !c.stop.Load()
}

// wait blocks until the rows up to row are checked, or the check has ended, and returns what row needs: its
// corrected cells and its formula cells without a cached result; or the damage the check found, wherever it is.
func (c *sheetCheck) wait(row int) (map[int]string, []int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.done && c.upTo < row && c.err == nil {
		c.cond.Wait()
	}
	if c.err != nil {
		return nil, nil, c.err
	}
	esc, cols := c.esc[row], c.uncached[row]
	delete(c.esc, row)
	delete(c.uncached, row)
	return esc, cols, nil
}

// close stops the check and waits for its goroutine, which closes the file.
func (c *sheetCheck) close() {
	c.stop.Store(true)
	<-c.exited
}

// maxComputedFormulas bounds how many formulas without a cached result are computed: excelize's calculator is
// made for a cell, not a column of a hundred thousand, and the rest are reported as not computed.
const maxComputedFormulas = 20_000

// computeFormulas computes the formulas of the sheet that have no cached result with excelize's calculator
// (arithmetic, references, SUM and the other common functions), so they read as Excel would show them once it
// recalculated, instead of as blanks. Each is recorded with whether it could be computed, for Summary.
func (r *Reader) computeFormulas(xf *excelize.File, src *xlsxSource, cells []cellPos) {
	for _, c := range cells {
		if v, ok := r.computeFormula(xf, c.row, c.col); ok {
			if src.escapes == nil {
				src.escapes = cellEscapes{}
			}
			if src.escapes[c.row] == nil {
				src.escapes[c.row] = map[int]string{}
			}
			src.escapes[c.row][c.col] = v
		}
	}
}

// computeFormula computes one formula without a cached result and records it for Summary; ok is false when it
// could not be computed (or maxComputedFormulas were already).
func (r *Reader) computeFormula(xf *excelize.File, row, col int) (string, bool) {
	f := FormulaCell{Row: row, Column: col}
	var v string
	if len(r.formulas) < maxComputedFormulas {
		ref, err := excelize.CoordinatesToCellName(col, row)
		if err == nil {
			v, err = xf.CalcCellValue(r.sheet, ref)
			f.Computed = err == nil && !strings.HasPrefix(v, "#")
		}
	}
	r.formulas = append(r.formulas, f)
	return v, f.Computed
}

// shortDatePattern is how the locale-dependent built-in date formats (14 "short date", and 22 "short date and
// time", which gets " hh:mm" appended) are shown. Excel renders them with the computer's regional settings, which
// a server does not have; excelize falls back to "mm-dd-yy", which no Excel shows. Together with CultureNameZhCN
// (for the CJK built-in formats 27-36 and 50-58, e.g. 31 = yyyy"年"m"月"d"日") the values read as they look in the
// Chinese Excel this tool's users work in: 2024/1/15, unambiguous for people and models alike.
const shortDatePattern = "yyyy/m/d"

// readGeneralInFull makes numbers in the General format read as Excel's formula bar shows them (up to 15
// significant digits in full: 6901234567892, not 6.901234568E+12), the same for every cell. excelize formats a
// General cell that has any style (a border, a font, a fill) like a narrow column, in scientific notation with 10
// digits, but leaves an unstyled one in full, so a barcode column in a bordered table lost its last digits.
// Pointing General styles at a number format id that exists nowhere makes excelize return those cells
// unformatted, exactly like unstyled ones. The style sheet is only read, never saved.
func readGeneralInFull(xf *excelize.File) {
	_, _ = xf.GetStyle(-1) // loads the style sheet and fails on the index; a damaged one just stays as it is
	st := xf.Styles
	if st == nil || st.CellXfs == nil {
		return
	}
	general := map[int]bool{0: true}
	unused := -1
	if st.NumFmts != nil {
		for _, nf := range st.NumFmts.NumFmt {
			code := nf.FormatCode
			if nf.FormatCode16 != "" {
				code = nf.FormatCode16
			}
			general[nf.NumFmtID] = strings.EqualFold(code, "General")
		}
		for _, nf := range st.NumFmts.NumFmt {
			unused = min(unused, nf.NumFmtID-1)
		}
	}
	for i := range st.CellXfs.Xf {
		x := &st.CellXfs.Xf[i]
		if x.NumFmtID == nil || general[*x.NumFmtID] {
			x.NumFmtID = &unused
		}
	}
}

// verifyEntries inflates every entry once into a small reusable buffer. excelize ignores read errors while
// unzipping (a damaged or lying entry silently becomes a truncated part, i.e. lost rows), whereas archive/zip
// reports both a CRC mismatch and an entry inflating past its declared size, which the size check above relied
// on. Memory stays constant; the cost is one extra decompression pass.
func verifyEntries(zr *zip.Reader) error {
	buf := make([]byte, 64<<10)
	for _, zf := range zr.File {
		if zf.FileInfo().IsDir() {
			continue
		}
		rc, err := zf.Open()
		if err != nil {
			return fmt.Errorf("%s: %w", zf.Name, err)
		}
		_, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{rc}, buf)
		_ = rc.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", zf.Name, err)
		}
	}
	return nil
}

// checkXMLParts parses the worksheets and the shared strings once with the decoder settings excelize uses.
// excelize's row iterator treats an XML error as the end of the sheet, so a control character or a broken tag
// written by a faulty exporter silently dropped every row after it (and Excel refuses such a file until it has
// "repaired" it); it reads a part with no root element at all (empty, or cut off after the XML declaration) as an
// empty sheet. A damaged worksheet rejects the whole workbook, even one that is not read: the file needs repairing
// either way. The parts checked are those under xl/worksheets/ and wherever the workbook's relationships point its
// sheets (sheets maps each sheet to its part); a sheet whose part is missing is damage too.
//
// The same pass collects the cells excelize would read differently from Excel: the cached string results of
// formulas (t="str") that hold _xHHHH_ escapes (excelize decodes the escapes in shared and inline strings but
// returns formula results as stored), and numbers whose format excelize renders wrongly (see numFormatter). The
// result is keyed by the part's lower-case name.
//
// skip names (in lower case) a part that is checked while it is read instead (sheetCheck); "" checks them all.
func checkXMLParts(zr *zip.Reader, sheets map[string]string, nf *numFormatter, charsetReader func(string, io.Reader) (io.Reader, error), skip string) (map[string]cellEscapes, map[string][]cellPos, error) {
	files := make(map[string]*zip.File, len(zr.File))
	for _, zf := range zr.File {
		files[strings.ToLower(zf.Name)] = zf
	}
	check := map[string]bool{}
	for name := range files {
		if strings.HasPrefix(name, "xl/worksheets/") && !strings.Contains(name[len("xl/worksheets/"):], "/") &&
			strings.HasSuffix(name, ".xml") {
			check[name] = true
		}
	}
	names := make([]string, 0, len(sheets))
	for name := range sheets {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, sheet := range names {
		part := strings.ToLower(sheets[sheet])
		if files[part] == nil {
			return nil, nil, fmt.Errorf("sheet %q: its part %s is missing from the file", sheet, sheets[sheet])
		}
		check[part] = true
	}
	escapes, uncached := map[string]cellEscapes{}, map[string][]cellPos{}
	for _, zf := range zr.File {
		name := strings.ToLower(zf.Name)
		if !check[name] && name != "xl/sharedstrings.xml" || name == skip {
			continue
		}
		esc, formulas, err := checkXMLPart(zf, check[name], nf, charsetReader)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", zf.Name, err)
		}
		if len(esc) > 0 {
			escapes[name] = esc
		}
		if len(formulas) > 0 {
			uncached[name] = formulas
		}
	}
	return escapes, uncached, nil
}

// cellPos is a cell's sheet row and 1-based column.
type cellPos struct{ row, col int }

// checkXMLPart reads every token of one part; for a worksheet it also collects the escaped formula results and the
// formula cells that have no cached result (a workbook a program wrote and no spreadsheet ever saved).
func checkXMLPart(zf *zip.File, worksheet bool, nf *numFormatter, charsetReader func(string, io.Reader) (io.Reader, error)) (cellEscapes, []cellPos, error) {
	var found collected
	err := scanXMLPart(zf, worksheet, nf, charsetReader, &found)
	if err != nil {
		return nil, nil, err
	}
	return found.esc, found.uncached, nil
}

// checkSink receives what scanXMLPart finds in a worksheet, row by row.
type checkSink interface {
	// escape records the value a cell reads as instead of excelize's.
	escape(row, col int, text string)
	// uncachedFormula records a formula cell without a cached result.
	uncachedFormula(row, col int)
	// rowDone says every cell of rows up to row has been checked; false stops the scan (the reader is closed).
	rowDone(row int) bool
}

// collected is the checkSink of a part checked before it is read.
type collected struct {
	esc      cellEscapes
	uncached []cellPos
}

func (c *collected) escape(row, col int, text string) {
	if c.esc == nil {
		c.esc = cellEscapes{}
	}
	if c.esc[row] == nil {
		c.esc[row] = map[int]string{}
	}
	c.esc[row][col] = text
}

func (c *collected) uncachedFormula(row, col int) { c.uncached = append(c.uncached, cellPos{row, col}) }

func (c *collected) rowDone(int) bool { return true }

// errStopped ends a scan whose reader was closed.
var errStopped = errors.New("stopped")

// scanXMLPart is checkXMLPart's pass, reporting to sink as it goes.
func scanXMLPart(zf *zip.File, worksheet bool, nf *numFormatter, charsetReader func(string, io.Reader) (io.Reader, error), sink checkSink) error {
	rc, err := zf.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	d := xml.NewDecoder(bufio.NewReaderSize(rc, 64<<10))
	d.CharsetReader = charsetReader
	var (
		root         bool
		rowNo, colNo int
		inStr, inV   bool
		inNum        bool // a number cell whose style has a format fix
		hasF, hasV   bool // the cell has a formula, a cached value
		style        int
		v            strings.Builder
	)
	put := func(text string) { sink.escape(rowNo, colNo, text) }
	// RawToken and a stack of open elements check what Token checks (the
	// syntax, and that each end tag closes the element open) without
	// translating namespaces for every token: this pass reads every cell of
	// the sheet before the reader does, and Token was half its cost.
	var open []xml.Name
	for {
		tok, err := d.RawToken()
		if errors.Is(err, io.EOF) {
			if !root {
				return errors.New("the part has no XML root element (it is empty or cut short)")
			}
			if len(open) > 0 {
				line, _ := d.InputPos()
				return &xml.SyntaxError{Msg: "unexpected EOF", Line: line}
			}
			return nil
		}
		if err != nil {
			return err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			open = append(open, t.Name)
		case xml.EndElement:
			if len(open) == 0 || open[len(open)-1] != t.Name {
				// Token's own words.
				line, _ := d.InputPos()
				msg := "unexpected end element </" + qualified(t.Name) + ">"
				if len(open) > 0 {
					msg = "element <" + qualified(open[len(open)-1]) + "> closed by </" + qualified(t.Name) + ">"
				}
				return &xml.SyntaxError{Msg: msg, Line: line}
			}
			open = open[:len(open)-1]
		}
		if !worksheet {
			if _, ok := tok.(xml.StartElement); ok {
				root = true
			}
			continue
		}
		// Rows and cells are numbered as excelize numbers them: by their r attribute, else one past the previous.
		switch t := tok.(type) {
		case xml.StartElement:
			root = true
			switch t.Name.Local {
			case "row":
				rowNo++
				if n, err := strconv.Atoi(attr(t, "r")); err == nil {
					rowNo = n
				}
				colNo = 0
			case "c":
				colNo++
				if c, _, err := excelize.CellNameToCoordinates(attr(t, "r")); err == nil {
					colNo = c
				}
				typ := attr(t, "t")
				inStr = typ == "str"
				style, _ = strconv.Atoi(attr(t, "s"))
				inNum = (typ == "" || typ == "n") && nf != nil && nf.fixes[style] != nil
				hasF, hasV = false, false
			case "f":
				hasF = true
			case "v":
				inV = inStr || inNum
				hasV = true
				v.Reset()
			}
		case xml.CharData:
			if inV {
				v.Write(t)
			}
		case xml.EndElement:
			switch t.Name.Local {
			case "v":
				switch {
				case !inV:
				case inStr && hasXstringEscape(v.String()):
					put(decodeXstring(v.String()))
				case inNum:
					if text, ok := nf.fixCell(style, v.String()); ok {
						put(text)
					}
				}
				inV = false
			case "c":
				if hasF && !hasV {
					sink.uncachedFormula(rowNo, colNo)
				}
				inStr, inNum, inV = false, false, false
			case "row":
				if !sink.rowDone(rowNo) {
					return errStopped
				}
			}
		}
	}
}

// qualified is a raw name as written: prefix:local.
func qualified(n xml.Name) string {
	if n.Space == "" {
		return n.Local
	}
	return n.Space + ":" + n.Local
}

// attr returns the value of the attribute with the given local name, or "".
func attr(e xml.StartElement, local string) string {
	for _, a := range e.Attr {
		if a.Name.Local == local {
			return a.Value
		}
	}
	return ""
}

// cellEscapes holds the values of cells that read differently from what excelize returns (decoded escapes,
// corrected number formats), by sheet row and 1-based column.
type cellEscapes map[int]map[int]string

// sheetParts maps each sheet of the workbook to the zip part that holds it, resolved the way excelize resolves it
// (the workbook found through _rels/.rels, its relationships, targets relative to the workbook's folder or absolute
// from the package root). A workbook whose relationships cannot be read gets an empty map: excelize then reports
// the damage itself, or reads no sheet at all.
func sheetParts(zr *zip.Reader) map[string]string {
	type rel struct {
		ID     string `xml:"Id,attr"`
		Type   string `xml:"Type,attr"`
		Target string `xml:"Target,attr"`
	}
	type rels struct {
		Rels []rel `xml:"Relationship"`
	}
	type workbook struct {
		Sheets []struct {
			Name string `xml:"name,attr"`
			ID   string `xml:"http://schemas.openxmlformats.org/officeDocument/2006/relationships id,attr"`
		} `xml:"sheets>sheet"`
	}
	load := func(name string, v any) bool {
		for _, zf := range zr.File {
			if !strings.EqualFold(zf.Name, name) {
				continue
			}
			rc, err := zf.Open()
			if err != nil {
				return false
			}
			defer rc.Close()
			return xml.NewDecoder(rc).Decode(v) == nil
		}
		return false
	}
	wbPath := workbookPath(zr)
	var wb workbook
	var wbRels rels
	if !load(wbPath, &wb) || !load(relsPathOf(wbPath), &wbRels) {
		return nil
	}
	out := make(map[string]string, len(wb.Sheets))
	for _, s := range wb.Sheets {
		for _, r := range wbRels.Rels {
			if r.ID != s.ID || !strings.HasSuffix(r.Type, "/worksheet") {
				continue
			}
			out[s.Name] = relTarget(wbPath, r.Target)
		}
	}
	return out
}

// relsPathOf is the relationships part of part (xl/workbook.xml -> xl/_rels/workbook.xml.rels).
func relsPathOf(part string) string {
	return strings.TrimPrefix(path.Dir(part)+"/_rels/"+path.Base(part)+".rels", "./")
}

// relTarget is the part a relationship of part from names by target: relative to from's folder, or from the
// package root when it starts with "/"; backslashes (some writers use them) read as slashes.
func relTarget(from, target string) string {
	target = strings.ReplaceAll(target, `\`, "/")
	if strings.HasPrefix(target, "/") {
		return strings.TrimPrefix(path.Clean(target), "/")
	}
	return strings.TrimPrefix(path.Clean(path.Dir(from)+"/"+target), "/")
}

// workbookPath is the workbook part, found through _rels/.rels as excelize finds it; xl/workbook.xml by default.
func workbookPath(zr *zip.Reader) string {
	var root struct {
		Rels []struct {
			Type   string `xml:"Type,attr"`
			Target string `xml:"Target,attr"`
		} `xml:"Relationship"`
	}
	wbPath := "xl/workbook.xml"
	rc, err := openPart(zr, "_rels/.rels")
	if err != nil {
		return wbPath
	}
	defer rc.Close()
	if xml.NewDecoder(rc).Decode(&root) != nil {
		return wbPath
	}
	for _, r := range root.Rels {
		if strings.HasSuffix(r.Type, "/officeDocument") {
			wbPath = strings.TrimPrefix(r.Target, "/")
		}
	}
	return wbPath
}

// zipKindReason names what a zip that is not an xlsx appears to be.
func zipKindReason(zr *zip.Reader, names map[string]bool) string {
	switch {
	case names["xl/workbook.bin"]:
		return "binary workbooks (.xlsb) are not supported; save it as .xlsx"
	case names["word/document.xml"]:
		return "looks like a Word document (.docx), not a spreadsheet"
	case names["ppt/presentation.xml"]:
		return "looks like a PowerPoint presentation (.pptx), not a spreadsheet"
	case names["mimetype"] && names["content.xml"]:
		if mimetypeOf(zr) == "application/vnd.oasis.opendocument.spreadsheet" {
			return "OpenDocument spreadsheets (.ods) are not supported; save it as .xlsx"
		}
		return "looks like an OpenDocument file, not a spreadsheet"
	case names["xl/workbook.xml"] || names["[content_types].xml"]:
		return "the workbook is damaged: the zip archive lacks [Content_Types].xml or xl/workbook.xml"
	default:
		return "looks like a zip archive, not an Excel workbook"
	}
}

// mimetypeOf reads the small "mimetype" entry of an OpenDocument package.
func mimetypeOf(zr *zip.Reader) string {
	for _, zf := range zr.File {
		if zf.Name != "mimetype" || zf.UncompressedSize64 > 256 {
			continue
		}
		rc, err := zf.Open()
		if err != nil {
			return ""
		}
		b, _ := io.ReadAll(io.LimitReader(rc, 256))
		_ = rc.Close()
		return strings.TrimSpace(string(b))
	}
	return ""
}

// chooseSheet chooses the sheet to read and records it in r.sheet.
func (r *Reader) chooseSheet(xf *excelize.File, want string, worksheet func(string) bool) (string, error) {
	list := xf.GetSheetList()
	var sheet string
	if want != "" {
		for _, name := range list {
			if name == want {
				sheet = name
			}
		}
		if sheet == "" {
			var folded []string
			for _, name := range list {
				if strings.EqualFold(name, want) {
					folded = append(folded, name)
				}
			}
			if len(folded) == 1 {
				sheet = folded[0]
			}
		}
		if sheet == "" {
			quoted := make([]string, len(list))
			for i, name := range list {
				quoted[i] = strconv.Quote(name)
			}
			return "", r.fileErr(fmt.Sprintf("sheet %q not found; the workbook has sheets %s", want, strings.Join(quoted, ", ")))
		}
	} else {
		for _, name := range list {
			if strings.EqualFold(name, promptSheet) || !worksheet(name) {
				continue
			}
			if visible, err := xf.GetSheetVisible(name); err == nil && visible {
				sheet = name
				break
			}
		}
		if sheet == "" {
			return "", r.fileErr(`the workbook has no visible sheet to read (other than "prompt")`)
		}
	}
	r.sheet = sheet
	return sheet, nil
}

// startSheet reads the prompt sheet's A1 and starts the row iterator of sheet.
func (r *Reader) startSheet(xf *excelize.File, sheet string, escapes func(sheet string) cellEscapes) (*xlsxSource, error) {
	for _, name := range xf.GetSheetList() {
		if strings.EqualFold(name, promptSheet) {
			if err := r.readPrompt(xf, name, escapes(name)); err != nil {
				return nil, err
			}
			break
		}
	}

	rows, err := xf.Rows(sheet)
	if err != nil {
		return nil, r.inputErr(0, -1, fmt.Sprintf("the sheet is damaged and cannot be read (%v)", err))
	}
	return &xlsxSource{xf: xf, rows: rows, escapes: escapes(sheet)}, nil
}

// readPrompt reads cell A1 of the prompt sheet by streaming only its first row.
func (r *Reader) readPrompt(xf *excelize.File, name string, escapes cellEscapes) error {
	fail := func(reason string) error {
		return &InputError{File: r.file, Sheet: name, Row: 1, Column: "A", Reason: reason}
	}
	rows, err := xf.Rows(name)
	if err != nil {
		return fail(fmt.Sprintf("the prompt sheet is damaged and cannot be read (%v)", err))
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Error(); err != nil {
			return fail(fmt.Sprintf("the prompt sheet is damaged and cannot be read (%v)", err))
		}
		return nil
	}
	cells, err := rows.Columns()
	if err != nil {
		return fail(fmt.Sprintf("the prompt sheet is damaged and cannot be read (%v)", err))
	}
	escapes.apply(1, &cells)
	if len(cells) == 0 {
		return nil
	}
	p := strings.TrimSpace(cells[0])
	if n := utf8.RuneCountInString(p); n > r.lim.MaxCellChars {
		return fail(fmt.Sprintf("prompt has %d characters; the limit is %d", n, r.lim.MaxCellChars))
	}
	r.prompt, r.hasPrompt = p, p != ""
	// The rows below may hold a declaration of output columns (PromptRows).
	for row := 2; row <= maxPromptRows+1 && rows.Next(); row++ {
		cells, err := rows.Columns()
		if err != nil {
			return &InputError{File: r.file, Sheet: name, Row: row, Reason: fmt.Sprintf("the prompt sheet is damaged and cannot be read (%v)", err)}
		}
		escapes.apply(row, &cells)
		r.promptRows = append(r.promptRows, cells[:min(len(cells), maxPromptColumns)])
	}
	return nil
}

// maxPromptRows and maxPromptColumns bound what is read of the prompt sheet below A1: room for a declaration of
// the most output columns a task may have, its header and blank rows around it.
const (
	maxPromptRows    = 110
	maxPromptColumns = 8
)

// xlsxSource walks a worksheet with excelize's streaming iterator. Its Next visits every row number, including
// rows absent from the XML, so counting calls gives the sheet row number.
type xlsxSource struct {
	xf      *excelize.File
	rows    *excelize.Rows
	row     int
	escapes cellEscapes // decoded formula results, see checkXMLParts
	// check, when set, is the sheet's XML check running beside the iterator; damaged words its findings and
	// formula computes a formula cell without a cached result.
	check   *sheetCheck
	damaged func(error) error
	formula func(row, col int) (string, bool)
}

func (s *xlsxSource) next() (int, []string, error) {
	if !s.rows.Next() {
		if err := s.rows.Error(); err != nil {
			return 0, nil, &InputError{Row: s.row + 1, Reason: fmt.Sprintf("the sheet is damaged and cannot be read (%v)", err)}
		}
		if s.check != nil {
			// The iterator also ends at damage: the end is the check's to confirm.
			if _, _, err := s.check.wait(math.MaxInt); err != nil {
				return 0, nil, s.damaged(err)
			}
		}
		return 0, nil, io.EOF
	}
	s.row++
	cells, err := s.rows.Columns()
	if err != nil {
		return 0, nil, &InputError{Row: s.row, Reason: fmt.Sprintf("the row is damaged and cannot be read (%v)", err)}
	}
	s.escapes.apply(s.row, &cells)
	if s.check != nil {
		esc, formulas, err := s.check.wait(s.row)
		if err != nil {
			return 0, nil, s.damaged(err)
		}
		for _, col := range formulas {
			if v, ok := s.formula(s.row, col); ok {
				if esc == nil {
					esc = map[int]string{}
				}
				esc[col] = v
			}
		}
		if len(esc) > 0 {
			cellEscapes{s.row: esc}.apply(s.row, &cells)
		}
	}
	return s.row, cells, nil
}

// apply puts the decoded values of row's escaped cells into cells, growing it for a computed value past its end
// (excelize leaves out the empty cells at a row's end, an uncached formula among them).
func (e cellEscapes) apply(row int, cells *[]string) {
	for col, v := range e[row] {
		if col >= 1 && col > len(*cells) && v != "" && col <= DefaultMaxColumns {
			*cells = append(*cells, make([]string, col-len(*cells))...)
		}
		if col >= 1 && col <= len(*cells) {
			(*cells)[col-1] = v
		}
	}
}

// close releases the iterator and excelize's temporary files. The iterator's own error was already reported by
// next, so only the file's cleanup error matters here.
func (s *xlsxSource) close() error {
	if s.check != nil {
		s.check.close()
	}
	_ = s.rows.Close()
	return s.xf.Close()
}
