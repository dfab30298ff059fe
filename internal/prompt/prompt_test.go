package prompt

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestRender(t *testing.T) {
	t.Parallel()
	header := []string{"商品名称", "类目", " price "}
	tests := []struct {
		name     string
		template string
		values   []string
		want     string
	}{
		{"chinese placeholders", "为商品{{商品名称}}（类目：{{类目}}）写一段营销文案", []string{"保温杯", "家居", "9"}, "为商品保温杯（类目：家居）写一段营销文案"},
		{"trimmed names both sides", "{{ price }}元 / {{price}}", []string{"a", "b", "19.9"}, "19.9元 / 19.9"},
		{"no placeholders", "just text", []string{"a"}, "just text"},
		{"missing values render empty", "[{{类目}}]", []string{"a"}, "[]"},
		{"single braces are literal", "{x} {{类目}} }}", []string{"a", "b"}, "{x} b }}"},
		{"value with braces is not re-expanded", "{{商品名称}}", []string{"{{类目}}", "b"}, "{{类目}}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tpl, err := Parse(tt.template)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			b, err := tpl.Bind(header)
			if err != nil {
				t.Fatalf("Bind: %v", err)
			}
			if diff := cmp.Diff(tt.want, b.Render(tt.values)); diff != "" {
				t.Errorf("Render mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		template string
		want     string
	}{
		{"empty", "  ", "prompt template: template is empty at character 1"},
		{"unclosed", "abc {{name", `prompt template: "{{" is never closed with "}}" at character 5`},
		{"empty placeholder", "a{{ }}", "prompt template: empty placeholder {{}} at character 2"},
		{"nested open", "{{a {{b}}", `prompt template: "{{" is never closed with "}}" at character 1`},
		{"invalid utf8", "ab\xffc", "prompt template: template is not valid UTF-8 at character 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tt.template)
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q) error = %v, want *SyntaxError", tt.template, err)
			}
			if diff := cmp.Diff(tt.want, err.Error()); diff != "" {
				t.Errorf("message mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBindUnknownColumnListsColumns(t *testing.T) {
	t.Parallel()
	tpl, err := Parse("{{商品名}} {{类目}} {{颜色}} {{商品名}}")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tpl.Bind([]string{"商品名称", "类目"})
	var ue *UnknownColumnError
	if !errors.As(err, &ue) {
		t.Fatalf("Bind error = %v, want *UnknownColumnError", err)
	}
	want := `prompt template: placeholders {{商品名}}, {{颜色}} name no column; the columns are "商品名称", "类目"`
	if diff := cmp.Diff(want, err.Error()); diff != "" {
		t.Errorf("message mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"商品名", "类目", "颜色"}, tpl.Placeholders()); diff != "" {
		t.Errorf("Placeholders mismatch (-want +got):\n%s", diff)
	}
}

// FuzzRender checks that any template either fails to parse with a
// *SyntaxError or renders without panicking, and that rendering with values
// equal to "" reproduces exactly the literal text.
func FuzzRender(f *testing.F) {
	for _, seed := range []string{"为商品{{商品名称}}写文案", "{{a}}{{b}}", "{{", "}}{{x}}", "{{ }}", "plain", "{{a}b}}"} {
		f.Add(seed, "v1", "v2")
	}
	f.Fuzz(func(t *testing.T, template, v1, v2 string) {
		tpl, err := Parse(template)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q) error %v is not *SyntaxError", template, err)
			}
			return
		}
		header := append([]string(nil), tpl.Placeholders()...)
		b, err := tpl.Bind(header)
		if err != nil {
			t.Fatalf("Bind with its own placeholders: %v", err)
		}
		out := b.Render([]string{v1, v2})
		if utf8.ValidString(v1) && utf8.ValidString(v2) && !utf8.ValidString(out) {
			t.Fatalf("render of valid UTF-8 produced invalid UTF-8: %q", out)
		}
		empty := b.Render(nil)
		for _, name := range header {
			if strings.Contains(empty, "{{"+name+"}}") && !strings.Contains(template, "{{"+name+"}}{{") {
				// A placeholder's literal text may survive only if it was
				// literal in the template, which Parse never produces.
				t.Fatalf("placeholder {{%s}} left unrendered in %q", name, empty)
			}
		}
	})
}
