package asl

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// path is a parsed JSONPath of the subset ASL definitions use here: "$"
// followed by .field, ['field'] and [index] steps. Wildcards, filters,
// slices and recursive descent are refused when the definition is parsed.
type path struct {
	text string
	// context is true for "$$" paths into the context object.
	context bool
	steps   []step
}

type step struct {
	field string
	index int
	isIdx bool
}

func (p path) String() string { return p.text }

// parsePath parses "$...", or "$$..." for the context object.
func parsePath(s string) (path, error) {
	p := path{text: s}
	rest := s
	switch {
	case strings.HasPrefix(s, "$$"):
		p.context = true
		rest = s[2:]
	case strings.HasPrefix(s, "$"):
		rest = s[1:]
	default:
		return p, fmt.Errorf("path %q: must start with $", s)
	}
	for rest != "" {
		switch {
		case strings.HasPrefix(rest, ".."):
			return p, fmt.Errorf("path %q: recursive descent is not supported", s)
		case rest[0] == '.':
			rest = rest[1:]
			end := strings.IndexAny(rest, ".[")
			if end < 0 {
				end = len(rest)
			}
			name := rest[:end]
			if name == "" || name == "*" || strings.ContainsAny(name, "]'\"()?@ ") {
				return p, fmt.Errorf("path %q: field %q is not supported", s, name)
			}
			p.steps = append(p.steps, step{field: name})
			rest = rest[end:]
		case strings.HasPrefix(rest, "['"):
			end := strings.Index(rest, "']")
			if end < 0 {
				return p, fmt.Errorf("path %q: unterminated ['field']", s)
			}
			p.steps = append(p.steps, step{field: rest[2:end]})
			rest = rest[end+2:]
		case rest[0] == '[':
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return p, fmt.Errorf("path %q: unterminated [index]", s)
			}
			n, err := strconv.Atoi(rest[1:end])
			if err != nil || n < 0 {
				return p, fmt.Errorf("path %q: only non-negative [index] steps are supported, not %q", s, rest[:end+1])
			}
			p.steps = append(p.steps, step{index: n, isIdx: true})
			rest = rest[end+1:]
		default:
			return p, fmt.Errorf("path %q: unexpected %q", s, rest)
		}
	}
	return p, nil
}

// get returns the value at p in doc.
func (p path) get(doc any) (any, error) {
	cur := doc
	for i, st := range p.steps {
		switch {
		case st.isIdx:
			arr, ok := cur.([]any)
			if !ok || st.index >= len(arr) {
				return nil, fmt.Errorf("path %s: no element [%d] at step %d", p.text, st.index, i+1)
			}
			cur = arr[st.index]
		default:
			obj, ok := cur.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("path %s: not an object at step %d (.%s)", p.text, i+1, st.field)
			}
			v, ok := obj[st.field]
			if !ok {
				return nil, fmt.Errorf("path %s: no field %q", p.text, st.field)
			}
			cur = v
		}
	}
	return cur, nil
}

// set returns doc with v at p, creating objects along the way; doc is not
// modified. Setting "$" returns v.
func (p path) set(doc, v any) (any, error) {
	if len(p.steps) == 0 {
		return v, nil
	}
	return setSteps(doc, p.steps, v, p.text)
}

func setSteps(cur any, steps []step, v any, text string) (any, error) {
	st := steps[0]
	if st.isIdx {
		return nil, fmt.Errorf("ResultPath %s: array indexes are not supported", text)
	}
	var obj map[string]any
	switch c := cur.(type) {
	case map[string]any:
		obj = maps.Clone(c)
	case nil:
		obj = map[string]any{}
	default:
		return nil, fmt.Errorf("ResultPath %s: cannot set .%s on a %T", text, st.field, cur)
	}
	if len(steps) == 1 {
		obj[st.field] = v
		return obj, nil
	}
	child, err := setSteps(obj[st.field], steps[1:], v, text)
	if err != nil {
		return nil, err
	}
	obj[st.field] = child
	return obj, nil
}

// deepCopy copies a decoded JSON value so states never share mutable maps.
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

// decode parses JSON keeping numbers exact.
func decode(b []byte) (any, error) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("unexpected data after the JSON value")
	}
	return v, nil
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
