package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/clip"
)

// InvalidAnswerError is an answer that does not fit the declaration. Its
// problems, one per column, are what the model is told when it is asked
// again, and what the row's error says if it never gets it right.
type InvalidAnswerError struct {
	Problems []string
}

func (e *InvalidAnswerError) Error() string { return strings.Join(e.Problems, "; ") }

// maxQuotedRunes bounds how much of a wrong value a problem quotes.
const maxQuotedRunes = 60

// Validate checks a model's answer against cs and returns it normalised:
// a JSON object with exactly the declared columns, in order, each value of
// its type (null for a column left empty). What is accepted beyond the
// strict shape, because models in plain JSON mode write it and a re-ask
// would cost a call for nothing:
//   - the object inside a ```json fence, or with blank space around it;
//   - a property named in another letter case;
//   - a number or integer written as text ("12.5"), an integer written
//     with a zero fraction (3.0), a boolean written as "true"/"false";
//   - an enum value in another letter case or with blank space around it
//     (the declared spelling is kept);
//   - a date with a time of day (the date is kept);
//   - a list given as one text (one item), text items of a list given as
//     numbers or booleans, text given as a number or boolean.
//
// Properties that are not declared are dropped. Any other difference is an
// *InvalidAnswerError naming every column that is wrong.
func (cs Columns) Validate(answer string) (string, error) {
	obj, err := decodeObject(answer)
	if err != nil {
		return "", &InvalidAnswerError{Problems: []string{err.Error()}}
	}
	var problems []string
	values := make([]any, len(cs))
	for i, c := range cs {
		raw, found := lookup(obj, c.Name)
		v, err := c.normalise(raw, found)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: %s", c.Name, err))
		}
		values[i] = v
	}
	if len(problems) > 0 {
		return "", &InvalidAnswerError{Problems: problems}
	}
	return cs.object(values), nil
}

// object writes an answer of cs: a JSON object with each column's value
// (values[i] is column i's) in declaration order.
func (cs Columns) object(values []any) string {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, c := range cs {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSON(&b, c.Name)
		b.WriteByte(':')
		writeJSON(&b, values[i])
	}
	b.WriteByte('}')
	return b.String()
}

// decodeObject reads an answer as a JSON object, numbers kept as written.
func decodeObject(answer string) (map[string]any, error) {
	s := strings.TrimSpace(answer)
	if rest, ok := strings.CutPrefix(s, "```"); ok {
		// A fenced block: ```json\n{...}\n```
		if nl := strings.IndexByte(rest, '\n'); nl >= 0 {
			rest = rest[nl+1:]
		}
		s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "```"))
	}
	if s == "" {
		return nil, errors.New("the answer is empty; a JSON object with the declared properties was expected")
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("the answer is not JSON (%v); a JSON object with the declared properties was expected", err)
	}
	if dec.More() {
		return nil, errors.New("the answer has text after its JSON object; only the object was expected")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("the answer is a JSON %s, not an object with the declared properties", jsonKind(v))
	}
	return obj, nil
}

// lookup finds a property by its name, or else by the name in another
// letter case.
func lookup(obj map[string]any, name string) (any, bool) {
	if v, ok := obj[name]; ok {
		return v, true
	}
	for k, v := range obj {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return nil, false
}

// normalise checks one column's value and returns it in its normal form
// (nil for empty).
func (c Column) normalise(v any, found bool) (any, error) {
	if s, ok := v.(string); ok && strings.TrimSpace(s) == "" && c.Type != Text {
		v = nil // "" for a number or a date means no value
	}
	if v == nil || (c.Type == Text && v == "") {
		if c.Required {
			if !found {
				return nil, errors.New("missing, and it is required")
			}
			return nil, errors.New("empty, and it is required")
		}
		return nil, nil
	}
	switch c.Type {
	case Text:
		switch v := v.(type) {
		case string:
			return v, nil
		case json.Number:
			return v.String(), nil
		case bool:
			return strconv.FormatBool(v), nil
		}
		return nil, fmt.Errorf("want text, got %s", describe(v))
	case Number, Integer:
		f, ok := number(v)
		if !ok {
			return nil, fmt.Errorf("want a %s, got %s", map[Type]string{Number: "number", Integer: "whole number"}[c.Type], describe(v))
		}
		if c.Type == Integer {
			if f != math.Trunc(f) {
				return nil, fmt.Errorf("want a whole number, got %s", describe(v))
			}
			return json.Number(strconv.FormatFloat(f, 'f', -1, 64)), nil
		}
		return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), nil
	case Boolean:
		switch v := v.(type) {
		case bool:
			return v, nil
		case string:
			if b, err := strconv.ParseBool(strings.ToLower(strings.TrimSpace(v))); err == nil && !isDigit(v) {
				return b, nil
			}
		}
		return nil, fmt.Errorf("want true or false, got %s", describe(v))
	case Enum:
		if s, ok := v.(string); ok {
			t := strings.TrimSpace(s)
			for _, want := range c.Values {
				if t == want {
					return want, nil
				}
			}
			for _, want := range c.Values {
				if strings.EqualFold(t, strings.TrimSpace(want)) {
					return want, nil
				}
			}
		}
		return nil, fmt.Errorf("want one of %s, got %s", quoteList(c.Values), describe(v))
	case Date:
		if s, ok := v.(string); ok {
			if d, ok := parseDate(s); ok {
				return d.Format(time.DateOnly), nil
			}
		}
		return nil, fmt.Errorf("want a date as YYYY-MM-DD, got %s", describe(v))
	case List:
		switch v := v.(type) {
		case string:
			return []string{v}, nil
		case []any:
			items := make([]string, 0, len(v))
			for i, it := range v {
				switch it := it.(type) {
				case string:
					items = append(items, it)
				case json.Number:
					items = append(items, it.String())
				case bool:
					items = append(items, strconv.FormatBool(it))
				case nil:
				default:
					return nil, fmt.Errorf("want a list of texts, but item %d is %s", i+1, describe(it))
				}
			}
			return items, nil
		}
		return nil, fmt.Errorf("want a list of texts, got %s", describe(v))
	}
	return nil, fmt.Errorf("unknown type %q", c.Type)
}

