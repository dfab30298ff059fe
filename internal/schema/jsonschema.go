package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// ParseJSONSchema reads a declaration from a JSON Schema object, as
// --schema takes it: its properties, in the order the document lists them,
// become the columns, its required list makes them required, and each
// property's description is passed to the model. A property is
//
//	{"type": "string"}                          text
//	{"type": "string", "enum": [...]}           enum (or "enum" alone)
//	{"type": "string", "format": "date"}        date (ISO 8601)
//	{"type": "number"} / {"type": "integer"}    number / integer
//	{"type": "boolean"}                         boolean
//	{"type": "array", "items": {"type": "string"}}  list
//
// and a type may be given with "null" (["number", "null"]). Anything else
// (a nested object, an array of objects) is refused, naming the property:
// a column holds one value.
func ParseJSONSchema(data []byte) (Columns, error) {
	var doc struct {
		Type       json.RawMessage `json:"type"`
		Properties json.RawMessage `json:"properties"`
		Required   []string        `json:"required"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, fmt.Errorf("not JSON: %s at byte %d", syn, syn.Offset)
		}
		return nil, fmt.Errorf("not a JSON Schema object: %w", err)
	}
	if doc.Type != nil {
		types, err := schemaTypes(doc.Type)
		if err != nil || !slices.Equal(types, []string{"object"}) {
			return nil, fmt.Errorf("the schema's type is %s; a declaration of columns is an object (\"type\": \"object\") with properties", doc.Type)
		}
	}
	if len(bytes.TrimSpace(doc.Properties)) == 0 || string(bytes.TrimSpace(doc.Properties)) == "null" {
		return nil, errors.New("the schema has no properties: each property of the object becomes an output column")
	}
	names, props, err := orderedObject(doc.Properties)
	if err != nil {
		return nil, fmt.Errorf("properties: %w", err)
	}
	var cols Columns
	var nullable []bool
	var errs []error
	for i, name := range names {
		c, null, err := parseProperty(name, props[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("property %q: %w", name, err))
			continue
		}
		cols, nullable = append(cols, c), append(nullable, null)
	}
	for _, r := range doc.Required {
		if !slices.Contains(names, r) {
			errs = append(errs, fmt.Errorf("required names %q, which is not a property", r))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i := range cols {
		// Strict mode lists every property as required and lets the
		// optional ones be null: required and nullable is optional.
		cols[i].Required = slices.Contains(doc.Required, cols[i].Name) && !nullable[i]
	}
	return cols, cols.Check()
}

// parseProperty reads one property's schema as a column; nullable says
// whether it allows null.
func parseProperty(name string, raw json.RawMessage) (c Column, nullable bool, err error) {
	c, err = parsePropertyOf(name, raw, &nullable)
	return c, nullable, err
}

func parsePropertyOf(name string, raw json.RawMessage, nullable *bool) (Column, error) {
	var p struct {
		Type        json.RawMessage `json:"type"`
		Enum        []any           `json:"enum"`
		Format      string          `json:"format"`
		Items       json.RawMessage `json:"items"`
		Description string          `json:"description"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return Column{}, errors.New("not a schema object")
	}
	c := Column{Name: name, Description: strings.TrimSpace(p.Description)}
	var typ string
	if p.Type != nil {
		types, err := schemaTypes(p.Type)
		if err != nil {
			return c, err
		}
		*nullable = slices.Contains(types, "null")
		types = slices.DeleteFunc(types, func(t string) bool { return t == "null" })
		if len(types) != 1 {
			return c, fmt.Errorf("type %s: a column holds one type of value", p.Type)
		}
		typ = types[0]
	}
	if p.Enum != nil {
		if typ != "" && typ != "string" {
			return c, fmt.Errorf("an enum of type %s: enum values are text", typ)
		}
		c.Type = Enum
		c.Values = []string{} // declared, even if empty: Check says it needs values
		for _, v := range p.Enum {
			switch v := v.(type) {
			case string:
				c.Values = append(c.Values, v)
			case nil:
				// ["a", "b", null]: the column may be left empty.
				*nullable = true
			default:
				return c, fmt.Errorf("enum value %v is not text", v)
			}
		}
		return c, nil
	}
	switch typ {
	case "string":
		c.Type = Text
		if p.Format == "date" {
			c.Type = Date
		}
	case "number":
		c.Type = Number
	case "integer":
		c.Type = Integer
	case "boolean":
		c.Type = Boolean
	case "array":
		c.Type = List
		if p.Items != nil {
			var items struct {
				Type json.RawMessage `json:"type"`
			}
			if err := json.Unmarshal(p.Items, &items); err != nil {
				return c, errors.New("items: not a schema object")
			}
			if items.Type != nil {
				t, err := schemaTypes(items.Type)
				if err != nil || !slices.Equal(t, []string{"string"}) {
					return c, fmt.Errorf("items of type %s: a list column holds text items", items.Type)
				}
			}
		}
	case "":
		return c, errors.New("no type (and no enum)")
	case "object":
		return c, errors.New("a nested object: a column holds one value; declare its fields as columns of their own")
	default:
		return c, fmt.Errorf("unknown type %q; the types are string, number, integer, boolean and array of strings", typ)
	}
	return c, nil
}

