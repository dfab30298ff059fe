package sheet

import (
	"bytes"
	"strings"
	"testing"
)

func TestCSVWriter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		delimiter string
		input     []string
		added     []Value
		want      string
	}{
		{"plain", "", []string{"a", "b"}, []Value{Text("x"), Int(3), Bool(true), {}}, "a,b,x,3,TRUE,\r\n"},
		{"the input's delimiter", ";", []string{"1,5", "a;b"}, []Value{Number(0.25)}, "1,5;\"a;b\";0.25\r\n"},
		{"tab", "\t", []string{"a b", "c\td"}, nil, "a b\t\"c\td\"\r\n"},
		{"quotes doubled", "", []string{`TV 40" screen`}, []Value{Text(`say "hi"`)}, `"TV 40"" screen","say ""hi"""` + "\r\n"},
		{"a line break in a field is kept as it is", "", []string{"two\nlines", "cr\r\nlf"}, nil, "\"two\nlines\",\"cr\r\nlf\"\r\n"},
		// Excel opens a field starting with = + - @ as a formula: added text never is one; the input's own
		// fields are the user's and stay as they were.
		{"added text is never a formula", "", []string{"=SUM(A1)", "-5"},
			[]Value{Text("=HYPERLINK(\"http://x\")"), Text("+1"), Text("-bullet"), Text("@x"), Text("\tx"), Int(-5)},
			`=SUM(A1),-5,"'=HYPERLINK(""http://x"")",'+1,'-bullet,'@x,'` + "\tx,-5\r\n"},
		{"unicode", "", []string{"价格", "é"}, []Value{Text("答案")}, "价格,é,答案\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			w, err := NewCSVWriter(&b, tt.delimiter)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.WriteRow(tt.input, tt.added); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			got, ok := strings.CutPrefix(b.String(), "\uFEFF")
			if !ok {
				t.Fatalf("no byte-order mark: %q", b.String())
			}
			if got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
	for _, bad := range []string{`"`, "\n", ",;", "\xff"} {
		if _, err := NewCSVWriter(&bytes.Buffer{}, bad); err == nil || !strings.Contains(err.Error(), "delimiter") {
			t.Errorf("delimiter %q: err = %v, want one naming the delimiter", bad, err)
		}
	}
}
