package sheet

import (
	"archive/zip"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"unicode/utf16"
)

// OverflowSheet is the sheet a result adds for answers longer than a cell holds (MaxCellChars): each such answer is
// written there whole, in consecutive rows of at most overflowChunk characters, and its cell in the row holds the
// beginning of the answer and a marker that says where the rest is.
const OverflowSheet = "batchgen_overflow"

// overflowChunk is how many characters (UTF-16 units) one overflow row holds: under the cell limit, with room for
// nothing else, so a chunk never needs cutting again.
const overflowChunk = 32_000

// overflow collects the answers that do not fit a cell into the rows of the overflow sheet, spooled to a temporary
// file so that memory does not grow with them.
type overflow struct {
	tempDir string
	sheet   string // its name: OverflowSheet, or with a number when the workbook has one already
	file    *os.File
	w       *bufio.Writer
	rows    int // rows written, header included
}

// add writes text (too long for a cell) to the overflow sheet and returns what its own cell holds instead.
func (o *overflow) add(sheetRow int, column, text string) (string, error) {
	if o.file == nil {
		f, err := os.CreateTemp(o.tempDir, "batchgen-overflow-*.xml")
		if err != nil {
			return "", fmt.Errorf("overflow sheet: %w", err)
		}
		o.file, o.w = f, bufio.NewWriterSize(f, 64<<10)
		o.row(Text("row"), Text("column"), Text("part"), Text("text"))
	}
	first := o.rows + 1
	parts := splitUnits(text, overflowChunk)
	for i, part := range parts {
		o.row(Int(int64(sheetRow)), Text(column), Int(int64(i+1)), Text(part))
	}
	if err := o.w.Flush(); err != nil { // surfaces a full disk here, not at the end
		return "", fmt.Errorf("overflow sheet: %w", err)
	}
	n := 0
	for _, r := range text {
		n += utf16.RuneLen(r)
	}
	marker := fmt.Sprintf(" … [%d characters in all; the whole answer is in sheet %s, rows %d to %d]", n, o.sheet, first, o.rows)
	head, _ := truncateUnits(text, MaxCellChars-len(marker)) // len counts bytes, at least the marker's units
	return head + marker, nil
}

// row writes one row of the overflow sheet.
func (o *overflow) row(values ...Value) {
	o.rows++
	fmt.Fprintf(o.w, `<row r="%d">`, o.rows)
	for i, v := range values {
		writeCellXML(o.w, "", o.rows, i+1, v, "")
	}
	o.w.WriteString("</row>")
}

// close removes the spooled rows.
func (o *overflow) close() {
	if o.file != nil {
		o.file.Close()
		os.Remove(o.file.Name())
	}
}

// writePart writes the overflow sheet as the part name of zw.
func (o *overflow) writePart(zw *zip.Writer, name string) error {
	if _, err := o.file.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("overflow sheet: %w", err)
	}
	w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate})
	if err != nil {
		return fmt.Errorf("overflow sheet: %w", err)
	}
	io.WriteString(w, `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>`+"\n"+
		`<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">`+
		fmt.Sprintf(`<dimension ref="A1:D%d"/>`, o.rows)+
		`<cols><col min="1" max="3" width="10" customWidth="1"/><col min="4" max="4" width="100" customWidth="1"/></cols><sheetData>`)
	if _, err := io.Copy(w, o.file); err != nil {
		return fmt.Errorf("overflow sheet: %w", err)
	}
	_, err = io.WriteString(w, `</sheetData></worksheet>`)
	return err
}

// splitUnits cuts s into pieces of at most n UTF-16 units, at character boundaries.
func splitUnits(s string, n int) []string {
	var parts []string
	for s != "" {
		head, _ := truncateUnits(s, n)
		parts = append(parts, head)
		s = s[len(head):]
	}
	return parts
}

// truncateUnits cuts s to at most n UTF-16 units at a character boundary; ok is false when it had to.
func truncateUnits(s string, n int) (string, bool) {
	units := 0
	for i, r := range s {
		units += utf16.RuneLen(r)
		if units > n {
			return s[:i], false
		}
	}
	return s, true
}

// packageEdit names the three package parts that declare the workbook's sheets: [Content_Types].xml, the workbook
// and its relationships. Adding a sheet rewrites each with one element added before its closing tag; the rest of
// each stays as it was.
type packageEdit struct {
	contentTypes, workbook, workbookRels string // part names
}

// findPackageParts locates the parts addSheet edits.
func findPackageParts(zr *zip.Reader) packageEdit {
	wb := workbookPath(zr)
	return packageEdit{
		contentTypes: "[Content_Types].xml",
		workbook:     wb,
		workbookRels: relsPathOf(wb),
	}
}

// editPart returns the content of part with insert placed before its last closing tag named closing.
func editPart(zr *zip.Reader, part, closing string, insert func(prefix string) string) ([]byte, error) {
	rc, err := openPart(zr, part)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", part, err)
	}
	// The closing tag, with whatever namespace prefix the part uses.
	i := bytes.LastIndex(b, []byte(":"+closing+">"))
	j := bytes.LastIndex(b, []byte("</"+closing+">"))
	prefix := ""
	if i > j {
		k := bytes.LastIndex(b[:i], []byte("</"))
		if k < 0 {
			return nil, fmt.Errorf("%s: no </%s>", part, closing)
		}
		prefix, j = string(b[k+2:i+1]), k
	}
	if j < 0 {
		return nil, fmt.Errorf("%s: no </%s>", part, closing)
	}
	out := make([]byte, 0, len(b)+256)
	out = append(out, b[:j]...)
	out = append(out, insert(prefix)...)
	return append(out, b[j:]...), nil
}

