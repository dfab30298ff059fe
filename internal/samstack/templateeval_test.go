package samstack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
)

// template is a CloudFormation/SAM template as the template checks
// (template_test.go) read it: they assert what template.yaml declares
// without the emulator or Python, so this small evaluator of its intrinsic
// functions lives with the tests. Provision itself hands the SAM
// translation to the emulator's CloudFormation. Values are plain Go trees (map[string]any, []any, string, int,
// float64, bool, nil); intrinsic functions are kept in their long form
// ({"Ref": x}, {"Fn::Sub": x}, ...) whether the file used !Ref or Ref.
type template struct {
	// dir is the directory of the template file; DefinitionUri paths are relative to it.
	dir        string
	parameters map[string]parameter
	conditions map[string]any
	globals    map[string]any
	resources  map[string]resource
	outputs    map[string]any
}

type parameter struct {
	typ        string
	def        any
	hasDefault bool
}

type resource struct {
	id         string
	typ        string
	condition  string
	properties map[string]any
	metadata   map[string]any
}

// loadTemplate reads and decodes a YAML or JSON template file.
func loadTemplate(path string) (*template, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read template: %w", err)
	}
	t, err := parseTemplate(data)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", path, err)
	}
	t.dir = filepath.Dir(path)
	return t, nil
}

// parseTemplate decodes template text.
func parseTemplate(data []byte) (*template, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	root, err := fromNode(&doc)
	if err != nil {
		return nil, err
	}
	top, ok := root.(map[string]any)
	if !ok {
		return nil, errors.New("top level is not a mapping")
	}
	t := &template{
		parameters: map[string]parameter{},
		conditions: map[string]any{},
		resources:  map[string]resource{},
	}
	if v, ok := top["Conditions"]; ok {
		if t.conditions, ok = v.(map[string]any); !ok {
			return nil, errors.New("Conditions is not a mapping")
		}
	}
	if v, ok := top["Globals"]; ok {
		if t.globals, ok = v.(map[string]any); !ok {
			return nil, errors.New("Globals is not a mapping")
		}
	}
	if v, ok := top["Outputs"]; ok {
		if t.outputs, ok = v.(map[string]any); !ok {
			return nil, errors.New("Outputs is not a mapping")
		}
	}
	if v, ok := top["Parameters"]; ok {
		params, ok := v.(map[string]any)
		if !ok {
			return nil, errors.New("Parameters is not a mapping")
		}
		for name, raw := range params {
			p, ok := raw.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("parameter %s is not a mapping", name)
			}
			typ, _ := p["Type"].(string)
			def, has := p["Default"]
			t.parameters[name] = parameter{typ: typ, def: def, hasDefault: has}
		}
	}
	res, ok := top["Resources"].(map[string]any)
	if !ok {
		return nil, errors.New("Resources is missing or not a mapping")
	}
	for id, raw := range res {
		r, ok := raw.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("resource %s is not a mapping", id)
		}
		typ, ok := r["Type"].(string)
		if !ok {
			return nil, fmt.Errorf("resource %s has no Type", id)
		}
		cond, _ := r["Condition"].(string)
		props, _ := r["Properties"].(map[string]any)
		if props == nil {
			props = map[string]any{}
		}
		meta, _ := r["Metadata"].(map[string]any)
		t.resources[id] = resource{id: id, typ: typ, condition: cond, properties: props, metadata: meta}
		// SAM generates resources a template may name: a function with a
		// FunctionUrlConfig gets an AWS::Lambda::Url called <Id>Url
		// (its FunctionUrl attribute is the URL).
		if _, hasURL := props["FunctionUrlConfig"]; hasURL && typ == "AWS::Serverless::Function" {
			t.resources[id+"Url"] = resource{id: id + "Url", typ: "AWS::Lambda::Url", condition: cond, properties: map[string]any{}}
		}
	}
	return t, nil
}

