package sheet

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// checkReads opens and drains a file, asserting the Reader's contract on whatever the bytes are: no panic, every
// error an *InputError (the file exists, so there is no I/O error to expect), records shaped like the header,
// row numbers strictly increasing.
func checkReads(t *testing.T, path string, opts Options) {
	r, err := Open(path, opts)
	if err != nil {
		var ie *InputError
		if !errors.As(err, &ie) {
			t.Fatalf("Open error is %T, want *InputError: %v", err, err)
		}
		if ie.Reason == "" || !strings.HasPrefix(err.Error(), ie.File+": ") {
			t.Fatalf("malformed InputError: %#v", ie)
		}
		return
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	header := r.Header()
	if len(header) == 0 {
		t.Fatal("Open succeeded with an empty header")
	}
	seen := map[string]bool{}
	for _, h := range header {
		if h == "" || h != strings.TrimSpace(h) || seen[h] {
			t.Fatalf("bad header %q", header)
		}
		seen[h] = true
	}
	last := 0
	for n := 0; ; n++ {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			if n == 0 {
				t.Fatal("Open succeeded but there are no data rows")
			}
			return
		}
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("Next error is %T, want *InputError: %v", err, err)
			}
			return
		}
		if len(rec.Values) != len(header) {
			t.Fatalf("row %d has %d values for %d columns", rec.SheetRow, len(rec.Values), len(header))
		}
		if rec.SheetRow <= last {
			t.Fatalf("row %d after row %d", rec.SheetRow, last)
		}
		last = rec.SheetRow
	}
}

func FuzzReadCSV(f *testing.F) {
	for _, s := range []string{
		"a,b\n1,2\n",
		"\xEF\xBB\xBF名称,价格\r\n苹果,\"3\r\n4\"\r\n\r\n,\r\n",
		"\xFF\xFEa\x00,\x00b\x00\n\x001\x00,\x002\x00\n\x00",
		"\xFE\xFF\x00a\x00\t\x00b\x00\n\x00x\x00\ty",
		"\xC3\xFB\xB3\xC6,\xBC\xDB\xB8\xF1\n\xC6\xBB\xB9\xFB,3\n", // GB18030
		"a\tb\n1\t2\n",
		"a,\"b\n1,2\n",
		"a,a\n1,2\n",
		"a,,b\n",
		"a\n\x00\n",
		"\n\n\na\n\n\n1\n\n",
		"a,b\n1,2,3\n",
		"Name,Size\nTV 40\" screen,40\"\n", // bare quotes, kept as text
		"a,b\n1,\"x\"y\n",                  // text after a closing quote
		"a;b\n1;\"open\n",                  // a quote never closed
		"Nom;Prix\r\nPomme;2,50\r\n",       // semicolons and decimal commas
		"sep=;\r\na;b\r\n1;2\r\n",          // Excel's sep= line
		"sep=|\na|b\n",                     // sep= with a header and no rows
		"sep=",                             // nothing after sep=
		"\"a;b\",c\n\"1;2\",3\n",           // a quoted delimiter
		"Cat\xE9gorie;Entr\xE9es\r\nL\xE9gumes;2\r\n", // Windows-1252, also valid GB18030
		"Code\r\n\xC0\xC9\r\n",                        // ambiguous: Windows-1252 or GB18030
		"\x83\x8A\x83\x93\x83S,x\n1,2\n",              // Shift_JIS
	} {
		f.Add([]byte(s))
	}
	for name, data := range encodingCorpus(f) {
		if strings.HasSuffix(name, ".csv") {
			f.Add(data)
		}
	}
	odd := oddCorpus(f)
	for _, name := range []string{"lone_cr.csv", "bom_crlf.csv", "header_spaces.csv"} {
		f.Add(odd[name])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "fuzz.csv")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		checkReads(t, path, Options{Limits: Limits{MaxRows: 1000, MaxColumns: 100, MaxCellChars: 1000}})
		// Forcing an encoding must not break the contract either (undecodable bytes are an *InputError).
		checkReads(t, path, Options{Encoding: "shift_jis", Limits: Limits{MaxRows: 1000, MaxColumns: 100, MaxCellChars: 1000}})
	})
}

