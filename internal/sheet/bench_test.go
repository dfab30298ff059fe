package sheet

import (
	"errors"
	"fmt"
	"io"
	"testing"
)

const benchRows = 10_000

var benchHeader = []string{"商品编号", "商品名称", "类目", "卖点", "output", "status", "error"}

func benchRow(i int) []string {
	return []string{
		fmt.Sprintf("SKU-%06d", i), fmt.Sprintf("有机苹果 %d 号", i), "生鲜/水果",
		"产地直发，脆甜多汁，单果 200g 以上",
		"精选高原有机苹果，阳光充足、昼夜温差大，果肉脆甜多汁，每一口都是自然的味道。产地直发，新鲜到家。",
		"SUCCEEDED", "",
	}
}

func BenchmarkReadXLSX(b *testing.B) {
	rows := make([][]string, benchRows)
	for i := range rows {
		rows[i] = benchRow(i)
	}
	path := writeFile(b, b.TempDir(), "bench.xlsx", writeWorkbook(b, "商品", benchHeader, rows))
	b.ReportAllocs()
	for b.Loop() {
		r, err := Open(path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			_, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if err := r.Close(); err != nil {
			b.Fatal(err)
		}
		if n != benchRows {
			b.Fatalf("read %d rows, want %d", n, benchRows)
		}
	}
	b.ReportMetric(float64(benchRows*b.N)/b.Elapsed().Seconds(), "rows/s")
}

func BenchmarkWriteXLSX(b *testing.B) {
	row := benchRow(1)
	b.ReportAllocs()
	for b.Loop() {
		w, err := NewWriter("结果", benchHeader)
		if err != nil {
			b.Fatal(err)
		}
		for range benchRows {
			if err := w.WriteRow(row); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := w.WriteTo(io.Discard); err != nil {
			b.Fatal(err)
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(benchRows*b.N)/b.Elapsed().Seconds(), "rows/s")
}