// fromNode converts a YAML node to a plain Go tree, turning the short-form
// intrinsic tags (!Ref, !GetAtt, !Sub, !If, ...) into their long form.
func fromNode(n *yaml.Node) (any, error) {
	var v any
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, errors.New("empty document")
		}
		return fromNode(n.Content[0])
	case yaml.AliasNode:
		return fromNode(n.Alias)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: mapping key is not a scalar", k.Line)
			}
			if _, dup := m[k.Value]; dup {
				return nil, fmt.Errorf("line %d: duplicate key %q", k.Line, k.Value)
			}
			x, err := fromNode(val)
			if err != nil {
				return nil, err
			}
			m[k.Value] = x
		}
		v = m
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			x, err := fromNode(c)
			if err != nil {
				return nil, err
			}
			s = append(s, x)
		}
		v = s
	case yaml.ScalarNode:
		if isIntrinsicTag(n.Tag) {
			v = n.Value
			break
		}
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
	default:
		return nil, fmt.Errorf("line %d: unsupported YAML node kind %d", n.Line, n.Kind)
	}
	if !isIntrinsicTag(n.Tag) {
		return v, nil
	}
	switch name := n.Tag[1:]; name {
	case "Ref", "Condition":
		return map[string]any{name: v}, nil
	case "GetAtt":
		if s, ok := v.(string); ok {
			id, attr, found := strings.Cut(s, ".")
			if !found {
				return nil, fmt.Errorf("line %d: !GetAtt %q is not Resource.Attribute", n.Line, s)
			}
			v = []any{id, attr}
		}
		return map[string]any{"Fn::GetAtt": v}, nil
	default:
		return map[string]any{"Fn::" + name: v}, nil
	}
}

// isIntrinsicTag reports whether tag is a CloudFormation short form such as
// !Ref, as opposed to a YAML core tag (!!str) or no tag.
func isIntrinsicTag(tag string) bool {
	return len(tag) > 1 && tag[0] == '!' && tag[1] != '!'
}

// noValue is what AWS::NoValue evaluates to; containers drop it.
type noValue struct{}

// resolver answers Ref and Fn::GetAtt on resources.
type resolver interface {
	ref(id string) (any, error)
	getAtt(id, attr string) (any, error)
}

// evaluator resolves intrinsic functions against parameter values, pseudo
// parameters and a resolver for resources.
type evaluator struct {
	tpl    *template
	params map[string]any
	pseudo map[string]any
	res    resolver
	conds  map[string]bool
}

func newEvaluator(t *template, overrides map[string]string, pseudo map[string]any, res resolver) (*evaluator, error) {
	params := make(map[string]any, len(t.parameters))
	for name, p := range t.parameters {
		if p.hasDefault {
			params[name] = p.def
		}
	}
	for name, v := range overrides {
		if _, ok := t.parameters[name]; !ok {
			return nil, fmt.Errorf("parameter override %s: no such parameter in the template", name)
		}
		params[name] = v
	}
	for name, v := range params {
		if t.parameters[name].typ == "CommaDelimitedList" || strings.HasPrefix(t.parameters[name].typ, "List<") {
			if s, ok := v.(string); ok {
				parts := strings.Split(s, ",")
				list := make([]any, len(parts))
				for i, p := range parts {
					list[i] = strings.TrimSpace(p)
				}
				params[name] = list
			}
		}
	}
	return &evaluator{tpl: t, params: params, pseudo: pseudo, res: res, conds: map[string]bool{}}, nil
}

// eval returns v with every intrinsic function resolved.
func (e *evaluator) eval(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 1 {
			for k, arg := range x {
				if k == "Ref" || strings.HasPrefix(k, "Fn::") {
					return e.intrinsic(k, arg)
				}
			}
		}
		out := make(map[string]any, len(x))
		for k, val := range x {
			r, err := e.eval(val)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			if _, drop := r.(noValue); !drop {
				out[k] = r
			}
		}
		return out, nil
	case []any:
		out := make([]any, 0, len(x))
		for i, val := range x {
			r, err := e.eval(val)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			if _, drop := r.(noValue); !drop {
				out = append(out, r)
			}
		}
		return out, nil
	default:
		return v, nil
	}
}

