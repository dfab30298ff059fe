package sheet

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// zipEntry is one file of a hand-built zip. Raw entries are stored exactly as given (already deflated), with the
// declared uncompressed size and CRC taken from the header, which is how the tests build lying directories.
type zipEntry struct {
	name   string
	data   []byte
	raw    bool
	header zip.FileHeader
}

// fixedTime keeps generated zips byte-for-byte reproducible, so the committed corpus can be checked against the
// generator.
var fixedTime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

func buildZip(t testing.TB, entries ...zipEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		if e.raw {
			h := e.header
			h.Name, h.Method, h.Modified = e.name, zip.Deflate, fixedTime
			h.CompressedSize64 = uint64(len(e.data))
			w, err := zw.CreateRaw(&h)
			if err != nil {
				t.Fatalf("zip raw %s: %v", e.name, err)
			}
			if _, err := w.Write(e.data); err != nil {
				t.Fatalf("zip raw %s: %v", e.name, err)
			}
			continue
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: e.name, Method: zip.Deflate, Modified: fixedTime})
		if err != nil {
			t.Fatalf("zip %s: %v", e.name, err)
		}
		if _, err := w.Write(e.data); err != nil {
			t.Fatalf("zip %s: %v", e.name, err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatalf("zip close: %v", err)
	}
	return buf.Bytes()
}

// testSheet is one worksheet of a hand-built workbook: rows is the inner XML of <sheetData>.
type testSheet struct {
	name  string
	state string // "", "hidden" or "veryHidden"
	rows  string
	// before and after are worksheet XML around <sheetData> (e.g. <dimension>, <mergeCells>).
	before, after string
}

// testBook is a hand-built workbook with the optional parts Excel writes when a file uses them. Zero fields leave
// the part out, so testBook{sheets: s} is exactly workbookEntries(s...).
type testBook struct {
	sheets []testSheet
	// styles is the inner XML of xl/styles.xml's <styleSheet> (<numFmts>, <cellXfs>).
	styles string
	// sst holds the shared strings, each the inner XML of one <si>.
	sst []string
	// date1904 sets the workbook to the 1904 date system (Excel for Mac before 2011).
	date1904 bool
	// contentTypes, rels, workbookTail and parts add content-type overrides, workbook relationships, XML after
	// <sheets> in workbook.xml (e.g. <externalReferences>) and zip entries (e.g. external link parts).
	contentTypes, rels, workbookTail string
	parts                            []zipEntry
}

// workbookEntries returns the parts of a minimal xlsx, the way Excel lays them out, so tests can add, drop or
// replace parts.
func workbookEntries(sheets ...testSheet) []zipEntry {
	return bookEntries(testBook{sheets: sheets})
}

// bookEntries returns the parts of b; the worksheets come last, in order, so tests can replace them.
func bookEntries(b testBook) []zipEntry {
	sheets := b.sheets
	var ct, wb, rels strings.Builder
	ct.WriteString(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` +
		`<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">` +
		`<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>` +
		`<Default Extension="xml" ContentType="application/xml"/>` +
		`<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>`)
	wb.WriteString(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` +
		`<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" ` +
		`xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">`)
	if b.date1904 {
		wb.WriteString(`<workbookPr date1904="1"/>`)
	}
	wb.WriteString(`<sheets>`)
	rels.WriteString(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` +
		`<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">`)
	var parts []zipEntry
	for i, s := range sheets {
		n := i + 1
		fmt.Fprintf(&ct, `<Override PartName="/xl/worksheets/sheet%d.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>`, n)
		state := ""
		if s.state != "" {
			state = ` state="` + s.state + `"`
		}
		fmt.Fprintf(&wb, `<sheet name="%s" sheetId="%d"%s r:id="rId%d"/>`, html.EscapeString(s.name), n, state, n)
		fmt.Fprintf(&rels, `<Relationship Id="rId%d" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet%d.xml"/>`, n, n)
		parts = append(parts, zipEntry{
			name: fmt.Sprintf("xl/worksheets/sheet%d.xml", n),
			data: []byte(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` +
				`<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">` + s.before + `<sheetData>` +
				s.rows + `</sheetData>` + s.after + `</worksheet>`),
		})
	}
	n := len(sheets)
	if b.styles != "" {
		n++
		ct.WriteString(`<Override PartName="/xl/styles.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.styles+xml"/>`)
		fmt.Fprintf(&rels, `<Relationship Id="rId%d" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/styles" Target="styles.xml"/>`, n)
		parts = append([]zipEntry{{name: "xl/styles.xml", data: []byte(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` +
			`<styleSheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">` + b.styles + `</styleSheet>`)}}, parts...)
	}
	if b.sst != nil {
		n++
		ct.WriteString(`<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>`)
		fmt.Fprintf(&rels, `<Relationship Id="rId%d" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>`, n)
		var sst strings.Builder
		fmt.Fprintf(&sst, `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>`+
			`<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" count="%d" uniqueCount="%d">`, len(b.sst), len(b.sst))
		for _, si := range b.sst {
			sst.WriteString(`<si>` + si + `</si>`)
		}
		sst.WriteString(`</sst>`)
		parts = append([]zipEntry{{name: "xl/sharedStrings.xml", data: []byte(sst.String())}}, parts...)
	}
	rels.WriteString(b.rels)
	ct.WriteString(b.contentTypes + `</Types>`)
	wb.WriteString(`</sheets>` + b.workbookTail + `</workbook>`)
	rels.WriteString(`</Relationships>`)
	parts = append(b.parts, parts...)
	return append([]zipEntry{
		{name: "[Content_Types].xml", data: []byte(ct.String())},
		{name: "_rels/.rels", data: []byte(`<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` +
			`<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">` +
			`<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/>` +
			`</Relationships>`)},
		{name: "xl/workbook.xml", data: []byte(wb.String())},
		{name: "xl/_rels/workbook.xml.rels", data: []byte(rels.String())},
	}, parts...)
}

// buildBook builds the workbook b describes.
func buildBook(t testing.TB, b testBook) []byte {
	t.Helper()
	return buildZip(t, bookEntries(b)...)
}

// buildXLSX builds a minimal workbook with the given sheets.
func buildXLSX(t testing.TB, sheets ...testSheet) []byte {
	t.Helper()
	return buildZip(t, workbookEntries(sheets...)...)
}

// row renders one <row> with inline-string cells from column A; "" leaves the cell out.
func row(n int, vals ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `<row r="%d">`, n)
	for i, v := range vals {
		if v == "" {
			continue
		}
		fmt.Fprintf(&b, `<c r="%s%d" t="inlineStr"><is><t xml:space="preserve">%s</t></is></c>`, ColumnName(i+1), n, html.EscapeString(v))
	}
	b.WriteString(`</row>`)
	return b.String()
}

// writeFile writes data under dir and returns the path.
func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatalf("write %s: %v", p, err)
	}
	return p
}

// readAll drains a Reader, failing the test on any error.
func readAll(t testing.TB, r *Reader) []Record {
	t.Helper()
	var recs []Record
	for {
		rec, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return recs
			}
			t.Fatalf("Next: %v", err)
		}
		recs = append(recs, rec)
	}
}
