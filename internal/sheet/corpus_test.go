package sheet

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/bad and testdata/odd from the generators badCorpus and oddCorpus")

const badDir = "testdata/bad"

// deflate compresses data the way a zip entry stores it.
func deflate(t testing.TB, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := flate.NewWriter(&buf, flate.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// oleHeader is the signature of an OLE2 compound file (legacy .xls, and the wrapper of encrypted .xlsx).
const oleHeader = "\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1"

// badCorpus generates every file under testdata/bad. The files are committed so they can be opened by hand; the
// generator is the source of truth and TestGenerateCorpus keeps the two in sync.
func badCorpus(t testing.TB) map[string][]byte {
	t.Helper()
	goods := row(1, "名称", "价格") + row(2, "苹果", "3")
	ole := func(names ...string) []byte {
		b := []byte(oleHeader)
		b = append(b, make([]byte, 1024)...)
		for _, n := range names {
			b = append(b, utf16LE(n)...)
			b = append(b, make([]byte, 64)...)
		}
		return b
	}
	valid := buildXLSX(t, testSheet{name: "Sheet1", rows: goods})

	// Zip bombs. claims: the directory says 4 GiB (tiny on disk); zeros: a real 100 KiB entry of zeros against a
	// small test limit; ratio: a real 8 MiB worksheet (padding) that deflates about 1000:1; lying: the directory
	// says 200 bytes but the entry inflates to 1 MiB.
	claimed := append(workbookEntries(testSheet{name: "Sheet1", rows: goods}), zipEntry{
		name: "xl/media/big.bin", raw: true, data: deflate(t, []byte("x")),
		header: zipHeader(4<<30, 1),
	})
	zeros := append(workbookEntries(testSheet{name: "Sheet1", rows: goods}),
		zipEntry{name: "xl/media/zeros.bin", data: make([]byte, 100<<10)})
	ratio := workbookEntries(testSheet{name: "Sheet1", rows: goods + strings.Repeat(" ", 8<<20)})
	lyingEntries := workbookEntries(testSheet{name: "Sheet1", rows: goods})
	bigSheet := append([]byte(nil), lyingEntries[len(lyingEntries)-1].data...)
	bigSheet = bytes.Replace(bigSheet, []byte("</sheetData>"), append(bytes.Repeat([]byte(" "), 1<<20), "</sheetData>"...), 1)
	lyingEntries[len(lyingEntries)-1] = zipEntry{name: "xl/worksheets/sheet1.xml", raw: true, data: deflate(t, bigSheet),
		header: zipHeader(200, 0)}

	// bad_crc: an entry whose data does not match its checksum (bit rot, a broken upload).
	crcEntries := workbookEntries(testSheet{name: "Sheet1", rows: goods})
	sheetXML := crcEntries[len(crcEntries)-1].data
	crcEntries[len(crcEntries)-1] = zipEntry{name: "xl/worksheets/sheet1.xml", raw: true, data: deflate(t, sheetXML),
		header: zipHeader(uint64(len(sheetXML)), 0xDEADBEEF)}

	longCell := strings.Repeat("价", 40000)

	// Damaged XML inside an intact zip (exporters that write control characters or a bare "&"): excelize's row
	// iterator stops at the error as if the sheet had ended, so without a check the rows after it were lost.
	goodThenBad := func(bad string) []byte {
		return buildXLSX(t, testSheet{name: "Sheet1", rows: row(1, "名称") + row(2, "苹果") +
			`<row r="3"><c r="A3" t="inlineStr"><is><t>` + bad + `</t></is></c></row>` + row(4, "梨")})
	}
	return map[string][]byte{
		// Not a spreadsheet, or not one we read.
		"empty.csv":       {},
		"pdf.xlsx":        []byte("%PDF-1.7\n1 0 obj\n<< /Type /Catalog >>\nendobj\n"),
		"corrupt.xlsx":    append([]byte("PK\x03\x04"), bytes.Repeat([]byte{0x5A}, 100)...),
		"truncated.xlsx":  valid[:len(valid)/2],
		"legacy.xls":      ole("Root Entry", "Workbook", "SummaryInformation"),
		"encrypted.xlsx":  ole("Root Entry", "EncryptionInfo", "EncryptedPackage"),
		"docx.xlsx":       buildZip(t, zipEntry{name: "[Content_Types].xml", data: []byte("<Types/>")}, zipEntry{name: "word/document.xml", data: []byte("<w:document/>")}),
		"plain.zip":       buildZip(t, zipEntry{name: "readme.txt", data: []byte("hello")}),
		"sheet.ods":       buildZip(t, zipEntry{name: "mimetype", data: []byte("application/vnd.oasis.opendocument.spreadsheet")}, zipEntry{name: "content.xml", data: []byte("<office:document-content/>")}),
		"html.xls":        []byte("\r\n<html><body><table><tr><td>名称</td></tr></table></body></html>"),
		"xml2003.xml":     []byte(`<?xml version="1.0"?>` + "\n" + `<?mso-application progid="Excel.Sheet"?>` + "\n<Workbook/>"),
		"image.csv":       []byte("\x89PNG\r\n\x1A\n\x00\x00\x00\x0DIHDR"),
		"too_big.csv":     bytes.Repeat([]byte("a,b\n"), 512),
		"bom_invalid.csv": []byte("\xEF\xBB\xBFa,b\n\xFF,1\n"),
		"binary.csv":      []byte("name,city\n\x81\x20\xFF\xFE\x81\n"),

		// Zip bombs.
		"zipbomb_claims.xlsx": buildZip(t, claimed...),
		"zipbomb_zeros.xlsx":  buildZip(t, zeros...),
		"zipbomb_ratio.xlsx":  buildZip(t, ratio...),
		"zipbomb_lying.xlsx":  buildZip(t, lyingEntries...),
		"bad_crc.xlsx":        buildZip(t, crcEntries...),

		// Readable, but the content breaks a rule.
		"no_header.csv":        []byte(",,\r\n  ,\r\n\r\n"),
		"no_header.xlsx":       buildXLSX(t, testSheet{name: "Sheet1", rows: `<row r="1"/><row r="2"><c r="A2" t="inlineStr"><is><t> </t></is></c></row>`}),
		"blank_header.xlsx":    buildXLSX(t, testSheet{name: "Sheet1", rows: row(1, "名称", "", "价格") + row(2, "苹果", "红", "3")}),
		"dup_header.csv":       []byte("名称,价格,类目,库存,价格\n苹果,3,水果,10,4\n"),
		"dup_header.xlsx":      buildXLSX(t, testSheet{name: "商品", rows: row(2, "名称", " 价格", "类目", "库存", "价格 ") + row(3, "苹果", "3", "水果", "10", "4")}),
		"header_only.csv":      []byte("名称,价格\r\n\r\n,\r\n"),
		"header_only.xlsx":     buildXLSX(t, testSheet{name: "Sheet1", rows: row(1, "名称", "价格") + row(2, " ", "")}),
		"too_many_rows.csv":    []byte("n\n1\n2\n3\n4\n5\n"),
		"too_many_columns.csv": []byte("a,b,c,d\n1,2,3,4\n"),
		"long_cell.csv":        []byte("名称,描述\n苹果,这是一段超过十个字符的描述文字\n"),
		"long_cell.xlsx": buildXLSX(t, testSheet{name: "商品", rows: row(1, "名称", "类目", "价格") +
			row(2, "苹果", "水果", "3") + row(3, "香蕉", "水果", "2") + row(4, "梨", "水果", "4") + row(5, "西瓜", "水果", longCell)}),
		"orphan.csv":         []byte("a,b\n1,2\n3,4,5\n"),
		"orphan.xlsx":        buildXLSX(t, testSheet{name: "Sheet1", rows: row(1, "名称", "类目", "价格") + row(2, "苹果", "水果", "3") + row(7, "梨", "", "", "", "", "", "", "备注")}),
		"nul.csv":            []byte("名称,描述\n苹果,红色\n香蕉,黄\x00色\n"),
		"bad_quote.csv":      []byte("a,b\n1,\"x\"y\n"),
		"missing_sheet.xlsx": buildXLSX(t, testSheet{name: "Sheet1", rows: goods}, testSheet{name: "prompt", rows: row(1, "写文案")}),
		"prompt_only.xlsx":   buildXLSX(t, testSheet{name: "Prompt", rows: row(1, "写文案")}, testSheet{name: "Data", state: "hidden", rows: goods}),
		"bad_row_ref.xlsx":   buildXLSX(t, testSheet{name: "Sheet1", rows: row(1, "a") + `<row r="2"><c r="A0"><v>1</v></c></row>`}),

		// Part two: bad input found by the odd corpus.
		"control_char.xlsx":  goodThenBad("坏\x01字"),
		"unescaped_amp.xlsx": goodThenBad("AT&T"),
		// A two-row header: the group title is merged across A1:B1, so its text is in A1 only and B1 is blank.
		"merged_header.xlsx": buildXLSX(t, testSheet{name: "Sheet1",
			rows:  row(1, "商品信息", "", "价格") + row(2, "名称", "类目") + row(3, "苹果", "水果", "3"),
			after: `<mergeCells count="1"><mergeCell ref="A1:B1"/></mergeCells>`}),
		// U+3000 (ideographic space) is white space, so it is trimmed like any other.
		"dup_header_trimmed.csv": []byte("名称,\u3000名称\n苹果,x\n"),
		// The message quotes the header, cut to 50 characters.
		"long_header_nul.csv": []byte(longHeader + ",短\na\x00,b\n"),
		// Data in rows 2, 3 and 1,048,576: the blank rows between are kept in place, so there are a million rows.
		"sparse_far_row.xlsx": buildXLSX(t, testSheet{name: "Sheet1", rows: row(1, "名称") + row(2, "苹果") + row(3, "梨") + row(1048576, "橙")}),
	}
}

// zipHeader declares sizes for a raw zip entry.
func zipHeader(uncompressed uint64, crc uint32) zip.FileHeader {
	return zip.FileHeader{UncompressedSize64: uncompressed, CRC32: crc}
}

// badCases are the expected rejections, one per corpus file (TestGenerateCorpus checks none is missing).
var badCases = []struct {
	file string
	opts Options
	want string
}{
	{"empty.csv", Options{}, "empty.csv: file is empty (0 bytes)"},
	{"pdf.xlsx", Options{}, "pdf.xlsx: looks like a PDF, not a spreadsheet"},
	{"corrupt.xlsx", Options{}, "corrupt.xlsx: the file is a damaged zip archive and cannot be read as .xlsx (zip: not a valid zip file)"},
	{"truncated.xlsx", Options{}, "truncated.xlsx: the file is a damaged zip archive and cannot be read as .xlsx (zip: not a valid zip file)"},
	{"legacy.xls", Options{}, "legacy.xls: legacy .xls (Excel 97-2003) is not supported; save it as .xlsx"},
	{"encrypted.xlsx", Options{}, "encrypted.xlsx: the workbook is password-protected; remove the password and save again"},
	{"docx.xlsx", Options{}, "docx.xlsx: looks like a Word document (.docx), not a spreadsheet"},
	{"plain.zip", Options{}, "plain.zip: looks like a zip archive, not an Excel workbook"},
	{"sheet.ods", Options{}, "sheet.ods: OpenDocument spreadsheets (.ods) are not supported; save it as .xlsx"},
	{"html.xls", Options{}, "html.xls: looks like an HTML page, not a spreadsheet (some systems export HTML tables named .xls); open it in Excel and save it as .xlsx"},
	{"xml2003.xml", Options{}, "xml2003.xml: XML Spreadsheet 2003 is not supported; open it in Excel and save it as .xlsx"},
	{"image.csv", Options{}, "image.csv: looks like a PNG image, not a spreadsheet"},
	{"too_big.csv", Options{Limits: Limits{MaxFileBytes: 1024}}, "too_big.csv: file is 2 KiB; the limit is 1 KiB (configurable)"},
	{"bom_invalid.csv", Options{}, "bom_invalid.csv: not UTF-8 text (despite its UTF-8 byte-order mark): invalid byte 0xFF at offset 7"},
	{"binary.csv", Options{}, "binary.csv: not text in any encoding batchgen recognises (UTF-8, GB18030, Big5, Shift_JIS, Windows-1252): invalid byte 0x81 at offset 10 (read as utf-8, the longest readable start); save the file as \"CSV UTF-8\""},

	{"zipbomb_claims.xlsx", Options{}, "zipbomb_claims.xlsx: the workbook expands to 4 GiB when unzipped; the limit is 1 GiB (zip-bomb guard, configurable)"},
	{"zipbomb_zeros.xlsx", Options{Limits: Limits{MaxUnzippedBytes: 64 << 10}}, "zipbomb_zeros.xlsx: the workbook expands to 101.9 KiB when unzipped; the limit is 64 KiB (zip-bomb guard, configurable)"},
	{"zipbomb_ratio.xlsx", Options{Limits: Limits{MaxUnzippedBytes: 1 << 20}}, "zipbomb_ratio.xlsx: the workbook expands to 8 MiB when unzipped; the limit is 1 MiB (zip-bomb guard, configurable)"},
	{"zipbomb_lying.xlsx", Options{}, "zipbomb_lying.xlsx: the workbook is damaged and cannot be read (xl/worksheets/sheet1.xml: zip: not a valid zip file)"},

	{"bad_crc.xlsx", Options{}, "bad_crc.xlsx: the workbook is damaged and cannot be read (xl/worksheets/sheet1.xml: zip: checksum error)"},

	{"no_header.csv", Options{}, "no_header.csv: the file has no header row (every row is blank)"},
	{"no_header.xlsx", Options{}, `no_header.xlsx: sheet "Sheet1": the sheet has no header row (every row is blank)`},
	{"blank_header.xlsx", Options{}, `blank_header.xlsx: sheet "Sheet1" row 1 column B: header cell is blank but a column to its right has a header; give every column a name`},
	{"dup_header.csv", Options{}, `dup_header.csv: row 1: columns B and E are both named "价格"`},
	{"dup_header.xlsx", Options{}, `dup_header.xlsx: sheet "商品" row 2: columns B and E are both named "价格"`},
	{"header_only.csv", Options{}, "header_only.csv: the header row (row 1) has no data rows below it"},
	{"header_only.xlsx", Options{}, `header_only.xlsx: sheet "Sheet1": the header row (row 1) has no data rows below it`},
	{"too_many_rows.csv", Options{Limits: Limits{MaxRows: 3}}, "too_many_rows.csv: row 5: too many data rows: the limit is 3 (configurable)"},
	{"too_many_columns.csv", Options{Limits: Limits{MaxColumns: 3}}, "too_many_columns.csv: row 1: the header has 4 columns; the limit is 3"},
	{"long_cell.csv", Options{Limits: Limits{MaxCellChars: 10}}, `long_cell.csv: row 2 column B ("描述"): cell has 15 characters; the limit is 10`},
	{"long_cell.xlsx", Options{}, `long_cell.xlsx: sheet "商品" row 5 column C ("价格"): cell has 40000 characters; Excel's limit is 32767`},
	{"orphan.csv", Options{}, "orphan.csv: row 3 column C: cell has a value but its column has no header (the header is row 1)"},
	{"orphan.xlsx", Options{}, `orphan.xlsx: sheet "Sheet1" row 7 column H: cell has a value but its column has no header (the header is row 1)`},
	{"nul.csv", Options{}, `nul.csv: row 3 column B ("描述"): cell contains a NUL byte (0x00); the file may be binary, damaged, or UTF-16 text without a byte-order mark`},
	{"bad_quote.csv", Options{}, `bad_quote.csv: row 2 column B ("b"): invalid CSV at line 2: text follows the closing quote of a quoted field ("y" after the quote); to put a quote inside a quoted field, double it ("")`},
	{"missing_sheet.xlsx", Options{Sheet: "Nope"}, `missing_sheet.xlsx: sheet "Nope" not found; the workbook has sheets "Sheet1", "prompt"`},
	{"prompt_only.xlsx", Options{}, `prompt_only.xlsx: the workbook has no visible sheet to read (other than "prompt")`},
	{"bad_row_ref.xlsx", Options{}, `bad_row_ref.xlsx: sheet "Sheet1" row 2: the row is damaged and cannot be read (cannot convert cell "A0" to coordinates: invalid cell name "A0")`},

	{"control_char.xlsx", Options{}, "control_char.xlsx: the workbook is damaged and cannot be read (xl/worksheets/sheet1.xml: XML syntax error on line 1: illegal character code U+0001)"},
	{"unescaped_amp.xlsx", Options{}, "unescaped_amp.xlsx: the workbook is damaged and cannot be read (xl/worksheets/sheet1.xml: XML syntax error on line 1: invalid character entity &T (no semicolon))"},
	{"merged_header.xlsx", Options{}, `merged_header.xlsx: sheet "Sheet1" row 1 column B: header cell is blank but a column to its right has a header; give every column a name`},
	{"dup_header_trimmed.csv", Options{}, `dup_header_trimmed.csv: row 1: columns A and B are both named "名称"`},
	{"long_header_nul.csv", Options{}, `long_header_nul.csv: row 2 column A ("` + strings.Repeat("长", 50) + `…"): cell contains a NUL byte (0x00); the file may be binary, damaged, or UTF-16 text without a byte-order mark`},
	{"sparse_far_row.xlsx", Options{}, `sparse_far_row.xlsx: sheet "Sheet1" row 1048576: too many data rows: the limit is 200000 (configurable); the blank rows above this row count too, because they are not at the end of the sheet`},
}

// oddRejections are files of the odd corpus (accepted with the default options) rejected when a limit is set
// lower or a sheet that does not exist is asked for.
var oddRejections = []struct {
	file string
	opts Options
	want string
}{
	{"wide_10000.csv", Options{Limits: Limits{MaxColumns: 5000}}, "wide_10000.csv: row 1: the header has 10000 columns; the limit is 5000"},
	{"wide_10000.xlsx", Options{Limits: Limits{MaxColumns: 5000}}, `wide_10000.xlsx: sheet "宽表" row 1: the header has 10000 columns; the limit is 5000`},
	{"long_header.csv", Options{Limits: Limits{MaxCellChars: 4999}}, "long_header.csv: row 1 column A: cell has 5000 characters; the limit is 4999"},
	{"hidden_sheets.xlsx", Options{Sheet: "不存在"}, `hidden_sheets.xlsx: sheet "不存在" not found; the workbook has sheets "旧数据", "机密", "数据", "prompt"`},
}

// TestGenerateCorpus rewrites testdata/bad and testdata/odd with -update; without it, it fails when the committed
// files drift from the generators or a file has no expected outcome.
func TestGenerateCorpus(t *testing.T) {
	var badCased, oddCased []string
	for _, c := range badCases {
		badCased = append(badCased, c.file)
	}
	for _, c := range oddCases {
		oddCased = append(oddCased, c.file)
	}
	for _, c := range []struct {
		dir    string
		corpus map[string][]byte
		cased  []string
	}{
		{badDir, badCorpus(t), badCased},
		{oddDir, oddCorpus(t), oddCased},
	} {
		if *update {
			if err := os.RemoveAll(c.dir); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(c.dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, data := range c.corpus {
				if err := os.WriteFile(filepath.Join(c.dir, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		entries, err := os.ReadDir(c.dir)
		if err != nil {
			t.Fatalf("read corpus (run go test -run TestGenerateCorpus -update): %v", err)
		}
		var onDisk, generated []string
		for _, e := range entries {
			onDisk = append(onDisk, e.Name())
		}
		for name, data := range c.corpus {
			generated = append(generated, name)
			got, err := os.ReadFile(filepath.Join(c.dir, name))
			if err == nil && !bytes.Equal(got, data) {
				t.Errorf("%s/%s differs from the generator; run go test -run TestGenerateCorpus -update", c.dir, name)
			}
		}
		sort.Strings(generated)
		cased := slices.Compact(slices.Sorted(slices.Values(c.cased)))
		if diff := cmp.Diff(generated, onDisk); diff != "" {
			t.Errorf("%s: corpus files on disk (-generated +on disk):\n%s", c.dir, diff)
		}
		if diff := cmp.Diff(generated, cased); diff != "" {
			t.Errorf("%s: corpus files without a case (-generated +cases):\n%s", c.dir, diff)
		}
	}
}

// TestBadInputs checks that every bad file is rejected with an *InputError and exactly the expected message, both
// by Validate and by Open followed by Next.
func TestBadInputs(t *testing.T) {
	t.Parallel()
	type badCase struct {
		dir, file string
		opts      Options
		want      string
	}
	var cases []badCase
	for _, c := range badCases {
		cases = append(cases, badCase{badDir, c.file, c.opts, c.want})
	}
	for _, c := range oddRejections {
		cases = append(cases, badCase{oddDir, c.file, c.opts, c.want})
	}
	for _, c := range cases {
		t.Run(filepath.Join(filepath.Base(c.dir), c.file), func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(c.dir, c.file)
			_, err := Validate(path, c.opts)
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("Validate error = %v (%T), want *InputError", err, err)
			}
			if diff := cmp.Diff(c.want, err.Error()); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
			if ie.File != c.file {
				t.Errorf("InputError.File = %q, want %q", ie.File, c.file)
			}
		})
	}
}