func isDigit(s string) bool {
	s = strings.TrimSpace(s)
	return s == "0" || s == "1" // ParseBool's 0/1 are numbers, not booleans
}

// number reads a JSON number, or a text holding one.
func number(v any) (float64, bool) {
	var s string
	switch v := v.(type) {
	case json.Number:
		s = v.String()
	case string:
		s = strings.TrimSpace(v)
	default:
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// parseDate reads an ISO 8601 date, or a date and time of which the date is
// kept.
func parseDate(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	for _, layout := range []string{time.DateOnly, time.RFC3339, "2006-01-02T15:04:05", "2006-01-02 15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// describe says what a wrong value is, quoting it briefly.
func describe(v any) string {
	b, _ := json.Marshal(v)
	return jsonKind(v) + " " + clip.Runes(string(b), maxQuotedRunes)
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "text"
	case json.Number, float64:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "list"
	case map[string]any:
		return "object"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

func quoteList(vals []string) string {
	q := make([]string, len(vals))
	for i, v := range vals {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}

// Value is one column's cell of a validated answer.
type Value struct {
	// Type is the column's type; it says which field holds the value.
	Type Type
	// Empty is a column the answer left without a value.
	Empty bool
	// Text holds text, an enum's value and a list's items joined with
	// "; ".
	Text string
	// Number holds a number or an integer.
	Number float64
	// Bool holds a boolean.
	Bool bool
	// Date holds a date (UTC midnight).
	Date time.Time
}

// ListSeparator joins a list's items in its cell.
const ListSeparator = "; "

// Cells reads a normalised answer (what Validate returned) as one Value per
// column, for the result's cells. An answer that is not one (a result
// written by another declaration) is an error naming the column.
func (cs Columns) Cells(normalised string) ([]Value, error) {
	dec := json.NewDecoder(strings.NewReader(normalised))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return nil, errors.New("the stored answer is not a JSON object")
	}
	vals := make([]Value, len(cs))
	for i, c := range cs {
		v := Value{Type: c.Type}
		raw := obj[c.Name]
		if !storedFits(c.Type, raw) {
			return nil, fmt.Errorf("%q: the stored value is %s, not %s", c.Name, jsonKind(raw), c.Type)
		}
		switch x := raw.(type) {
		case nil:
			v.Empty = true
		case string:
			v.Text = x
			if c.Type == Date {
				d, ok := parseDate(x)
				if !ok {
					return nil, fmt.Errorf("%q: the stored date %q is not YYYY-MM-DD", c.Name, x)
				}
				v.Date = d
			}
		case json.Number:
			f, err := x.Float64()
			if err != nil {
				return nil, fmt.Errorf("%q: the stored number %q: %w", c.Name, x, err)
			}
			v.Number = f
		case bool:
			v.Bool = x
		case []any:
			items := make([]string, 0, len(x))
			for _, it := range x {
				s, _ := it.(string)
				items = append(items, s)
			}
			v.Text = strings.Join(items, ListSeparator)
			v.Empty = len(items) == 0
		default:
			return nil, fmt.Errorf("%q: the stored value is %s", c.Name, jsonKind(raw))
		}
		vals[i] = v
	}
	return vals, nil
}

// storedFits reports whether a stored JSON value is of the kind a column of
// type t holds (null fits every column).
func storedFits(t Type, raw any) bool {
	switch raw.(type) {
	case nil:
		return true
	case json.Number:
		return t == Number || t == Integer
	case bool:
		return t == Boolean
	case []any:
		return t == List
	case string:
		return t == Text || t == Enum || t == Date
	}
	return false
}

// Instructions tell a model that cannot be held to the schema (a server
// in plain JSON mode, the simulator's reader) what to answer: a JSON object
// and its properties, one per line, with type, allowed values, whether
// required and the description.
func (cs Columns) Instructions() string {
	var b strings.Builder
	b.WriteString("Answer with only a JSON object with these properties:")
	for _, c := range cs {
		b.WriteString("\n- ")
		b.WriteString(strconv.Quote(c.Name))
		b.WriteString(": ")
		switch c.Type {
		case Text:
			b.WriteString("text")
		case Number:
			b.WriteString("a number")
		case Integer:
			b.WriteString("a whole number")
		case Boolean:
			b.WriteString("true or false")
		case Enum:
			b.WriteString("one of " + quoteList(c.Values))
		case Date:
			b.WriteString("a date as \"YYYY-MM-DD\"")
		case List:
			b.WriteString("a list of texts")
		}
		if c.Required {
			b.WriteString(", required")
		} else {
			b.WriteString(", or null")
		}
		if c.Description != "" {
			b.WriteString(" (" + c.Description + ")")
		}
	}
	return b.String()
}

// SchemaMarker ends the line that introduces the JSON Schema in the
// instructions of a call in plain JSON mode (a server that refused
// structured outputs: llm.Request.SchemaInstructions), so a reader (the
// mock server) can find the schema.
const SchemaMarker = "matches this JSON Schema:"

// FollowUp is what a model is told after an answer that did not fit: what
// was wrong, and the shape again.
func (cs Columns) FollowUp(invalid *InvalidAnswerError) string {
	return "That answer does not fit: " + invalid.Error() + ".\n" + cs.Instructions()
}