func FuzzReadXLSX(f *testing.F) {
	f.Add(buildXLSX(f, testSheet{name: "Sheet1", rows: row(1, "a", "b") + row(2, "1", "2")}))
	f.Add(buildXLSX(f,
		testSheet{name: "prompt", rows: row(1, "写{{a}}")},
		testSheet{name: "h", state: "hidden", rows: row(1, "x")},
		testSheet{name: "数据", rows: row(2, "a", "b") + row(3, "1") + row(5, "", "2") +
			`<row r="6"><c r="A6"><f>1+1</f><v>2</v></c><c r="B6" t="s"><v>0</v></c></row>`}))
	f.Add(writeWorkbook(f, "out", []string{"名称", "output"}, [][]string{{"苹果", "=1+1"}, {"", ""}, {"梨", "多行\n文本"}}))
	odd := oddCorpus(f)
	for _, name := range []string{"formulas.xlsx", "number_formats.xlsx", "hidden_sheets.xlsx"} {
		f.Add(odd[name])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "fuzz.xlsx")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}

		checkReads(t, path, Options{Limits: Limits{MaxUnzippedBytes: 8 << 20, MaxRows: 1000, MaxColumns: 100, MaxCellChars: 1000}})
	})
}

// FuzzReadXLSXParts fuzzes the XML inside a well-formed zip: mutating zip bytes mostly trips the CRC check, so this
// is the target that reaches excelize's worksheet, shared-string and workbook parsing.
func FuzzReadXLSXParts(f *testing.F) {
	f.Add(row(1, "a", "b")+row(2, "1", "2"), `<sst><si><t>x</t></si></sst>`, "")
	f.Add(row(1, "名称")+`<row r="3"><c r="A3" t="s"><v>0</v></c></row>`, `<sst count="1"><si><r><t>富</t></r><r><t>文本</t></r></si></sst>`, "hidden")
	f.Add(`<row><c><f>1+1</f><v>2</v></c><c t="b"><v>1</v></c></row><row><c t="e"><v>#N/A</v></c></row>`, "", "")
	f.Add(`<row r="1048576"><c r="XFD1048576" t="inlineStr"><is><t>z</t></is></c></row>`, "", "veryHidden")
	f.Add(formulaRows, "", "")
	f.Add(row(1, "名称", "描述")+`<row r="2"><c r="A2" t="s"><v>0</v></c><c r="B2" t="s"><v>1</v></c></row>`,
		`<sst><si><r><rPr><b/></rPr><t>红富士</t></r><r><t xml:space="preserve"> 苹果</t></r></si>`+
			`<si><r><t>東京</t></r><rPh sb="0" eb="2"><t>トウキョウ</t></rPh></si><si><t>制表_x0009_符</t></si></sst>`, "hidden")
	f.Add(row(1, "a")+row(2, "1")+`<row r="3"><c r="A3" t="inlineStr"><is><t>AT&T`+"\x01"+`</t></is></c></row>`, "", "")
	f.Fuzz(func(t *testing.T, rows, sst, state string) {
		entries := workbookEntries(testSheet{name: "数据", state: state, rows: rows})
		if sst != "" {
			entries = append(entries, zipEntry{name: "xl/sharedStrings.xml", data: []byte(sst)})
		}
		path := filepath.Join(t.TempDir(), "fuzz.xlsx")
		if err := os.WriteFile(path, buildZip(t, entries...), 0o600); err != nil {
			t.Fatal(err)
		}
		checkReads(t, path, Options{Limits: Limits{MaxUnzippedBytes: 8 << 20, MaxRows: 1000, MaxColumns: 100, MaxCellChars: 1000}})
	})
}