// declareSheets returns the three edited package parts that declare the added worksheets, in order, after the
// workbook's own.
func declareSheets(zr *zip.Reader, pkg packageEdit, added []addedSheet) (map[string][]byte, error) {
	const relsNS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
	rel, maxID := scanWorkbook(zr, pkg.workbook, relsNS)
	decl := ""
	if rel == "" { // the workbook binds no prefix to it: bind one on each element
		rel, decl = "bgr", ` xmlns:bgr="`+relsNS+`"`
	}
	var types, rels, sheets strings.Builder
	for i, a := range added {
		relID := "rIdBatchgen" + strconv.Itoa(i+1)
		target := "/" + a.part
		if dir := path.Dir(pkg.workbook); dir != "." && strings.HasPrefix(a.part, dir+"/") {
			target = strings.TrimPrefix(a.part, dir+"/")
		}
		types.WriteString(`<Override PartName="/` + a.part + `" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>`)
		rels.WriteString(`<Relationship Id="` + relID + `" Type="` + relsNS + `/worksheet" Target="` + target + `"/>`)
		sheets.WriteString(`<{prefix}sheet` + decl + ` name="` + a.name + `" sheetId="` + strconv.Itoa(maxID+i+1) + `" ` + rel + `:id="` + relID + `"/>`)
	}
	out := map[string][]byte{}
	var err error
	if out[pkg.contentTypes], err = editPart(zr, pkg.contentTypes, "Types", func(string) string { return types.String() }); err != nil {
		return nil, err
	}
	if out[pkg.workbookRels], err = editPart(zr, pkg.workbookRels, "Relationships", func(string) string { return rels.String() }); err != nil {
		return nil, err
	}
	if out[pkg.workbook], err = editPart(zr, pkg.workbook, "sheets", func(prefix string) string {
		return strings.ReplaceAll(sheets.String(), "{prefix}", prefix)
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// writePromptPart writes the added prompt sheet: the template in A1, in a wide column, and rows (a declaration of
// output columns) from row 3.
func writePromptPart(zw *zip.Writer, name, prompt string, rows [][]string) error {
	w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate})
	if err != nil {
		return fmt.Errorf("prompt sheet: %w", err)
	}
	bw := bufio.NewWriter(w)
	width := 1
	for _, r := range rows {
		width = max(width, len(r))
	}
	ref := "A1"
	if len(rows) > 0 {
		ref = "A1:" + ColumnName(width) + strconv.Itoa(len(rows)+2)
	}
	bw.WriteString(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` + "\n" +
		`<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><dimension ref="` + ref + `"/>` +
		`<cols><col min="1" max="1" width="100" customWidth="1"/></cols><sheetData><row r="1">`)
	writeCellXML(bw, "", 1, 1, Text(cleanText(prompt)), "")
	bw.WriteString(`</row>`)
	for i, r := range rows {
		fmt.Fprintf(bw, `<row r="%d">`, i+3)
		for j, v := range r {
			writeCellXML(bw, "", i+3, j+1, Text(fitCell(cleanText(v))), "")
		}
		bw.WriteString(`</row>`)
	}
	bw.WriteString(`</sheetData></worksheet>`)
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("prompt sheet: %w", err)
	}
	return nil
}

// scanWorkbook reads what adding a sheet needs from the workbook part: the prefix its root element binds to ns
// (usually "r"; "" when none), and the highest sheetId it uses.
func scanWorkbook(zr *zip.Reader, workbook, ns string) (prefix string, maxID int) {
	rc, err := openPart(zr, workbook)
	if err != nil {
		return "", 0
	}
	defer rc.Close()
	sc := newXMLScanner(rc)
	root := true
	for {
		raw, err := sc.next(nil)
		if err != nil {
			return prefix, maxID
		}
		m := parseMarkup(raw)
		switch {
		case m.local == "" || m.end:
		case root:
			root = false
			for _, a := range m.attrs() {
				if strings.HasPrefix(a.name, "xmlns:") && a.value == ns {
					prefix = strings.TrimPrefix(a.name, "xmlns:")
				}
			}
		case m.is("sheet"):
			if n, err := strconv.Atoi(attrOr(m, "sheetId")); err == nil {
				maxID = max(maxID, n)
			}
		}
	}
}

// openPart opens the zip part named name, in any letter case.
func openPart(zr *zip.Reader, name string) (io.ReadCloser, error) {
	for _, f := range zr.File {
		if strings.EqualFold(f.Name, name) {
			return f.Open()
		}
	}
	return nil, fmt.Errorf("the workbook has no part %s", name)
}

// freeName returns base, or base with the smallest number from 2 that makes it unused.
func freeName(base string, used func(string) bool) string {
	name := base
	for i := 2; used(name); i++ {
		name = base + strconv.Itoa(i)
	}
	return name
}
