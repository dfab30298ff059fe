package sheet

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestZZMisc(t *testing.T) {
	try := func(name string, b []byte, opts Options) {
		p := writeFile(t, t.TempDir(), name, b)
		start := time.Now()
		r, err := Open(p, opts)
		if err != nil {
			fmt.Println(name, "OPEN ERR", err, time.Since(start))
			return
		}
		defer r.Close()
		var got []Record
		for {
			rec, err := r.Next()
			if err != nil {
				fmt.Println(name, "END", err)
				break
			}
			got = append(got, rec)
		}
		if len(got) > 5 {
			got = got[:5]
		}
		fmt.Printf("%s %v header=%q recs=%+v\n", name, time.Since(start), r.Header(), got)
	}
	try("nul.xlsx", buildXLSX(t, testSheet{name: "S", rows: row(1, "a") + `<row r="2"><c r="A2" t="inlineStr"><is><t>x&#0;y</t></is></c></row>` + row(3, "z")}), Options{})
	try("ctrl.xlsx", buildXLSX(t, testSheet{name: "S", rows: row(1, "a") + `<row r="2"><c r="A2" t="inlineStr"><is><t>x` + "\x01" + `y</t></is></c></row>` + row(3, "z")}), Options{})
	try("badxml.xlsx", buildXLSX(t, testSheet{name: "S", rows: row(1, "a") + row(2, "b") + `<row r="3"><c r="A3" t="inlineStr"><is><t>x</is></c></row>` + row(4, "z")}), Options{})
	try("date.xlsx", buildXLSX(t, testSheet{name: "S", rows: row(1, "a", "b") + `<row r="2"><c r="A2" t="d"><v>2024-01-15T00:00:00</v></c><c r="B2" t="d"><v>2024-01-15T10:30:00Z</v></c></row>`}), Options{})
	var sp strings.Builder
	sp.WriteString(row(1, "a", "b", "c") + row(2, "1") + row(3, "2") + row(4, "3"))
	sp.WriteString(`<row r="1048576" s="1" customFormat="1"><c r="A1048576" s="1"/><c r="B1048576" t="inlineStr"><is><t> </t></is></c></row>`)
	try("sparse.xlsx", buildXLSX(t, testSheet{name: "S", before: `<dimension ref="A1:C1048576"/>`, rows: sp.String()}), Options{})
	try("far.xlsx", buildXLSX(t, testSheet{name: "S", rows: row(1, "a") + row(2, "1") + row(3, "2") + row(1048576, "3")}), Options{})
	var h, d strings.Builder
	fmt.Fprintf(&h, `<row r="1">`)
	fmt.Fprintf(&d, `<row r="2">`)
	for i := 1; i <= 10000; i++ {
		fmt.Fprintf(&h, `<c r="%s1" t="inlineStr"><is><t>c%d</t></is></c>`, ColumnName(i), i)
		fmt.Fprintf(&d, `<c r="%s2"><v>%d</v></c>`, ColumnName(i), i)
	}
	h.WriteString("</row>")
	d.WriteString("</row>")
	b := buildXLSX(t, testSheet{name: "S", rows: h.String() + d.String()})
	fmt.Println("wide size", len(b))
	try("wide.xlsx", b, Options{})
}
