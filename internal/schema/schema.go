// Package schema is what a task's answers look like when the task declares
// output columns: the declaration (from the short form of --columns, a JSON
// Schema file, a workbook's prompt sheet or an API request), the JSON Schema
// sent to providers that can enforce it, and the one check every answer
// passes before a row is marked succeeded, on every runtime.
//
// A task that declares no columns has one text answer, as before; nothing
// here is used for it.
package schema

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxColumns is the most output columns a task may declare: each is a cell
// of every result row and a property the model must fill, and a sheet of
// hundreds of answer columns per row is a mistake, not a job.
const MaxColumns = 100

// maxNameRunes bounds a column name: it becomes a header cell and a JSON
// property name sent to the model with every row.
const maxNameRunes = 200

// Type is the kind of value a column holds.
type Type string

// The column types. Each becomes a cell of its kind in the result: numbers
// and integers numeric cells, booleans TRUE/FALSE, dates date cells; enum,
// text and list (joined with "; ") text, never formulas.
const (
	Text    Type = "text"
	Number  Type = "number"
	Integer Type = "integer"
	Boolean Type = "boolean"
	Enum    Type = "enum"
	Date    Type = "date"
	List    Type = "list"
)

// types lists the types in the order help texts name them.
var types = []Type{Text, Number, Integer, Boolean, Enum, Date, List}

// typeNames maps every spelling a declaration may use to its type: the
// names above and the JSON Schema and programming spellings people type
// without thinking (string, int, bool, float).
var typeNames = map[string]Type{
	"text": Text, "string": Text, "str": Text,
	"number": Number, "float": Number, "decimal": Number, "double": Number,
	"integer": Integer, "int": Integer,
	"boolean": Boolean, "bool": Boolean,
	"enum": Enum,
	"date": Date,
	"list": List, "array": List,
}

// TypeNames is the list of types as a help text shows it.
func TypeNames() string {
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = string(t)
		if t == Enum {
			names[i] = "enum(a|b|c)"
		}
	}
	return strings.Join(names, ", ")
}

// Column is one declared output column.
type Column struct {
	// Name is the column's header and the answer's property name.
	Name string `json:"name"`
	// Type is what its cells hold.
	Type Type `json:"type"`
	// Values are the allowed answers of an enum column, in the declared
	// order; empty for every other type.
	Values []string `json:"values,omitempty"`
	// Required makes an answer without a value for this column invalid
	// (missing, null, or blank text). Otherwise the cell is left empty.
	Required bool `json:"required,omitempty"`
	// Description tells the model what to put there.
	Description string `json:"description,omitempty"`
}

// Columns is a task's declared output columns, in result order. The empty
// declaration means one free-text answer.
type Columns []Column

// Names returns the columns' names in order.
func (cs Columns) Names() []string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.Name
	}
	return names
}

// Check reports everything wrong with a declaration, each problem naming
// the column by its position and name: more than MaxColumns, an empty or
// repeated name, an unknown type, an enum without values or with a blank or
// repeated one, values on a type that has none. Every way in (the short
// form, a JSON Schema, a prompt sheet, an API request) ends here, so they
// refuse the same things with the same words.
func (cs Columns) Check() error {
	var errs []error
	if len(cs) > MaxColumns {
		errs = append(errs, fmt.Errorf("%d columns declared; at most %d are allowed", len(cs), MaxColumns))
	}
	seen := make(map[string]int, len(cs))
	for i, c := range cs {
		where := fmt.Sprintf("column %d", i+1)
		if c.Name != "" {
			where += fmt.Sprintf(" (%q)", c.Name)
		}
		name := strings.TrimSpace(c.Name)
		switch {
		case name == "":
			errs = append(errs, fmt.Errorf("%s: the name is empty", where))
		case name != c.Name:
			errs = append(errs, fmt.Errorf("%s: the name has spaces at its ends", where))
		case utf8.RuneCountInString(name) > maxNameRunes:
			errs = append(errs, fmt.Errorf("%s: the name is longer than %d characters", where, maxNameRunes))
		case !utf8.ValidString(name) || strings.ContainsAny(name, "\x00\r\n\t"):
			errs = append(errs, fmt.Errorf("%s: the name holds a control character", where))
		}
		if j, ok := seen[strings.ToLower(name)]; ok && name != "" {
			errs = append(errs, fmt.Errorf("%s: the same name as column %d (names are compared ignoring case)", where, j+1))
		} else {
			seen[strings.ToLower(name)] = i
		}
		if !c.Type.known() {
			errs = append(errs, fmt.Errorf("%s: unknown type %q; the types are %s", where, c.Type, TypeNames()))
			continue
		}
		if c.Type != Enum {
			if len(c.Values) > 0 {
				errs = append(errs, fmt.Errorf("%s: only an enum column has values; this one is %s", where, c.Type))
			}
			continue
		}
		if len(c.Values) == 0 {
			errs = append(errs, fmt.Errorf("%s: an enum needs at least one value, as in enum(a|b|c)", where))
		}
		vals := make(map[string]bool, len(c.Values))
		for _, v := range c.Values {
			switch {
			case strings.TrimSpace(v) == "":
				errs = append(errs, fmt.Errorf("%s: an enum value is blank", where))
			case !utf8.ValidString(v):
				// JSON would carry it as U+FFFD: two such values would
				// become one, and an answer could never match it.
				errs = append(errs, fmt.Errorf("%s: the enum value %q is not valid UTF-8 text", where, v))
			case vals[v]:
				errs = append(errs, fmt.Errorf("%s: the enum value %q appears twice", where, v))
			}
			vals[v] = true
		}
	}
	return errors.Join(errs...)
}

func (t Type) known() bool {
	for _, k := range types {
		if t == k {
			return true
		}
	}
	return false
}

// ParseType reads a type name in any of its spellings (TypeNames, or
// string, int, bool, float), in any letter case.
func ParseType(s string) (Type, error) {
	if t, ok := typeNames[strings.ToLower(strings.TrimSpace(s))]; ok {
		return t, nil
	}
	return "", fmt.Errorf("unknown type %q; the types are %s", s, TypeNames())
}
