package asl

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

type choiceRule struct {
	cond cond
	next string
}

// cond is a compiled Choice rule condition.
type cond interface {
	eval(in, ctxObj any) (bool, error)
}

type andCond []cond
type orCond []cond
type notCond struct{ c cond }

// compare is one Variable-operator condition.
type compare struct {
	variable path
	op       string
	// operand is the literal to compare with; operandPath is set for the
	// ...Path operators.
	operand     any
	operandPath *path
}

// comparisons lists the supported operators and the operand kind each
// takes ("string", "number", "bool").
var comparisons = map[string]string{
	"StringEquals": "string", "StringLessThan": "string", "StringGreaterThan": "string",
	"StringLessThanEquals": "string", "StringGreaterThanEquals": "string", "StringMatches": "string",
	"NumericEquals": "number", "NumericLessThan": "number", "NumericGreaterThan": "number",
	"NumericLessThanEquals": "number", "NumericGreaterThanEquals": "number",
	"BooleanEquals": "bool",
	"IsPresent":     "bool", "IsNull": "bool", "IsString": "bool", "IsNumeric": "bool", "IsBoolean": "bool",
}

func parseChoice(f map[string]json.RawMessage, st *state) error {
	var rules []map[string]json.RawMessage
	if err := unmarshalField(f, "Choices", &rules); err != nil || len(rules) == 0 {
		return errors.New("Choices must list at least one rule")
	}
	for i, r := range rules {
		c, err := parseCond(r, true)
		if err != nil {
			return fmt.Errorf("Choices[%d]: %w", i, err)
		}
		var next string
		if err := unmarshalField(r, "Next", &next); err != nil || next == "" {
			return fmt.Errorf("Choices[%d]: Next is required", i)
		}
		st.choices = append(st.choices, choiceRule{cond: c, next: next})
	}
	return unmarshalField(f, "Default", &st.defaultNext)
}

func parseCond(r map[string]json.RawMessage, top bool) (cond, error) {
	var op string
	for _, k := range sortedKeys(r) {
		switch k {
		case "Comment", "Variable":
		case "Next":
			if !top {
				return nil, errors.New("Next is only allowed in a top-level rule")
			}
		default:
			if op != "" {
				return nil, fmt.Errorf("rule has two operators, %s and %s", op, k)
			}
			op = k
		}
	}
	switch op {
	case "And", "Or":
		var subs []map[string]json.RawMessage
		if err := json.Unmarshal(r[op], &subs); err != nil || len(subs) == 0 {
			return nil, fmt.Errorf("%s must list rules", op)
		}
		var cs []cond
		for i, s := range subs {
			c, err := parseCond(s, false)
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %w", op, i, err)
			}
			cs = append(cs, c)
		}
		if op == "And" {
			return andCond(cs), nil
		}
		return orCond(cs), nil
	case "Not":
		var sub map[string]json.RawMessage
		if err := json.Unmarshal(r[op], &sub); err != nil {
			return nil, errors.New("Not must hold one rule")
		}
		c, err := parseCond(sub, false)
		if err != nil {
			return nil, fmt.Errorf("Not: %w", err)
		}
		return notCond{c}, nil
	case "":
		return nil, errors.New("rule has no operator")
	}
	var variable string
	if err := unmarshalField(r, "Variable", &variable); err != nil || variable == "" {
		return nil, fmt.Errorf("%s needs a Variable", op)
	}
	vp, err := parsePath(variable)
	if err != nil {
		return nil, err
	}
	c := compare{variable: vp, op: op}
	if base, ok := strings.CutSuffix(op, "Path"); ok && comparisons[base] != "" && !strings.HasPrefix(base, "Is") && base != "StringMatches" {
		var s string
		if err := json.Unmarshal(r[op], &s); err != nil {
			return nil, fmt.Errorf("%s must be a path", op)
		}
		p, err := parsePath(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		c.op, c.operandPath = base, &p
		return c, nil
	}
	kind, ok := comparisons[op]
	if !ok {
		return nil, fmt.Errorf("operator %s is not supported", op)
	}
	v, err := decode(r[op])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if !isKind(v, kind) {
		return nil, fmt.Errorf("%s needs a %s operand, not %s", op, kind, r[op])
	}
	c.operand = v
	return c, nil
}