func (e *evaluator) intrinsic(name string, arg any) (any, error) {
	switch name {
	case "Ref":
		id, ok := arg.(string)
		if !ok {
			return nil, fmt.Errorf("Ref: argument is %T, not a name", arg)
		}
		return e.ref(id)
	case "Fn::GetAtt":
		args, err := e.evalList(name, arg, 2)
		if err != nil {
			return nil, err
		}
		id, ok1 := args[0].(string)
		attr, ok2 := args[1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("Fn::GetAtt: arguments must be strings, got %v", args)
		}
		if _, ok := e.tpl.resources[id]; !ok {
			return nil, fmt.Errorf("Fn::GetAtt %s.%s: no resource %s", id, attr, id)
		}
		return e.res.getAtt(id, attr)
	case "Fn::Sub":
		return e.sub(arg)
	case "Fn::If":
		args, ok := arg.([]any)
		if !ok || len(args) != 3 {
			return nil, errors.New("Fn::If: want [condition, then, else]")
		}
		cond, ok := args[0].(string)
		if !ok {
			return nil, fmt.Errorf("Fn::If: condition name is %T", args[0])
		}
		holds, err := e.condition(cond)
		if err != nil {
			return nil, err
		}
		if holds {
			return e.eval(args[1])
		}
		return e.eval(args[2])
	case "Fn::Join":
		args, err := e.evalList(name, arg, 2)
		if err != nil {
			return nil, err
		}
		sep, ok := args[0].(string)
		items, ok2 := args[1].([]any)
		if !ok || !ok2 {
			return nil, errors.New("Fn::Join: want [separator, [values]]")
		}
		parts := make([]string, len(items))
		for i, it := range items {
			s, err := scalarString(it)
			if err != nil {
				return nil, fmt.Errorf("Fn::Join[%d]: %w", i, err)
			}
			parts[i] = s
		}
		return strings.Join(parts, sep), nil
	case "Fn::Select":
		args, err := e.evalList(name, arg, 2)
		if err != nil {
			return nil, err
		}
		idx, err := toInt(args[0])
		if err != nil {
			return nil, fmt.Errorf("Fn::Select index: %w", err)
		}
		items, ok := args[1].([]any)
		if !ok || idx < 0 || int(idx) >= len(items) {
			return nil, fmt.Errorf("Fn::Select: index %d out of range", idx)
		}
		return items[idx], nil
	case "Fn::Split":
		args, err := e.evalList(name, arg, 2)
		if err != nil {
			return nil, err
		}
		sep, ok1 := args[0].(string)
		s, ok2 := args[1].(string)
		if !ok1 || !ok2 {
			return nil, errors.New("Fn::Split: want [separator, string]")
		}
		parts := strings.Split(s, sep)
		out := make([]any, len(parts))
		for i, p := range parts {
			out[i] = p
		}
		return out, nil
	case "Fn::Equals", "Fn::Not", "Fn::And", "Fn::Or":
		return e.condExpr(map[string]any{name: arg})
	default:
		return nil, fmt.Errorf("%s: intrinsic function not supported by samstack", name)
	}
}

