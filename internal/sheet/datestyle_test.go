package sheet

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"
)

func TestWithDateStyle(t *testing.T) {
	const ns = `xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"`
	tests := []struct {
		name, in   string
		wantIndex  int
		wantFmtID  string
		wantInside []string
	}{
		{"no custom formats",
			`<?xml version="1.0"?><styleSheet ` + ns + `><fonts count="1"><font/></fonts><cellStyleXfs count="1"><xf/></cellStyleXfs><cellXfs count="2"><xf numFmtId="0"/><xf numFmtId="14"><alignment/></xf></cellXfs></styleSheet>`,
			2, "164", []string{`<styleSheet ` + ns + `><numFmts count="1"><numFmt numFmtId="164" formatCode="yyyy-mm-dd"/></numFmts><fonts`, `<cellXfs count="3">`}},
		{"custom formats above 164",
			`<styleSheet ` + ns + `><numFmts count="2"><numFmt numFmtId="170" formatCode="0.0"/><numFmt numFmtId="165" formatCode="@"/></numFmts><cellXfs count="1"><xf/></cellXfs></styleSheet>`,
			1, "171", []string{`<numFmts count="3">`, `<numFmt numFmtId="165" formatCode="@"/><numFmt numFmtId="171" formatCode="yyyy-mm-dd"/></numFmts>`}},
		{"an empty list of formats",
			`<styleSheet ` + ns + `><numFmts count="0"/><cellXfs count="1"><xf/></cellXfs></styleSheet>`,
			1, "164", []string{`<numFmts count="1"><numFmt numFmtId="164"`}},
		{"a namespace prefix, a count that lies",
			`<x:styleSheet xmlns:x="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><x:cellXfs count="9"><x:xf/><x:xf/></x:cellXfs></x:styleSheet>`,
			2, "164", []string{`<x:numFmts count="1"><x:numFmt numFmtId="164"`, `<x:cellXfs count="3"><x:xf/><x:xf/><x:xf numFmtId="164"`}},
	}
	for _, tt := range tests {
		got, index, err := withDateStyle([]byte(tt.in))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if index != tt.wantIndex {
			t.Errorf("%s: index %d, want %d", tt.name, index, tt.wantIndex)
		}
		if !strings.Contains(string(got), `xf numFmtId="`+tt.wantFmtID+`" fontId="0" fillId="0" borderId="0" xfId="0" applyNumberFormat="1"/></`) {
			t.Errorf("%s: no date cell format with id %s:\n%s", tt.name, tt.wantFmtID, got)
		}
		for _, w := range tt.wantInside {
			if !strings.Contains(string(got), w) {
				t.Errorf("%s: %q missing from\n%s", tt.name, w, got)
			}
		}
		for dec := xml.NewDecoder(bytes.NewReader(got)); ; {
			if _, err := dec.Token(); err != nil {
				if err != io.EOF {
					t.Errorf("%s: not well-formed: %v", tt.name, err)
				}
				break
			}
		}
	}
	if _, _, err := withDateStyle([]byte(`<styleSheet><fonts/></styleSheet>`)); err == nil {
		t.Error("a style sheet without cellXfs: no error")
	}
}

// TestWriterDates: a new result workbook holds dates as date cells Excel shows as ISO dates.
func TestWriterDates(t *testing.T) {
	w, err := NewWriter("result", []string{"name", "launched"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	day := time.Date(2026, 12, 1, 15, 4, 0, 0, time.FixedZone("x", 3600))
	for _, v := range []Value{Date(day), Date(time.Date(1900, 2, 28, 0, 0, 0, 0, time.UTC)), Date(time.Date(1850, 1, 1, 0, 0, 0, 0, time.UTC))} {
		if err := w.WriteCells([]Value{Text("x"), v}); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := excelize.OpenReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for ref, want := range map[string]string{"B2": "2026-12-01", "B3": "1900-02-28", "B4": "1850-01-01"} {
		if got, _ := f.GetCellValue("result", ref); got != want {
			t.Errorf("%s shows %q, want %q", ref, got, want)
		}
	}
	raw, _ := f.GetCellValue("result", "B2", excelize.Options{RawCellValue: true})
	if raw != "46357" {
		t.Errorf("B2 holds %q, want the serial number 46357", raw)
	}
	if typ, _ := f.GetCellType("result", "B4"); typ != excelize.CellTypeInlineString && typ != excelize.CellTypeSharedString {
		t.Errorf("a date before 1900 is not text: %v", typ)
	}
	if got := Date(day).String(); got != "2026-12-01" {
		t.Errorf("String() = %q", got)
	}
}
