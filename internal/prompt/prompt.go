// Package prompt parses and renders row prompt templates: text with
// {{column header}} placeholders matched on the exact (trimmed) header text,
// in any language.
package prompt

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// SyntaxError is a malformed template.
type SyntaxError struct {
	// Offset is the byte offset of the problem in the template.
	Offset int
	Reason string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("prompt template: %s at character %d", e.Reason, e.Offset+1)
}

// UnknownColumnError is a placeholder that names no column of the sheet.
type UnknownColumnError struct {
	// Placeholders are the unknown names, in template order.
	Placeholders []string
	// Columns are the sheet's column names, so the user can pick the right one.
	Columns []string
}

func (e *UnknownColumnError) Error() string {
	quoted := make([]string, len(e.Columns))
	for i, c := range e.Columns {
		quoted[i] = fmt.Sprintf("%q", c)
	}
	unknown := make([]string, len(e.Placeholders))
	for i, p := range e.Placeholders {
		unknown[i] = "{{" + p + "}}"
	}
	noun := "placeholder"
	if len(unknown) > 1 {
		noun = "placeholders"
	}
	return fmt.Sprintf("prompt template: %s %s %s no column; the columns are %s",
		noun, strings.Join(unknown, ", "), map[bool]string{true: "name", false: "names"}[len(unknown) > 1],
		strings.Join(quoted, ", "))
}

type part struct {
	literal string
	name    string // placeholder name when isVar
	isVar   bool
}

// Template is a parsed prompt template. It is immutable and safe for
// concurrent use.
type Template struct {
	text  string
	parts []part
}

// Parse parses a template. A placeholder is {{name}} where name is trimmed
// and must be non-empty; "{{" without a closing "}}" is an error so that a
// typo does not silently reach the model. Text outside placeholders is kept
// as is.
func Parse(text string) (*Template, error) {
	if strings.TrimSpace(text) == "" {
		return nil, &SyntaxError{Offset: 0, Reason: "template is empty"}
	}
	if !utf8.ValidString(text) {
		return nil, &SyntaxError{Offset: firstInvalidUTF8(text), Reason: "template is not valid UTF-8"}
	}
	t := &Template{text: text}
	rest := text
	offset := 0
	for {
		open := strings.Index(rest, "{{")
		if open < 0 {
			if rest != "" {
				t.parts = append(t.parts, part{literal: rest})
			}
			return t, nil
		}
		if open > 0 {
			t.parts = append(t.parts, part{literal: rest[:open]})
		}
		closeIdx := strings.Index(rest[open+2:], "}}")
		if closeIdx < 0 {
			return nil, &SyntaxError{Offset: offset + open, Reason: `"{{" is never closed with "}}"`}
		}
		name := strings.TrimSpace(rest[open+2 : open+2+closeIdx])
		if name == "" {
			return nil, &SyntaxError{Offset: offset + open, Reason: "empty placeholder {{}}"}
		}
		if strings.Contains(name, "{{") {
			return nil, &SyntaxError{Offset: offset + open, Reason: `"{{" is never closed with "}}"`}
		}
		t.parts = append(t.parts, part{name: name, isVar: true})
		consumed := open + 2 + closeIdx + 2
		rest = rest[consumed:]
		offset += consumed
	}
}

func firstInvalidUTF8(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return i
			}
		}
	}
	return 0
}

// Text returns the template as written.
func (t *Template) Text() string { return t.text }

// Placeholders returns the distinct placeholder names in template order.
func (t *Template) Placeholders() []string {
	var names []string
	seen := map[string]bool{}
	for _, p := range t.parts {
		if p.isVar && !seen[p.name] {
			seen[p.name] = true
			names = append(names, p.name)
		}
	}
	return names
}

// Bound is a template bound to a sheet's header, ready to render rows.
type Bound struct {
	parts   []part
	columns []int // per part: column index for placeholders
	size    int   // literal bytes, for a good initial buffer
}

// Bind resolves every placeholder to a header column (matched on the trimmed
// header text). It returns *UnknownColumnError listing every unknown
// placeholder and the available columns.
func (t *Template) Bind(header []string) (*Bound, error) {
	index := make(map[string]int, len(header))
	for i, h := range header {
		h = strings.TrimSpace(h)
		if _, dup := index[h]; !dup {
			index[h] = i
		}
	}
	b := &Bound{parts: t.parts, columns: make([]int, len(t.parts))}
	var unknown []string
	seen := map[string]bool{}
	for i, p := range t.parts {
		if !p.isVar {
			b.size += len(p.literal)
			continue
		}
		col, ok := index[p.name]
		if !ok {
			if !seen[p.name] {
				seen[p.name] = true
				unknown = append(unknown, p.name)
			}
			continue
		}
		b.columns[i] = col
	}
	if len(unknown) > 0 {
		return nil, &UnknownColumnError{Placeholders: unknown, Columns: append([]string(nil), header...)}
	}
	return b, nil
}

// Uses reports whether a placeholder of the template names the header
// column at index col (0-based).
func (b *Bound) Uses(col int) bool {
	for i, p := range b.parts {
		if p.isVar && b.columns[i] == col {
			return true
		}
	}
	return false
}

// Render fills the placeholders with the row's values (one per header
// column; missing values render as empty).
func (b *Bound) Render(values []string) string {
	var sb strings.Builder
	sb.Grow(b.size + 64)
	for i, p := range b.parts {
		if !p.isVar {
			sb.WriteString(p.literal)
			continue
		}
		if col := b.columns[i]; col < len(values) {
			sb.WriteString(values[col])
		}
	}
	return sb.String()
}