// evalList evaluates arg as a list of exactly n items.
func (e *evaluator) evalList(name string, arg any, n int) ([]any, error) {
	v, err := e.eval(arg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	list, ok := v.([]any)
	if !ok || len(list) != n {
		return nil, fmt.Errorf("%s: want a list of %d arguments, got %v", name, n, v)
	}
	return list, nil
}

func (e *evaluator) ref(id string) (any, error) {
	if v, ok := e.pseudo[id]; ok {
		return v, nil
	}
	if strings.HasPrefix(id, "AWS::") {
		return nil, fmt.Errorf("Ref %s: unknown pseudo parameter", id)
	}
	if _, ok := e.tpl.parameters[id]; ok {
		v, ok := e.params[id]
		if !ok {
			return nil, fmt.Errorf("Ref %s: parameter has no Default; pass WithParameter", id)
		}
		return v, nil
	}
	if _, ok := e.tpl.resources[id]; ok {
		return e.res.ref(id)
	}
	return nil, fmt.Errorf("Ref %s: no such parameter or resource", id)
}

func (e *evaluator) sub(arg any) (any, error) {
	var (
		text string
		vars map[string]any
	)
	switch x := arg.(type) {
	case string:
		text = x
	case []any:
		if len(x) != 2 {
			return nil, errors.New("Fn::Sub: want a string or [string, {variables}]")
		}
		s, ok := x[0].(string)
		m, ok2 := x[1].(map[string]any)
		if !ok || !ok2 {
			return nil, errors.New("Fn::Sub: want [string, {variables}]")
		}
		text, vars = s, m
	default:
		return nil, fmt.Errorf("Fn::Sub: argument is %T", arg)
	}
	var firstErr error
	out := subVar.ReplaceAllStringFunc(text, func(m string) string {
		name := m[2 : len(m)-1]
		if strings.HasPrefix(name, "!") {
			return "${" + name[1:] + "}"
		}
		v, err := e.subValue(name, vars)
		if err == nil {
			var s string
			if s, err = scalarString(v); err == nil {
				return s
			}
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("Fn::Sub ${%s}: %w", name, err)
		}
		return m
	})
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

func (e *evaluator) subValue(name string, vars map[string]any) (any, error) {
	if v, ok := vars[name]; ok {
		return e.eval(v)
	}
	if id, attr, ok := strings.Cut(name, "."); ok && !strings.HasPrefix(name, "AWS::") {
		if _, known := e.tpl.resources[id]; !known {
			return nil, fmt.Errorf("no resource %s", id)
		}
		return e.res.getAtt(id, attr)
	}
	return e.ref(name)
}

// condition evaluates a named condition from the Conditions section.
func (e *evaluator) condition(name string) (bool, error) {
	if v, ok := e.conds[name]; ok {
		return v, nil
	}
	expr, ok := e.tpl.conditions[name]
	if !ok {
		return false, fmt.Errorf("condition %s: not defined", name)
	}
	e.conds[name] = false // a self-referencing condition evaluates to false instead of recursing forever
	v, err := e.condExpr(expr)
	if err != nil {
		return false, fmt.Errorf("condition %s: %w", name, err)
	}
	e.conds[name] = v
	return v, nil
}

func (e *evaluator) condExpr(expr any) (bool, error) {
	m, ok := expr.(map[string]any)
	if !ok || len(m) != 1 {
		return false, fmt.Errorf("condition expression %v is not a single function", expr)
	}
	var (
		fn  string
		arg any
	)
	for k, v := range m {
		fn, arg = k, v
	}
	switch fn {
	case "Condition":
		name, ok := arg.(string)
		if !ok {
			return false, fmt.Errorf("Condition: name is %T", arg)
		}
		return e.condition(name)
	case "Fn::Equals":
		args, err := e.evalList(fn, arg, 2)
		if err != nil {
			return false, err
		}
		a, err1 := scalarString(args[0])
		b, err2 := scalarString(args[1])
		if err := errors.Join(err1, err2); err != nil {
			return false, fmt.Errorf("Fn::Equals: %w", err)
		}
		return a == b, nil
	case "Fn::Not", "Fn::And", "Fn::Or":
		args, ok := arg.([]any)
		if !ok || len(args) == 0 {
			return false, fmt.Errorf("%s: want a list of conditions", fn)
		}
		vals := make([]bool, len(args))
		for i, a := range args {
			v, err := e.condExpr(a)
			if err != nil {
				return false, fmt.Errorf("%s[%d]: %w", fn, i, err)
			}
			vals[i] = v
		}
		switch fn {
		case "Fn::Not":
			if len(vals) != 1 {
				return false, errors.New("Fn::Not: want exactly one condition")
			}
			return !vals[0], nil
		case "Fn::And":
			for _, v := range vals {
				if !v {
					return false, nil
				}
			}
			return true, nil
		default:
			for _, v := range vals {
				if v {
					return true, nil
				}
			}
			return false, nil
		}
	default:
		return false, fmt.Errorf("%s: not a condition function", fn)
	}
}
