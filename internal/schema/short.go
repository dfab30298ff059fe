package schema

import (
	"errors"
	"fmt"
	"strings"
)

// ParseShort reads the short form of a declaration, as --columns takes it:
//
//	category:enum(家居|数码|服饰)!, score:number, in_stock:boolean, summary:text
//
// Columns are separated by commas or line breaks (a comma inside an enum's
// parentheses belongs to a value); each is name:type, a trailing ! makes it
// required, and a name alone is a text column. Problems name the column by
// its position and text. A blank declaration is none (the one text answer).
func ParseShort(s string) (Columns, error) {
	entries, err := splitShort(s)
	if err != nil {
		return nil, err
	}
	var cols Columns
	var errs []error
	for i, e := range entries {
		c, err := parseShortColumn(e)
		if err != nil {
			errs = append(errs, fmt.Errorf("column %d (%q): %w", i+1, e, err))
			continue
		}
		cols = append(cols, c)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cols, cols.Check()
}

// splitShort splits a short-form declaration into its trimmed, non-blank
// entries at commas and line breaks outside parentheses.
func splitShort(s string) ([]string, error) {
	var entries []string
	depth, start := 0, 0
	flush := func(end int) {
		if e := strings.TrimSpace(s[start:end]); e != "" {
			entries = append(entries, e)
		}
		start = end + 1
	}
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				return nil, fmt.Errorf("a ) at character %d closes nothing", i+1)
			}
			depth--
		case ',', '\n', '\r':
			if depth == 0 {
				flush(i)
			}
		}
	}
	if depth > 0 {
		return nil, errors.New("a ( is not closed")
	}
	flush(len(s))
	return entries, nil
}

// parseShortColumn reads one entry: name, name:type, either with a trailing
// "!" for required.
func parseShortColumn(e string) (Column, error) {
	var c Column
	if strings.HasSuffix(e, "!") {
		c.Required = true
		e = strings.TrimSpace(strings.TrimSuffix(e, "!"))
	}
	name, typ, typed := strings.Cut(e, ":")
	c.Name = strings.TrimSpace(name)
	if c.Name == "" {
		return c, errors.New("the name is empty")
	}
	typ = strings.TrimSpace(typ)
	if !typed || typ == "" {
		if typed {
			return c, fmt.Errorf("no type after the colon; the types are %s", TypeNames())
		}
		c.Type = Text
		return c, nil
	}
	if open := strings.IndexByte(typ, '('); open >= 0 {
		if !strings.HasSuffix(typ, ")") {
			return c, fmt.Errorf("%q: text after the closing parenthesis", typ)
		}
		t, err := ParseType(typ[:open])
		if err != nil {
			return c, err
		}
		if t != Enum {
			return c, fmt.Errorf("only enum takes values in parentheses, not %s", t)
		}
		c.Type = Enum
		for _, v := range strings.Split(typ[open+1:len(typ)-1], "|") {
			c.Values = append(c.Values, strings.TrimSpace(v))
		}
		if len(c.Values) == 1 && c.Values[0] == "" {
			c.Values = nil
		}
		return c, nil
	}
	t, err := ParseType(typ)
	if err != nil {
		return c, err
	}
	c.Type = t
	return c, nil
}

// Short writes cs in the short form ParseShort reads, when it can say all
// of it: no descriptions, and no name or enum value holding a character
// the short form uses. ok is false otherwise.
func (cs Columns) Short() (s string, ok bool) {
	parts := make([]string, len(cs))
	for i, c := range cs {
		if c.Description != "" || strings.ContainsAny(c.Name, ":,()!|\n\r") {
			return "", false
		}
		p := c.Name + ":" + string(c.Type)
		if c.Type == Enum {
			for _, v := range c.Values {
				if strings.ContainsAny(v, ",()|\n\r") || v != strings.TrimSpace(v) {
					return "", false
				}
			}
			p = c.Name + ":enum(" + strings.Join(c.Values, "|") + ")"
		}
		if c.Required {
			p += "!"
		}
		parts[i] = p
	}
	return strings.Join(parts, ", "), true
}