func isKind(v any, kind string) bool {
	switch kind {
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "bool":
		_, ok := v.(bool)
		return ok
	}
	return false
}

func (c andCond) eval(in, ctxObj any) (bool, error) {
	for _, s := range c {
		ok, err := s.eval(in, ctxObj)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func (c orCond) eval(in, ctxObj any) (bool, error) {
	for _, s := range c {
		ok, err := s.eval(in, ctxObj)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

func (c notCond) eval(in, ctxObj any) (bool, error) {
	ok, err := c.c.eval(in, ctxObj)
	return !ok && err == nil, err
}

func (c compare) eval(in, ctxObj any) (bool, error) {
	src := in
	if c.variable.context {
		src = ctxObj
	}
	v, err := c.variable.get(src)
	if c.op == "IsPresent" {
		return (err == nil) == c.operand.(bool), nil
	}
	if err != nil {
		return false, err
	}
	operand := c.operand
	if c.operandPath != nil {
		osrc := in
		if c.operandPath.context {
			osrc = ctxObj
		}
		if operand, err = c.operandPath.get(osrc); err != nil {
			return false, err
		}
	}
	switch c.op {
	case "IsNull":
		return (v == nil) == operand.(bool), nil
	case "IsString":
		_, ok := v.(string)
		return ok == operand.(bool), nil
	case "IsNumeric":
		_, ok := v.(json.Number)
		return ok == operand.(bool), nil
	case "IsBoolean":
		_, ok := v.(bool)
		return ok == operand.(bool), nil
	case "BooleanEquals":
		b, ok := v.(bool)
		return ok && b == operand, nil
	case "StringMatches":
		s, ok := v.(string)
		return ok && matchWildcard(operand.(string), s), nil
	}
	if strings.HasPrefix(c.op, "String") {
		a, ok1 := v.(string)
		b, ok2 := operand.(string)
		if !ok1 || !ok2 {
			return false, nil
		}
		return ordered(c.op, strings.Compare(a, b)), nil
	}
	a, ok1 := v.(json.Number)
	b, ok2 := operand.(json.Number)
	if !ok1 || !ok2 {
		return false, nil
	}
	x, err1 := a.Float64()
	y, err2 := b.Float64()
	if err1 != nil || err2 != nil {
		return false, nil
	}
	cmp := 0
	switch {
	case x < y:
		cmp = -1
	case x > y:
		cmp = 1
	}
	return ordered(c.op, cmp), nil
}

// ordered applies the comparison named by op's suffix to cmp.
func ordered(op string, cmp int) bool {
	switch {
	case strings.HasSuffix(op, "GreaterThanEquals"):
		return cmp >= 0
	case strings.HasSuffix(op, "LessThanEquals"):
		return cmp <= 0
	case strings.HasSuffix(op, "GreaterThan"):
		return cmp > 0
	case strings.HasSuffix(op, "LessThan"):
		return cmp < 0
	}
	return cmp == 0
}

// matchWildcard matches s against pattern, where * matches any run of
// characters and \* a literal star.
func matchWildcard(pattern, s string) bool {
	var parts []string
	var cur strings.Builder
	for i := 0; i < len(pattern); i++ {
		switch {
		case pattern[i] == '\\' && i+1 < len(pattern):
			i++
			cur.WriteByte(pattern[i])
		case pattern[i] == '*':
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(pattern[i])
		}
	}
	parts = append(parts, cur.String())
	if len(parts) == 1 {
		return s == parts[0]
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return strings.HasSuffix(s, parts[len(parts)-1])
}
