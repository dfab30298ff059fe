package schema

import (
	"bytes"
	"cmp"
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
	if !typed {
		c.Type = Text
		return c, nil
	}
	if strings.TrimSpace(typ) == "" {
		return c, fmt.Errorf("no type after the colon; the types are %s", TypeNames())
	}
	t, values, required, err := parseTypeSpec(typ)
	c.Type, c.Values, c.Required = t, values, c.Required || required
	return c, err
}

// parseTypeSpec reads a type as the short form writes it: a name
// (ParseType), enum(a|b|c), either with a trailing "!" for required.
func parseTypeSpec(typ string) (t Type, values []string, required bool, err error) {
	typ = strings.TrimSpace(typ)
	if strings.HasSuffix(typ, "!") {
		required, typ = true, strings.TrimSpace(strings.TrimSuffix(typ, "!"))
	}
	open := strings.IndexByte(typ, '(')
	if open < 0 {
		t, err = ParseType(typ)
		return t, nil, required, err
	}
	if !strings.HasSuffix(typ, ")") {
		return "", nil, required, fmt.Errorf("%q: text after the closing parenthesis", typ)
	}
	if t, err = ParseType(typ[:open]); err != nil {
		return "", nil, required, err
	}
	if t != Enum {
		return "", nil, required, fmt.Errorf("only enum takes values in parentheses, not %s", t)
	}
	for _, v := range strings.Split(typ[open+1:len(typ)-1], "|") {
		values = append(values, strings.TrimSpace(v))
	}
	if len(values) == 1 && values[0] == "" {
		values = nil
	}
	return Enum, values, required, nil
}

// ParseTable reads a declaration from a table, as a workbook's prompt sheet
// carries it below the template: a header row naming at least a column
// (or name) and a type cell, in any order and letter case, with
// description and required cells if wanted, then a row per column down to
// the first blank row. A type is written as --columns writes it (number,
// enum(a|b|c), a trailing ! for required); a required cell that says yes
// (TRUE, yes, y, x, 1) makes the column required too. rows[0] is the
// sheet's row first; problems name sheet rows counted from first. No
// header row is no declaration: the rows may hold anything else.
func ParseTable(rows [][]string, first int) (Columns, error) {
	at := -1
	var name, typ, desc, req = -1, -1, -1, -1
	for i, row := range rows {
		name, typ, desc, req = -1, -1, -1, -1
		for j, cell := range row {
			switch strings.ToLower(strings.TrimSpace(cell)) {
			case "column", "name", "column name", "output column":
				name = j
			case "type":
				typ = j
			case "description":
				desc = j
			case "required":
				req = j
			}
		}
		if name >= 0 && typ >= 0 {
			at = i
			break
		}
	}
	if at < 0 {
		return nil, nil
	}
	cell := func(row []string, j int) string {
		if j >= 0 && j < len(row) {
			return strings.TrimSpace(row[j])
		}
		return ""
	}
	var cols Columns
	var errs []error
	for i := at + 1; i < len(rows); i++ {
		row := rows[i]
		if isBlankRow(row) {
			break
		}
		where := fmt.Sprintf("row %d", first+i)
		c := Column{Name: cell(row, name), Description: cell(row, desc)}
		if c.Name == "" {
			errs = append(errs, fmt.Errorf("%s: the column has no name", where))
			continue
		}
		t, values, required, err := parseTypeSpec(cmp.Or(cell(row, typ), string(Text)))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (%q): %w", where, c.Name, err))
			continue
		}
		switch strings.ToLower(cell(row, req)) {
		case "true", "yes", "y", "x", "1", "✓", "required":
			required = true
		}
		c.Type, c.Values, c.Required = t, values, required
		cols = append(cols, c)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("row %d: a table of output columns with no column below its header", first+at)
	}
	return cols, cols.Check()
}

func isBlankRow(row []string) bool {
	for _, c := range row {
		if strings.TrimSpace(c) != "" {
			return false
		}
	}
	return true
}

// Table is cs as ParseTable reads it: a header row (column, type,
// required, description), then a row per column with its type as the
// short form writes it. A result's added prompt sheet carries it, so the
// result sent back in is read with the same columns.
func (cs Columns) Table() [][]string {
	rows := [][]string{{"column", "type", "required", "description"}}
	for _, c := range cs {
		typ := string(c.Type)
		if c.Type == Enum {
			typ = "enum(" + strings.Join(c.Values, "|") + ")"
		}
		req := ""
		if c.Required {
			req = "yes"
		}
		rows = append(rows, []string{c.Name, typ, req, c.Description})
	}
	return rows
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

// ParseText reads a declaration from text as people write it in one
// field or file (a form field, a sidecar file, an environment variable):
// JSON when it looks like JSON (ParseJSON), else the short form
// (ParseShort). Blank is no declaration.
func ParseText(s string) (Columns, error) {
	t := strings.TrimSpace(s)
	if t != "" && (t[0] == '{' || t[0] == '[' || t[0] == '"') {
		return ParseJSON(json.RawMessage(t))
	}
	return ParseShort(s)
}

// ParseJSON reads a declaration in any of the forms a JSON request may give
// it (the API's columns field, a drop-folder sidecar): a string
// (ParseText: the short form, or JSON written as a string), a list of column objects ({"name", "type",
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
		return ParseText(s)
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
