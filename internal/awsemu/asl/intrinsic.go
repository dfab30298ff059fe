package asl

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// expr is the value of a "key.$" field, ErrorPath or CausePath: a path into
// the input, a path into the context object ($$), or an intrinsic function.
type expr interface {
	eval(in, ctxObj any) (any, error)
}

type pathExpr struct{ p path }

func (e pathExpr) eval(in, ctxObj any) (any, error) {
	if e.p.context {
		return e.p.get(ctxObj)
	}
	return e.p.get(in)
}

type literal struct{ v any }

func (l literal) eval(any, any) (any, error) { return l.v, nil }

// intrinsic is a call of one of the supported intrinsic functions.
type intrinsic struct {
	name string
	args []expr
}

// intrinsics are the functions the runner implements, with their arity
// (-1: any).
var intrinsics = map[string]int{
	"States.Format":       -1,
	"States.StringToJson": 1,
	"States.JsonToString": 1,
	"States.Array":        -1,
}

func parseExpr(s string) (expr, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "States.") {
		p := &exprParser{s: s}
		e, err := p.intrinsic()
		if err != nil {
			return nil, fmt.Errorf("intrinsic %q: %w", s, err)
		}
		if p.skipSpace(); p.pos != len(s) {
			return nil, fmt.Errorf("intrinsic %q: unexpected %q after the call", s, s[p.pos:])
		}
		return e, nil
	}
	p, err := parsePath(s)
	if err != nil {
		return nil, err
	}
	return pathExpr{p}, nil
}

type exprParser struct {
	s   string
	pos int
}

func (p *exprParser) skipSpace() {
	for p.pos < len(p.s) && p.s[p.pos] == ' ' {
		p.pos++
	}
}

func (p *exprParser) intrinsic() (expr, error) {
	open := strings.IndexByte(p.s[p.pos:], '(')
	if open < 0 {
		return nil, fmt.Errorf("missing (")
	}
	name := strings.TrimSpace(p.s[p.pos : p.pos+open])
	arity, ok := intrinsics[name]
	if !ok {
		return nil, fmt.Errorf("function %s is not supported", name)
	}
	p.pos += open + 1
	call := intrinsic{name: name}
	p.skipSpace()
	if p.pos < len(p.s) && p.s[p.pos] == ')' {
		p.pos++
	} else {
		for {
			arg, err := p.arg()
			if err != nil {
				return nil, err
			}
			call.args = append(call.args, arg)
			p.skipSpace()
			if p.pos >= len(p.s) {
				return nil, fmt.Errorf("missing )")
			}
			if p.s[p.pos] == ')' {
				p.pos++
				break
			}
			if p.s[p.pos] != ',' {
				return nil, fmt.Errorf("unexpected %q in the arguments", p.s[p.pos:])
			}
			p.pos++
		}
	}
	if arity >= 0 && len(call.args) != arity {
		return nil, fmt.Errorf("%s takes %d arguments, got %d", name, arity, len(call.args))
	}
	if name == "States.Format" {
		if len(call.args) == 0 {
			return nil, fmt.Errorf("States.Format needs a template")
		}
		tmpl, ok := call.args[0].(literal)
		s, isString := tmpl.v.(string)
		if !ok || !isString {
			return nil, fmt.Errorf("States.Format's template must be a string literal")
		}
		if n := strings.Count(s, "{}"); n != len(call.args)-1 {
			return nil, fmt.Errorf("States.Format template has %d {} for %d arguments", n, len(call.args)-1)
		}
	}
	return call, nil
}

