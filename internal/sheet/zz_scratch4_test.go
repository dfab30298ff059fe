package sheet

import (
	"archive/zip"
	"bytes"
	"testing"
)

func BenchmarkZZCheckXML(b *testing.B) {
	rows := make([][]string, benchRows)
	for i := range rows {
		rows[i] = benchRow(i)
	}
	data := writeWorkbook(b, "商品", benchHeader, rows)
	zr, _ := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	for b.Loop() {
		if err := checkXMLParts(zr, nil); err != nil {
			b.Fatal(err)
		}
	}
}
