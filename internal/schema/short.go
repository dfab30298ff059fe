package schema

import (
	"bytes"
	"encoding/json"
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

// ParseJSON reads a declaration in any of the forms a JSON request may give
// it (the API's columns field, a drop-folder sidecar): a string in the
// short form (ParseShort), a list of column objects ({"name", "type",
// "values", "required", "description"}, types in any spelling ParseType
// reads), or a JSON Schema object (ParseJSONSchema). null or absent is no
// declaration.
func ParseJSON(raw json.RawMessage) (Columns, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("not a JSON string: %w", err)
		}
		return ParseShort(s)
	case '{':
		return ParseJSONSchema(raw)
	case '[':
		var list []struct {
			Name        *string  `json:"name"`
			Type        string   `json:"type"`
			Values      []string `json:"values"`
			Required    bool     `json:"required"`
			Description string   `json:"description"`
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&list); err != nil {
			return nil, fmt.Errorf(`a list of columns: %w; each is {"name", "type", "values" (enum), "required", "description"}`, err)
		}
		cols := make(Columns, len(list))
		var errs []error
		for i, c := range list {
			if c.Name == nil {
				errs = append(errs, fmt.Errorf("column %d: no name", i+1))
				continue
			}
			t, err := ParseType(c.Type)
			if err != nil {
				errs = append(errs, fmt.Errorf("column %d (%q): %w", i+1, *c.Name, err))
				continue
			}
			cols[i] = Column{Name: *c.Name, Type: t, Values: c.Values, Required: c.Required, Description: strings.TrimSpace(c.Description)}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		return cols, cols.Check()
	}
	return nil, errors.New(`columns: give a string ("category:enum(a|b)!, score:number"), a list of {"name", "type"} objects, or a JSON Schema object`)
}