// schemaTypes reads a JSON Schema "type": one name or a list of names.
func schemaTypes(raw json.RawMessage) ([]string, error) {
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("type %s is neither a name nor a list of names", raw)
	}
	return many, nil
}

// orderedObject reads a JSON object's keys in document order with their
// values. encoding/json's maps forget the order, and a schema's property
// order is the order of the columns.
func orderedObject(raw json.RawMessage) ([]string, []json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, errors.New("not an object")
	}
	var names []string
	var values []json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		name, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, fmt.Errorf("%q: %w", name, err)
		}
		if slices.Contains(names, name) {
			return nil, nil, fmt.Errorf("%q appears twice", name)
		}
		names, values = append(names, name), append(values, v)
	}
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	return names, values, nil
}

// JSONSchema is the schema of an answer to cs, as providers that enforce a
// shape take it (OpenAI's strict structured outputs, a Bedrock tool's input
// schema): an object with a property per column in declaration order, every
// property listed as required and no others allowed, as strict mode
// demands; a column that is not required may be null instead. The same
// declaration always gives the same bytes, so it can be part of a cache
// key.
func (cs Columns) JSONSchema() json.RawMessage {
	var b bytes.Buffer
	b.WriteString(`{"type":"object","properties":{`)
	for i, c := range cs {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSON(&b, c.Name)
		b.WriteByte(':')
		b.Write(c.propertySchema())
	}
	b.WriteString(`},"required":`)
	writeJSON(&b, cs.Names())
	b.WriteString(`,"additionalProperties":false}`)
	return b.Bytes()
}

// propertySchema is one column's JSON Schema.
func (c Column) propertySchema() []byte {
	type prop struct {
		Type        any    `json:"type"`
		Enum        []any  `json:"enum,omitempty"`
		Format      string `json:"format,omitempty"`
		Items       any    `json:"items,omitempty"`
		Description string `json:"description,omitempty"`
	}
	p := prop{Description: c.Description}
	var typ string
	switch c.Type {
	case Number:
		typ = "number"
	case Integer:
		typ = "integer"
	case Boolean:
		typ = "boolean"
	case List:
		typ = "array"
		p.Items = map[string]string{"type": "string"}
	case Date:
		typ = "string"
		p.Format = "date"
		p.Description = strings.TrimSpace(p.Description + " (a date as YYYY-MM-DD)")
	default:
		typ = "string"
	}
	if c.Type == Enum {
		for _, v := range c.Values {
			p.Enum = append(p.Enum, v)
		}
		if !c.Required {
			p.Enum = append(p.Enum, nil)
		}
	}
	p.Type = typ
	if !c.Required {
		p.Type = []string{typ, "null"}
	}
	var b bytes.Buffer
	writeJSON(&b, p)
	return b.Bytes()
}

// writeJSON writes v without HTML escaping (a schema is not HTML, and a
// description with "<" should read as written).
func writeJSON(b *bytes.Buffer, v any) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // plain values: cannot fail
	b.Truncate(b.Len() - 1)
}