func (p *exprParser) arg() (expr, error) {
	p.skipSpace()
	if p.pos >= len(p.s) {
		return nil, fmt.Errorf("missing argument")
	}
	rest := p.s[p.pos:]
	switch {
	case rest[0] == '\'':
		return p.stringLiteral()
	case strings.HasPrefix(rest, "States."):
		return p.intrinsic()
	case rest[0] == '$':
		end := p.argEnd()
		pth, err := parsePath(strings.TrimSpace(p.s[p.pos:end]))
		if err != nil {
			return nil, err
		}
		p.pos = end
		return pathExpr{pth}, nil
	default:
		end := p.argEnd()
		tok := strings.TrimSpace(p.s[p.pos:end])
		p.pos = end
		switch tok {
		case "true":
			return literal{true}, nil
		case "false":
			return literal{false}, nil
		case "null":
			return literal{nil}, nil
		}
		if _, err := strconv.ParseFloat(tok, 64); err == nil {
			return literal{json.Number(tok)}, nil
		}
		return nil, fmt.Errorf("unsupported argument %q", tok)
	}
}

// argEnd finds the end of an unquoted argument: the next ',' or ')'.
func (p *exprParser) argEnd() int {
	for i := p.pos; i < len(p.s); i++ {
		if p.s[i] == ',' || p.s[i] == ')' {
			return i
		}
	}
	return len(p.s)
}

// stringLiteral reads '...' with the escapes \' \\ \{ \}. Escaped braces
// stay escaped so States.Format can tell them from placeholders.
func (p *exprParser) stringLiteral() (expr, error) {
	var b strings.Builder
	for i := p.pos + 1; i < len(p.s); i++ {
		c := p.s[i]
		switch c {
		case '\\':
			if i+1 >= len(p.s) {
				return nil, fmt.Errorf("unterminated escape")
			}
			i++
			switch p.s[i] {
			case '{', '}':
				b.WriteByte('\\')
			}
			b.WriteByte(p.s[i])
		case '\'':
			p.pos = i + 1
			return literal{b.String()}, nil
		default:
			b.WriteByte(c)
		}
	}
	return nil, fmt.Errorf("unterminated string")
}

func (c intrinsic) eval(in, ctxObj any) (any, error) {
	args := make([]any, len(c.args))
	for i, a := range c.args {
		v, err := a.eval(in, ctxObj)
		if err != nil {
			return nil, fmt.Errorf("%s argument %d: %w", c.name, i+1, err)
		}
		args[i] = v
	}
	switch c.name {
	case "States.Format":
		return format(args[0].(string), args[1:])
	case "States.StringToJson":
		s, ok := args[0].(string)
		if !ok {
			return nil, fmt.Errorf("States.StringToJson: argument is a %T, not a string", args[0])
		}
		v, err := decode([]byte(s))
		if err != nil {
			return nil, fmt.Errorf("States.StringToJson: %w", err)
		}
		return v, nil
	case "States.JsonToString":
		b, err := json.Marshal(args[0])
		if err != nil {
			return nil, fmt.Errorf("States.JsonToString: %w", err)
		}
		return string(b), nil
	case "States.Array":
		return args, nil
	}
	return nil, fmt.Errorf("function %s is not supported", c.name)
}

// format fills the {} placeholders of tmpl with args: strings as they are,
// numbers, booleans and null as JSON; objects and arrays are refused, as
// Step Functions refuses them.
func format(tmpl string, args []any) (string, error) {
	var b strings.Builder
	next := 0
	for i := 0; i < len(tmpl); i++ {
		switch {
		case tmpl[i] == '\\' && i+1 < len(tmpl):
			i++
			b.WriteByte(tmpl[i])
		case strings.HasPrefix(tmpl[i:], "{}"):
			switch v := args[next].(type) {
			case string:
				b.WriteString(v)
			case json.Number:
				b.WriteString(v.String())
			case bool:
				b.WriteString(strconv.FormatBool(v))
			case nil:
				b.WriteString("null")
			case float64:
				b.WriteString(strconv.FormatFloat(v, 'f', -1, 64))
			default:
				return "", fmt.Errorf("States.Format: argument %d is a %T; only strings, numbers, booleans and null are allowed", next+2, v)
			}
			next++
			i++
		default:
			b.WriteByte(tmpl[i])
		}
	}
	return b.String(), nil
}
