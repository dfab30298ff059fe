package sheet

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/text/encoding/simplifiedchinese"
)

// TestEncodingScansAcrossChunks puts multi-byte sequences and bad bytes exactly on the scanners' chunk boundary,
// where a streaming validator is most likely to be wrong.
func TestEncodingScansAcrossChunks(t *testing.T) {
	t.Parallel()
	pad := func(n int) []byte { return bytes.Repeat([]byte("a"), n) }
	gbLong := encode(t, simplifiedchinese.GB18030.NewEncoder(), "\U00020000") // a four-byte GB18030 sequence
	cases := []struct {
		name       string
		data       []byte
		wantUTF8   int64
		wantGB1830 int64
	}{
		{"ascii", []byte("a,b\n"), -1, -1},
		{"utf8 rune straddles the chunk end", append(pad(scanChunk-1), "中,x"...), -1, scanChunk + 1},
		{"bad byte right after the chunk", append(append(pad(scanChunk), 0xFF), 'a'), scanChunk, scanChunk},
		{"truncated utf8 at eof", append(pad(10), 0xE4, 0xB8), 10, -1},
		{"gb four-byte sequence straddles the chunk end", append(pad(scanChunk-2), append(gbLong, 'a')...), scanChunk - 2, -1},
		{"gb truncated four-byte sequence at eof", append(pad(5), gbLong[:3]...), 5, 5},
		{"gb lead byte then ascii", []byte("ab\x81,"), 2, 2},
		{"gb euro sign 0x80 is valid", []byte("x\x80y"), 1, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, err := os.Open(writeFile(t, t.TempDir(), "x", c.data))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			gotUTF8, err := firstInvalidUTF8(f, 0)
			if err != nil {
				t.Fatal(err)
			}
			gb, err := weigh(f, candidates()[1])
			if err != nil {
				t.Fatal(err)
			}
			gotGB := gb.bad
			if diff := cmp.Diff([2]int64{c.wantUTF8, c.wantGB1830}, [2]int64{gotUTF8, gotGB}); diff != "" {
				t.Errorf("[utf8, gb18030] offsets (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGB18030RoundTrip reads a GB18030 CSV with two-byte, four-byte (BMP and supplementary) characters and the
// euro sign, which GB18030 encodes differently from GBK.
func TestGB18030RoundTrip(t *testing.T) {
	t.Parallel()
	text := "名称,说明\n€ 价格,·𠀀㐀\n"
	path := writeFile(t, t.TempDir(), "gb.csv", encode(t, simplifiedchinese.GB18030.NewEncoder(), text))
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if diff := cmp.Diff([]Record{rec(2, "€ 价格", "·𠀀㐀")}, readAll(t, r)); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// TestMostlyUTF8ReportsTheUTF8Offset: a UTF-8 file with one stray byte deep inside must point at that byte, not at
// wherever GB18030 decoding of the UTF-8 text happened to fail first.
func TestMostlyUTF8ReportsTheUTF8Offset(t *testing.T) {
	t.Parallel()
	good := "名称,描述\n" + strings.Repeat("苹果,很甜\n", 100)
	data := append([]byte(good), 0xFF, '\n')
	_, err := Validate(writeFile(t, t.TempDir(), "x.csv", data), Options{})
	want := "x.csv: not valid UTF-8 text: invalid byte 0xFF at offset " + strconv.Itoa(len(good)) + ` (the rest of the file is UTF-8; fix that byte or save the file again as "CSV UTF-8")`
	if err == nil || err.Error() != want {
		t.Errorf("Validate = %v, want %q", err, want)
	}
}

// TestReaderStreamsBigSheetFromTempFileAndCleansUp uses a small unzip budget so that the worksheet exceeds the
// in-memory threshold (an eighth of the budget) and is streamed from a temporary file, then checks every temporary
// file is gone after Close.
func TestReaderStreamsBigSheetFromTempFileAndCleansUp(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	const n = 2000
	long := strings.Repeat("长文本", 100)
	var rows strings.Builder
	rows.WriteString(row(1, "id", "text"))
	for i := range n {
		rows.WriteString(row(i+2, strconv.Itoa(i), long))
	}
	path := writeFile(t, t.TempDir(), "big.xlsx", buildXLSX(t, testSheet{name: "big", rows: rows.String()}))

	r, err := Open(path, Options{Limits: Limits{MaxUnzippedBytes: 4 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(tmp); len(left) == 0 {
		t.Errorf("the reader made no temporary file; the sheet did not exceed the in-memory threshold")
	}
	recs := readAll(t, r)
	if len(recs) != n || recs[n-1].Values[0] != strconv.Itoa(n-1) || recs[n-1].Values[1] != long {
		t.Errorf("read %d records, want %d ending with %d", len(recs), n, n-1)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	assertEmptyDir(t, tmp, "after Reader.Close")
}

// TestWriterSpillsToTempFileAndCleansUp writes more than excelize's 16 MiB stream buffer, so rows go to a temporary
// file instead of memory, and checks Close removes it.
func TestWriterSpillsToTempFileAndCleansUp(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	long := strings.Repeat("长文本", 700) // ~6 KiB of UTF-8 per row
	w, err := NewWriter("big", []string{"id", "text"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3000 {
		if err := w.WriteRow([]string{strconv.Itoa(i), long}); err != nil {
			t.Fatal(err)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) == 0 {
		t.Errorf("the writer made no temporary file; rows are being held in memory")
	}
	if _, err := w.WriteTo(io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	assertEmptyDir(t, tmp, "after Writer.Close")
}

func assertEmptyDir(t *testing.T, dir, when string) {
	t.Helper()
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		t.Errorf("temporary files left %s: %v", when, names)
	}
}
