package sheet

import (
	"fmt"
	"html"
	"strings"
	"testing"
)

func TestZZScratch(t *testing.T) {
	type c struct{ v, typ, fmtc string }
	cells := []c{
		{"45306", "", "14"}, {"45306", "", "yyyy-mm-dd"}, {"45306", "", "yyyy\"年\"m\"月\"d\"日\""}, {"45306.5", "", "22"},
		{"0.5", "", "hh:mm:ss"}, {"1.5", "", "[h]:mm"}, {"0.125", "", "9"}, {"0.125", "", "10"}, {"-1234.5", "", "\"¥\"#,##0.00"},
		{"-1234.5", "", "$#,##0.00_);($#,##0.00)"}, {"1234.5", "", "[$€-407] #,##0.00"}, {"-1234.5", "", "7"}, {"-1234.5", "", "8"},
		{"1.75", "", "# ?/?"}, {"0.3333333", "", "# ??/??"}, {"1.75", "", "12"}, {"123456", "", "0.00E+00"}, {"123456", "", "11"},
		{"00123", "s", "49"}, {"123", "", "00000"}, {"123", "", "49"}, {"12345678901234567890", "s", "0"}, {"12345678901234567890", "s", "49"},
		{"12345678901234567890", "", "0"}, {"12345678901234567890", "", "1"}, {"0.30000000000000004", "", "0"}, {"1E-3", "", "0"},
		{"1", "b", "0"}, {"0", "b", "0"}, {"#DIV/0!", "e", "0"}, {"#N/A", "e", "0"}, {"1234.5", "", "43"}, {"-1234.5", "", "44"},
		{"45306", "", "m/d/yyyy"}, {"45306", "", "[$-F800]dddd, mmmm dd, yyyy"}, {"0", "", "14"}, {"1", "", "14"}, {"60", "", "14"},
		{"45306", "", "mmm-yy"}, {"45306", "", "d-mmm"}, {"2024-01-15T00:00:00Z", "d", "14"}, {"0.000123", "", "0"}, {"123456789012", "", "0"},
		{"1234567890123456", "", "0"}, {"-0.5", "", "0%"}, {"12.5", "", "0.0\" kg\""}, {"5", "", "[Red]0;[Blue]-0;\"zero\""}, {"0", "", "[Red]0;[Blue]-0;\"zero\""},
		{"0012", "s", "0"}, {"45306", "", "@"},
	}
	var fmts, xfs strings.Builder
	var rows strings.Builder
	rows.WriteString(row(1, "h"))
	for i, cl := range cells {
		id := cl.fmtc
		if strings.Trim(cl.fmtc, "0123456789") != "" || cl.fmtc == "00000" {
			id = fmt.Sprint(164 + i)
			fmt.Fprintf(&fmts, `<numFmt numFmtId="%s" formatCode="%s"/>`, id, html.EscapeString(cl.fmtc))
		}
		fmt.Fprintf(&xfs, `<xf numFmtId="%s" applyNumberFormat="1"/>`, id)
		v := cl.v
		typ := ""
		var sst string
		_ = sst
		switch cl.typ {
		case "s":
			fmt.Fprintf(&rows, `<row r="%d"><c r="A%d" s="%d" t="inlineStr"><is><t>%s</t></is></c></row>`, i+2, i+2, i+1, v)
			continue
		case "":
		default:
			typ = ` t="` + cl.typ + `"`
		}
		fmt.Fprintf(&rows, `<row r="%d"><c r="A%d" s="%d"%s><v>%s</v></c></row>`, i+2, i+2, i+1, typ, v)
	}
	styles := `<numFmts>` + fmts.String() + `</numFmts><fonts count="1"><font/></fonts><fills count="1"><fill/></fills><borders count="1"><border/></borders><cellStyleXfs count="1"><xf/></cellStyleXfs><cellXfs><xf numFmtId="0"/>` + xfs.String() + `</cellXfs>`
	for _, d1904 := range []bool{false, true} {
		path := writeFile(t, t.TempDir(), "x.xlsx", buildBook(t, testBook{sheets: []testSheet{{name: "S", rows: rows.String()}}, styles: styles, date1904: d1904}))
		r, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		recs := readAll(t, r)
		for i, rc := range recs {
			fmt.Printf("1904=%v %-25q %-4s %-40q -> %q\n", d1904, cells[i].v, cells[i].typ, cells[i].fmtc, rc.Values[0])
		}
		r.Close()
	}
}
