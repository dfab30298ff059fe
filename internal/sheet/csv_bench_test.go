package sheet

import (
	"errors"
	"io"
	"strings"
	"testing"

	"golang.org/x/text/encoding/simplifiedchinese"
)

// BenchmarkReadCSV reads a 10,000-row product CSV in UTF-8 and in GB18030 (where every legacy candidate encoding
// is weighed over the whole file before reading).
func BenchmarkReadCSV(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(strings.Join(benchHeader, ",") + "\r\n")
	for i := range benchRows {
		sb.WriteString(strings.Join(benchRow(i), ",") + "\r\n")
	}
	gb, err := simplifiedchinese.GB18030.NewEncoder().String(sb.String())
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, data string }{{"utf-8", sb.String()}, {"gb18030", gb}} {
		b.Run(c.name, func(b *testing.B) {
			path := writeFile(b, b.TempDir(), "bench.csv", []byte(c.data))
			b.ReportAllocs()
			for b.Loop() {
				r, err := Open(path, Options{})
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for {
					if _, err := r.Next(); errors.Is(err, io.EOF) {
						break
					} else if err != nil {
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
		})
	}
}
