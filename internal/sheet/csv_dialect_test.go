package sheet

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// dialectCases are CSV dialects as Excel opens them. excel is what Excel (Microsoft 365, European list separator
// ";" for the semicolon cases, US "," otherwise) shows for the same bytes, where we read the same; the cases that
// end in an error say why we differ.
var dialectCases = []struct {
	name   string
	data   string
	excel  string // what Excel shows, for the reader of the test
	header []string
	// delimiter is the separator read; "" means ",".
	delimiter string
	records   []Record
	wantErr   string
}{
	{name: "bare quote in an unquoted field is text",
		data:   "Name,Size\nTV 40\" screen,40\"\n5'10\" tall,x\"y\"z\n",
		excel:  `B2 shows 40"; A3 shows 5'10" tall`,
		header: []string{"Name", "Size"}, records: []Record{rec(2, `TV 40" screen`, `40"`), rec(3, `5'10" tall`, `x"y"z`)}},
	{name: "a field that does not start with a quote is never quoted",
		data:   "a,b\n \"x\",\"y\" \n",
		excel:  `A2 shows  "x" with the quotes; B2 shows y and a space`,
		header: []string{"a", "b"}, records: []Record{rec(2, ` "x"`, `y `)}},
	{name: "doubled quotes and line breaks inside a quoted field",
		data:   "a,b\r\n\"say \"\"hi\"\"\",\"two\r\nlines\"\r\nnext,row\r\n",
		excel:  `A2 shows say "hi"; B2 two lines in one cell; row 3 is next, row`,
		header: []string{"a", "b"}, records: []Record{rec(2, `say "hi"`, "two\nlines"), rec(3, "next", "row")}},
	{name: "semicolon separated with decimal commas (French Excel)",
		data:      "Nom;Prix;Poids\r\nPomme;2,50;0,2\r\nPoire;3,10;0,25\r\n",
		excel:     "three columns; 2,50 is the number 2.5 in a French locale, the text 2,50 here",
		delimiter: ";", header: []string{"Nom", "Prix", "Poids"}, records: []Record{rec(2, "Pomme", "2,50", "0,2"), rec(3, "Poire", "3,10", "0,25")}},
	{name: "semicolon separated with commas in the text",
		data:      "Nom, prénom;Ville\nDupont, Jean;Paris\nMartin, Zoé;Lyon, France\n",
		excel:     "two columns",
		delimiter: ";", header: []string{"Nom, prénom", "Ville"}, records: []Record{rec(2, "Dupont, Jean", "Paris"), rec(3, "Martin, Zoé", "Lyon, France")}},
	{name: "tab separated with commas in values",
		data:      "a\tb\n1,5\t2\n",
		excel:     "two columns",
		delimiter: "\t", header: []string{"a", "b"}, records: []Record{rec(2, "1,5", "2")}},
	{name: "a quoted delimiter does not count when sniffing",
		data:   "\"a;b\",c\n\"1;2\",3\n",
		excel:  "two columns: a;b and c",
		header: []string{"a;b", "c"}, records: []Record{rec(2, "1;2", "3")}},
	{name: "one column",
		data:   "name\nAlice\n\nBob\n",
		excel:  "one column; row 3 empty",
		header: []string{"name"}, records: []Record{rec(2, "Alice"), blank(3, 1), rec(4, "Bob")}},
	{name: "sep= line names the delimiter and is not a row",
		data:      "sep=;\r\na;b\r\n1;2\r\n",
		excel:     "the sep= line is hidden; the header is row 1",
		delimiter: ";", header: []string{"a", "b"}, records: []Record{rec(2, "1", "2")}},
	{name: "sep= line with any delimiter",
		data:      "SEP=|\na|b\n1|x,y;z\n",
		excel:     "two columns",
		delimiter: "|", header: []string{"a", "b"}, records: []Record{rec(2, "1", "x,y;z")}},
	{name: "sep= line overrides sniffing",
		data:   "sep=,\na;b,c\n1;2,3\n",
		excel:  "two columns: a;b and c",
		header: []string{"a;b", "c"}, records: []Record{rec(2, "1;2", "3")}},
	{name: "sep= line after a byte-order mark",
		data:      "\xEF\xBB\xBFsep=\t\na\tb\n1\t2\n",
		excel:     "two columns",
		delimiter: "\t", header: []string{"a", "b"}, records: []Record{rec(2, "1", "2")}},

	{name: "text after a closing quote",
		data:    "a,b\n1,\"x\"y\n",
		excel:   "B2 shows xy: the quotes vanish and the text runs on, so we stop instead",
		wantErr: `x.csv: row 2 column B ("b"): invalid CSV at line 2: text follows the closing quote of a quoted field ("y" after the quote); to put a quote inside a quoted field, double it ("")`},
	{name: "a quote never closed",
		data:    "a,b\n1,2\n3,\"open\n4,5\n6,7\n",
		excel:   "B3 holds the rest of the file, rows 4 and 5 vanish, so we stop instead",
		wantErr: `x.csv: row 3 column B ("b"): invalid CSV at line 3: the quoted field that starts here is never closed (a quote is missing; Excel would put the rest of the file into this cell)`},
	{name: "rows and lines differ after a multi-line cell",
		data:    "a;b\n1;\"x\ny\"\n2;\"z\"w\n",
		wantErr: `x.csv: row 3 column B ("b"): invalid CSV at line 4: text follows the closing quote of a quoted field ("w" after the quote); to put a quote inside a quoted field, double it ("")`},
	{name: "lines count the sep= line, rows do not",
		data:    "sep=;\na;b;c\n1;2;\"x\"\"\"y\n",
		wantErr: `x.csv: row 2 column C ("c"): invalid CSV at line 3: text follows the closing quote of a quoted field ("y" after the quote); to put a quote inside a quoted field, double it ("")`},
	{name: "in the header",
		data:    "\"a\"b,c\n1,2\n",
		wantErr: `x.csv: row 1 column A: invalid CSV at line 1: text follows the closing quote of a quoted field ("b,c" after the quote); to put a quote inside a quoted field, double it ("")`},
	{name: "an unsupported sep= delimiter",
		data:    "sep=、\na、b\n",
		wantErr: `x.csv: line 1 ("sep=、") names a delimiter batchgen does not support; use one ASCII character such as sep=; or sep=,`},
}

// TestCSVDialects reads each case through Open/Next and Validate.
func TestCSVDialects(t *testing.T) {
	t.Parallel()
	for _, c := range dialectCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, t.TempDir(), "x.csv", []byte(c.data))
			_, verr := Validate(path, Options{})
			if c.wantErr != "" {
				var ie *InputError
				if !errors.As(verr, &ie) {
					t.Fatalf("Validate error = %v (%T), want *InputError", verr, verr)
				}
				if diff := cmp.Diff(c.wantErr, verr.Error()); diff != "" {
					t.Errorf("message (-want +got):\n%s", diff)
				}
				return
			}
			if verr != nil {
				t.Fatalf("Validate: %v", verr)
			}
			r, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer r.Close()
			got := readResult{Header: r.Header(), Encoding: r.Encoding(), Delimiter: r.Delimiter(), Records: readAll(t, r)}
			want := readResult{Header: c.header, Delimiter: c.delimiter, Records: c.records}.withEncoding(true)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("read (-want +got):\n%s", diff)
			}
		})
	}
}
