package sheet

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// TestDamagedWorksheetXML cuts and breaks a worksheet's XML in the ways faulty exporters and interrupted uploads
// do. Each must be rejected as a damaged workbook naming the part, never read as a shorter sheet: excelize's row
// iterator stops quietly at the first XML error, and reads a part without a root element as an empty sheet.
func TestDamagedWorksheetXML(t *testing.T) {
	t.Parallel()
	const decl = `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>`
	full := decl + `<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData>` +
		row(1, "名称", "价格") + row(2, "苹果", "3") + row(3, "梨", "4") + `</sheetData></worksheet>`
	cut := func(marker string, offset int) string {
		i := strings.Index(full, marker)
		if i < 0 {
			t.Fatalf("no %q in the sheet", marker)
		}
		return full[:i+offset]
	}
	const damaged = "x.xlsx: the workbook is damaged and cannot be read ("
	const eof = "XML syntax error on line 1: unexpected EOF)"
	cases := []struct {
		name  string
		sheet string // the XML of xl/worksheets/sheet1.xml
		want  string
	}{
		{"cut inside the last closing tag", full[:len(full)-1], damaged + "xl/worksheets/sheet1.xml: " + eof},
		{"cut before </worksheet>", cut("</worksheet>", 0), damaged + "xl/worksheets/sheet1.xml: " + eof},
		{"cut before </sheetData>", cut("</sheetData>", 0), damaged + "xl/worksheets/sheet1.xml: " + eof},
		{"cut between rows", cut(`<row r="3">`, 0), damaged + "xl/worksheets/sheet1.xml: " + eof},
		{"cut inside a start tag", cut(`<row r="2">`, 5), damaged + "xl/worksheets/sheet1.xml: XML syntax error on line 1: unexpected EOF)"},
		{"cut inside a character", cut("苹果", 1), damaged + "xl/worksheets/sheet1.xml: XML syntax error on line 1: invalid UTF-8)"},
		{"cut after the header row", cut(`<row r="2">`, 0), damaged + "xl/worksheets/sheet1.xml: " + eof},
		{"cut after the declaration", decl, damaged + "xl/worksheets/sheet1.xml: the part has no XML root element (it is empty or cut short))"},
		{"empty part", "", damaged + "xl/worksheets/sheet1.xml: the part has no XML root element (it is empty or cut short))"},
		{"bad tag", strings.Replace(full, `<row r="3">`, `<row r="3"<`, 1), damaged + "xl/worksheets/sheet1.xml: XML syntax error on line 1: expected attribute name in element)"},
		{"mismatched end tag", strings.Replace(full, `</row><row r="3">`, `</rows><row r="3">`, 1), damaged + "xl/worksheets/sheet1.xml: XML syntax error on line 1: element <row> closed by </rows>)"},
		{"unescaped <", strings.Replace(full, "梨", "1 < 2", 1), damaged + "xl/worksheets/sheet1.xml: XML syntax error on line 1: expected element name after <)"},
		{"a second root cut short", full + `<worksheet>`, damaged + "xl/worksheets/sheet1.xml: " + eof},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			entries := workbookEntries(testSheet{name: "Sheet1"})
			entries[len(entries)-1].data = []byte(c.sheet)
			path := writeFile(t, t.TempDir(), "x.xlsx", buildZip(t, entries...))
			_, err := Validate(path, Options{})
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("Validate error = %v (%T), want *InputError", err, err)
			}
			if diff := cmp.Diff(c.want, err.Error()); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDamagedSheetParts covers damage found through the workbook's relationships: a sheet stored outside
// xl/worksheets/ is checked like any other, and a sheet whose part is missing rejects the workbook.
func TestDamagedSheetParts(t *testing.T) {
	t.Parallel()
	good := row(1, "名称") + row(2, "苹果")
	moved := func(sheetXML string) []zipEntry {
		entries := workbookEntries(testSheet{name: "Sheet1", rows: good})
		last := &entries[len(entries)-1]
		last.name = "xl/data/Sheet-A.xml"
		if sheetXML != "" {
			last.data = []byte(sheetXML)
		}
		for i := range entries {
			if entries[i].name == "xl/_rels/workbook.xml.rels" {
				entries[i].data = []byte(strings.Replace(string(entries[i].data), `Target="worksheets/sheet1.xml"`, `Target="/xl/data/Sheet-A.xml"`, 1))
			}
		}
		return entries
	}
	missing := workbookEntries(testSheet{name: "Sheet1", rows: good}, testSheet{name: "旧表", state: "hidden", rows: good})
	missing = missing[:len(missing)-1]
	cases := []struct {
		name    string
		entries []zipEntry
		want    string
	}{
		{"sheet outside xl/worksheets, intact", moved(""), ""},
		{"sheet outside xl/worksheets, cut short", moved(`<?xml version="1.0"?><worksheet><sheetData>` + good),
			"x.xlsx: the workbook is damaged and cannot be read (xl/data/Sheet-A.xml: XML syntax error on line 1: unexpected EOF)"},
		{"a sheet's part is missing", missing,
			`x.xlsx: the workbook is damaged and cannot be read (sheet "旧表": its part xl/worksheets/sheet2.xml is missing from the file)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, t.TempDir(), "x.xlsx", buildZip(t, c.entries...))
			sum, err := Validate(path, Options{})
			if c.want == "" {
				if err != nil || sum.Rows != 1 {
					t.Fatalf("Validate = %+v, %v; want 1 row", sum, err)
				}
				return
			}
			if err == nil || err.Error() != c.want {
				t.Errorf("Validate error = %v\nwant %s", err, c.want)
			}
		})
	}
}

// TestDecodeXstring pins down ECMA-376's _xHHHH_ escapes (Part 1, §22.9.2.19).
func TestDecodeXstring(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"plain", "plain"},
		{"a_x000D_b", "a\rb"},
		{"_x000D__x000A_", "\r\n"},
		{"lower _x000d_", "lower \r"},
		{"_x005F_x000D_", "_x000D_"},
		{"_x005F_", "_"},
		{"_x005F__x005F_", "__"},
		{"_x0041__x0042_", "AB"},
		{"_xD83D__xDE00_", "😀"},
		{"lone high _xD83D_ then", "lone high \uFFFD then"},
		{"lone low _xDE00_", "lone low \uFFFD"},
		{"high then text _xD83D_x", "high then text \uFFFDx"},
		{"too short _x00D_", "too short _x00D_"},
		{"not hex _xGGGG_", "not hex _xGGGG_"},
		{"unterminated _x000D", "unterminated _x000D"},
		{"capital X _X000D_", "capital X _X000D_"},
		{"中文_x0009_制表", "中文\t制表"},
	}
	for _, c := range cases {
		if got := decodeXstring(c.in); got != c.want {
			t.Errorf("decodeXstring(%q) = %q, want %q", c.in, got, c.want)
		}
		if got, want := hasXstringEscape(c.in), decodeXstring(c.in) != c.in; got != want {
			t.Errorf("hasXstringEscape(%q) = %v, want %v", c.in, got, want)
		}
	}
}

// FuzzDecodeXstring checks decoding never panics, always yields valid UTF-8 from valid UTF-8, and leaves text
// without escapes alone.
func FuzzDecodeXstring(f *testing.F) {
	for _, s := range []string{"a_x000D_b", "_x005F_x000D_", "_xD83D__xDE00_", "_xD83D_", "_x", "__x0041__"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := decodeXstring(s)
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Errorf("decodeXstring(%q) = %q, not valid UTF-8", s, got)
		}
		if !hasXstringEscape(s) && got != s {
			t.Errorf("decodeXstring(%q) = %q, want it unchanged", s, got)
		}
	})
}
