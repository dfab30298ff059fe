package schema

import (
	"errors"
	"testing"
)

// FuzzParseShort: any text is read as a declaration or refused with an
// error, never a panic, and what is read passes Check and survives the
// JSON Schema sent to providers being read back.
func FuzzParseShort(f *testing.F) {
	for _, s := range []string{"category:enum(家居|数码|服饰)!, score:number, in_stock:boolean, summary:text",
		"a", "a:int\nb:date!", "c:enum(a|b", "x:list, y:enum((|))", "!", ":"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cols, err := ParseShort(s)
		if err != nil {
			return
		}
		if err := cols.Check(); err != nil {
			t.Fatalf("ParseShort(%q) returned a declaration Check refuses: %v", s, err)
		}
		if len(cols) == 0 {
			return
		}
		back, err := ParseJSONSchema(cols.JSONSchema())
		if err != nil {
			t.Fatalf("the schema of %q does not read back: %v\n%s", s, err, cols.JSONSchema())
		}
		if len(back) != len(cols) {
			t.Fatalf("%d columns became %d", len(cols), len(back))
		}
		for i := range cols {
			if back[i].Name != cols[i].Name || back[i].Type != cols[i].Type || back[i].Required != cols[i].Required {
				t.Fatalf("column %d: %+v became %+v", i+1, cols[i], back[i])
			}
		}
	})
}

// FuzzValidate: any answer is kept in a normal form that is its own normal
// form and reads as cells, or refused with an *InvalidAnswerError.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"category":"数码","band":"low","score":4.5,"count":3,"in_stock":true,"launched":"2026-12-01","tags":["a","b"],"summary":"ok"}`,
		"```json\n{\"category\":\"家居\",\"count\":\"2\",\"summary\":1}\n```",
		`{"category":"food"}`, `[]`, `null`, `"x"`, `{"count":1e400}`, `{"count":-0.0,"category":"数码","summary":"\u0000"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, answer string) {
		norm, err := example.Validate(answer)
		if err != nil {
			var invalid *InvalidAnswerError
			if !errors.As(err, &invalid) || len(invalid.Problems) == 0 {
				t.Fatalf("Validate(%q) = %v, want an *InvalidAnswerError with problems", answer, err)
			}
			return
		}
		again, err := example.Validate(norm)
		if err != nil || again != norm {
			t.Fatalf("the normal form %s of %q is not its own: %s, %v", norm, answer, again, err)
		}
		if _, err := example.Cells(norm); err != nil {
			t.Fatalf("the normal form %s does not read as cells: %v", norm, err)
		}
	})
}
