package sheet

import (
	"math"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"
)

// numfmtGolden is the golden table of number formats: code, stored value, the text Excel shows, and the source of
// that text.
const numfmtGolden = "testdata/numfmt/golden.tsv"

// TestNumberFormatGolden reads every row of the golden table as a cell of a workbook (one custom number format
// per row) and checks it reads as Excel shows it. The rows cover what excelize gets wrong and numFormatter
// corrects (rounding, fractional seconds, A/P without an hour, engineering notation, negative durations) and what
// it already gets right and must keep (AM/PM, fractions, colour codes).
func TestNumberFormatGolden(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(numfmtGolden)
	if err != nil {
		t.Fatal(err)
	}
	var rows []formatRow
	header := false // lines before the column header are comments
	for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if !header {
			header = strings.HasPrefix(line, "code\t")
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 4 || f[3] == "" {
			t.Fatalf("%s:%d: want code, value, shown and a source, got %q", numfmtGolden, i+1, line)
		}
		rows = append(rows, formatRow{label: f[0] + " @ " + f[1], v: f[1], style: cellStyle{numFmt: f[0]}, want: f[2]})
	}
	if len(rows) < 40 {
		t.Fatalf("only %d rows in %s", len(rows), numfmtGolden)
	}
	book, want := formatBook(t, rows, nil, false)
	path := writeFile(t, t.TempDir(), "numfmt.xlsx", book)
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if diff := cmp.Diff(want, readAll(t, r)); diff != "" {
		t.Errorf("numbers read differently from Excel (-want +got):\n%s", diff)
	}
}

// TestRoundDecimal pins Excel's rounding of the 15-significant-digit decimal value.
func TestRoundDecimal(t *testing.T) {
	t.Parallel()
	cases := []struct {
		v    float64
		dec  int
		want float64
	}{
		{1.005, 2, 1.01}, {-1.005, 2, -1.01}, {2.675, 2, 2.68}, {1.004, 2, 1.0}, {0.285, 2, 0.29}, {1234.565, 2, 1234.57},
		{9.995, 2, 10}, {0.5, 0, 1}, {-0.5, 0, -1}, {0.0001, 2, 0}, {123456789012345678, 2, 123456789012345678}, {0, 3, 0},
	}
	for _, c := range cases {
		if got := roundDecimal(c.v, c.dec); got != c.want {
			t.Errorf("roundDecimal(%v, %d) = %v, want %v", c.v, c.dec, got, c.want)
		}
	}
}

// FuzzNumberFormatFix feeds arbitrary format codes and values to the fixes: they must never panic, and a code
// marked for fixing must still render through excelize.
func FuzzNumberFormatFix(f *testing.F) {
	for _, code := range []string{"0.00_ ", "ss.000", "[h]:mm;@", "##0.0E+0", "A/P", "0E", "#E+", `"a";[Red]0.0,,%`, "[s].0", "0.##;-0.##;0"} {
		f.Add(code, 1.005)
		f.Add(code, -12345.678)
	}
	n := &numFormatter{f: excelize.NewFile(), styles: map[string]int{}}
	f.Fuzz(func(t *testing.T, code string, v float64) {
		if len(code) > 255 || math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		sections := splitSections(code)
		if !fixableSections(sections) {
			return
		}
		_, _ = n.display(&numFmtFix{id: -1, code: code, sections: sections}, v)
	})
}
