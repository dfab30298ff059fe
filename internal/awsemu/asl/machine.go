// Package asl runs Amazon States Language state machines in-process, for
// tests: the export state machine's real definition (after
// DefinitionSubstitutions) with its Lambda tasks calling registered Go
// handlers and its DynamoDB tasks calling a real (emulated) DynamoDB.
//
// moto can execute a state machine, but its Lambda runs code only in
// Docker, so a Task there cannot reach a Go handler. The runner implements
// the subset of ASL the definition uses, strictly: Parse refuses any state
// type, field, resource, path or intrinsic function it does not implement,
// so a definition change the runner cannot honour fails loudly instead of
// being half-run.
//
// Supported: Task (a Lambda ARN, arn:aws:states:::lambda:invoke,
// arn:aws:states:::dynamodb:updateItem), Pass, Choice, Succeed, Fail;
// InputPath, Parameters, ResultSelector, ResultPath, OutputPath; Retry
// (ErrorEquals with States.ALL and States.TaskFailed, IntervalSeconds,
// BackoffRate, MaxAttempts, MaxDelaySeconds, JitterStrategy) and Catch;
// TimeoutSeconds; JSONPath $.a.b, $['a'], $[0] and the context object $$;
// the intrinsics States.Format, States.StringToJson, States.JsonToString
// and States.Array.
package asl

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Errors the runner raises, named as Step Functions names them.
const (
	ErrAll            = "States.ALL"
	ErrTaskFailed     = "States.TaskFailed"
	ErrTimeout        = "States.Timeout"
	ErrRuntime        = "States.Runtime"
	ErrNoChoice       = "States.NoChoiceMatched"
	ErrLambdaNotFound = "Lambda.ResourceNotFoundException"
)

// Resources the runner can run.
const (
	ResourceLambdaInvoke   = "arn:aws:states:::lambda:invoke"
	ResourceDynamoDBUpdate = "arn:aws:states:::dynamodb:updateItem"
	lambdaARNPrefix        = "arn:aws:lambda:"
)

// Machine is a parsed, validated state machine definition.
type Machine struct {
	startAt string
	states  map[string]*state
	timeout time.Duration
}

type resourceKind int

const (
	kindLambdaARN resourceKind = iota + 1
	kindLambdaInvoke
	kindDynamoDBUpdate
)

// optPath is InputPath, OutputPath or ResultPath: absent means "$", and
// JSON null means "nothing".
type optPath struct {
	null bool
	p    path
}

type retrier struct {
	errorEquals []string
	interval    time.Duration
	maxAttempts int
	backoff     float64
	maxDelay    time.Duration
	fullJitter  bool
}

type catcher struct {
	errorEquals []string
	next        string
	resultPath  optPath
}

type state struct {
	name, typ string
	next      string
	end       bool

	inputPath, outputPath, resultPath optPath
	parameters, resultSelector        node

	// Pass
	result    any
	hasResult bool

	// Task
	resource string
	kind     resourceKind
	timeout  time.Duration
	retry    []retrier
	catch    []catcher

	// Choice
	choices     []choiceRule
	defaultNext string

	// Fail
	errorName, cause     string
	errorPath, causePath expr
}

// fields lists the fields each state type may have.
var fields = map[string][]string{
	"Task":    {"Type", "Comment", "Resource", "Parameters", "ResultSelector", "ResultPath", "InputPath", "OutputPath", "TimeoutSeconds", "Retry", "Catch", "Next", "End"},
	"Pass":    {"Type", "Comment", "Result", "ResultPath", "Parameters", "InputPath", "OutputPath", "Next", "End"},
	"Choice":  {"Type", "Comment", "Choices", "Default", "InputPath", "OutputPath"},
	"Succeed": {"Type", "Comment", "InputPath", "OutputPath"},
	"Fail":    {"Type", "Comment", "Error", "ErrorPath", "Cause", "CausePath"},
}

// Parse parses and validates a definition. Anything the runner would not
// run exactly as Step Functions does is an error.
func Parse(definition []byte) (*Machine, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(definition, &top); err != nil {
		return nil, fmt.Errorf("parse definition: %w", err)
	}
	for _, k := range sortedKeys(top) {
		switch k {
		case "Comment", "StartAt", "States", "TimeoutSeconds", "Version":
		case "QueryLanguage":
			var ql string
			if err := json.Unmarshal(top[k], &ql); err != nil || ql != "JSONPath" {
				return nil, fmt.Errorf("parse definition: QueryLanguage %s is not supported (only JSONPath)", top[k])
			}
		default:
			return nil, fmt.Errorf("parse definition: top-level field %q is not supported", k)
		}
	}
	m := &Machine{states: map[string]*state{}}
	if err := unmarshalField(top, "StartAt", &m.startAt); err != nil || m.startAt == "" {
		return nil, fmt.Errorf("parse definition: StartAt is required")
	}
	if raw, ok := top["TimeoutSeconds"]; ok {
		secs, err := seconds(raw)
		if err != nil {
			return nil, fmt.Errorf("parse definition: TimeoutSeconds: %w", err)
		}
		m.timeout = secs
	}
	var states map[string]json.RawMessage
	if err := unmarshalField(top, "States", &states); err != nil || len(states) == 0 {
		return nil, fmt.Errorf("parse definition: States is required")
	}
	for _, name := range sortedKeys(states) {
		st, err := parseState(name, states[name])
		if err != nil {
			return nil, fmt.Errorf("parse definition: state %q: %w", name, err)
		}
		m.states[name] = st
	}
	if _, ok := m.states[m.startAt]; !ok {
		return nil, fmt.Errorf("parse definition: StartAt %q names no state", m.startAt)
	}
	for _, name := range sortedKeys(m.states) {
		st := m.states[name]
		targets := []string{st.next, st.defaultNext}
		for _, c := range st.catch {
			targets = append(targets, c.next)
		}
		for _, r := range st.choices {
			targets = append(targets, r.next)
		}
		for _, t := range targets {
			if _, ok := m.states[t]; t != "" && !ok {
				return nil, fmt.Errorf("parse definition: state %q goes to %q, which does not exist", name, t)
			}
		}
	}
	return m, nil
}

func parseState(name string, raw json.RawMessage) (*state, error) {
	var f map[string]json.RawMessage
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, err
	}
	st := &state{name: name}
	if err := unmarshalField(f, "Type", &st.typ); err != nil {
		return nil, fmt.Errorf("Type: %w", err)
	}
	allowed, ok := fields[st.typ]
	if !ok {
		return nil, fmt.Errorf("state type %q is not supported", st.typ)
	}
	for _, k := range sortedKeys(f) {
		if !slices.Contains(allowed, k) {
			return nil, fmt.Errorf("field %q is not supported in a %s state", k, st.typ)
		}
	}
	var err error
	if st.inputPath, err = parseOptPath(f, "InputPath"); err != nil {
		return nil, err
	}
	if st.outputPath, err = parseOptPath(f, "OutputPath"); err != nil {
		return nil, err
	}
	if st.resultPath, err = parseOptPath(f, "ResultPath"); err != nil {
		return nil, err
	}
	if raw, ok := f["Parameters"]; ok {
		if st.parameters, err = compileTemplate(raw); err != nil {
			return nil, fmt.Errorf("Parameters: %w", err)
		}
	}
	if raw, ok := f["ResultSelector"]; ok {
		if st.resultSelector, err = compileTemplate(raw); err != nil {
			return nil, fmt.Errorf("ResultSelector: %w", err)
		}
	}
	if st.typ == "Task" || st.typ == "Pass" {
		if err := parseTransition(f, st); err != nil {
			return nil, err
		}
	}
	switch st.typ {
	case "Task":
		err = parseTask(f, st)
	case "Pass":
		if raw, ok := f["Result"]; ok {
			st.hasResult = true
			st.result, err = decode(raw)
		}
	case "Choice":
		err = parseChoice(f, st)
	case "Fail":
		err = parseFail(f, st)
	}
	return st, err
}

func parseTransition(f map[string]json.RawMessage, st *state) error {
	_, hasNext := f["Next"]
	_, hasEnd := f["End"]
	if hasNext == hasEnd {
		return errors.New("exactly one of Next and End is required")
	}
	if hasNext {
		return unmarshalField(f, "Next", &st.next)
	}
	if err := unmarshalField(f, "End", &st.end); err != nil || !st.end {
		return errors.New("End must be true")
	}
	return nil
}

func parseTask(f map[string]json.RawMessage, st *state) error {
	if err := unmarshalField(f, "Resource", &st.resource); err != nil {
		return fmt.Errorf("Resource: %w", err)
	}
	switch {
	case st.resource == ResourceLambdaInvoke:
		st.kind = kindLambdaInvoke
		if err := checkParameters(st, []string{"FunctionName", "Payload"}, []string{"FunctionName", "Payload"}); err != nil {
			return err
		}
	case st.resource == ResourceDynamoDBUpdate:
		st.kind = kindDynamoDBUpdate
		if err := checkParameters(st, []string{"TableName", "Key", "UpdateExpression", "ConditionExpression",
			"ExpressionAttributeNames", "ExpressionAttributeValues", "ReturnValues"}, []string{"TableName", "Key"}); err != nil {
			return err
		}
	case strings.HasPrefix(st.resource, lambdaARNPrefix) && strings.Contains(st.resource, ":function:"):
		st.kind = kindLambdaARN
	default:
		return fmt.Errorf("Resource %q is not supported (only Lambda function ARNs, %s and %s)", st.resource, ResourceLambdaInvoke, ResourceDynamoDBUpdate)
	}
	if raw, ok := f["TimeoutSeconds"]; ok {
		d, err := seconds(raw)
		if err != nil {
			return fmt.Errorf("TimeoutSeconds: %w", err)
		}
		st.timeout = d
	}
	if raw, ok := f["Retry"]; ok {
		var list []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return fmt.Errorf("Retry: %w", err)
		}
		for i, r := range list {
			rt, err := parseRetrier(r, i == len(list)-1)
			if err != nil {
				return fmt.Errorf("Retry[%d]: %w", i, err)
			}
			st.retry = append(st.retry, rt)
		}
	}
	if raw, ok := f["Catch"]; ok {
		var list []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return fmt.Errorf("Catch: %w", err)
		}
		for i, c := range list {
			ct, err := parseCatcher(c, i == len(list)-1)
			if err != nil {
				return fmt.Errorf("Catch[%d]: %w", i, err)
			}
			st.catch = append(st.catch, ct)
		}
	}
	return nil
}

// checkParameters requires Parameters with the required keys (plain or
// ".$") and no keys outside allowed.
func checkParameters(st *state, allowed, required []string) error {
	obj, ok := st.parameters.(objectNode)
	if !ok {
		return fmt.Errorf("Resource %s needs Parameters as an object", st.resource)
	}
	have := map[string]bool{}
	for _, fl := range obj {
		if !slices.Contains(allowed, fl.key) {
			return fmt.Errorf("Parameters.%s is not supported for %s", fl.key, st.resource)
		}
		have[fl.key] = true
	}
	for _, k := range required {
		if !have[k] {
			return fmt.Errorf("Parameters.%s is required for %s", k, st.resource)
		}
	}
	return nil
}

func parseErrorEquals(f map[string]json.RawMessage, last bool) ([]string, error) {
	var names []string
	if err := unmarshalField(f, "ErrorEquals", &names); err != nil || len(names) == 0 {
		return nil, errors.New("ErrorEquals must list at least one error name")
	}
	if slices.Contains(names, ErrAll) && (len(names) > 1 || !last) {
		return nil, errors.New("States.ALL must appear alone, in the last retrier or catcher")
	}
	return names, nil
}

func parseRetrier(f map[string]json.RawMessage, last bool) (retrier, error) {
	for _, k := range sortedKeys(f) {
		switch k {
		case "ErrorEquals", "IntervalSeconds", "MaxAttempts", "BackoffRate", "MaxDelaySeconds", "JitterStrategy", "Comment":
		default:
			return retrier{}, fmt.Errorf("field %q is not supported", k)
		}
	}
	r := retrier{interval: time.Second, maxAttempts: 3, backoff: 2}
	var err error
	if r.errorEquals, err = parseErrorEquals(f, last); err != nil {
		return r, err
	}
	if raw, ok := f["IntervalSeconds"]; ok {
		if r.interval, err = seconds(raw); err != nil || r.interval == 0 {
			return r, errors.New("IntervalSeconds must be a positive integer")
		}
	}
	if raw, ok := f["MaxAttempts"]; ok {
		if err := json.Unmarshal(raw, &r.maxAttempts); err != nil || r.maxAttempts < 0 {
			return r, errors.New("MaxAttempts must be a non-negative integer")
		}
	}
	if raw, ok := f["BackoffRate"]; ok {
		if err := json.Unmarshal(raw, &r.backoff); err != nil || r.backoff < 1 {
			return r, errors.New("BackoffRate must be a number of at least 1.0")
		}
	}
	if raw, ok := f["MaxDelaySeconds"]; ok {
		if r.maxDelay, err = seconds(raw); err != nil || r.maxDelay == 0 {
			return r, errors.New("MaxDelaySeconds must be a positive integer")
		}
	}
	if raw, ok := f["JitterStrategy"]; ok {
		var js string
		if err := json.Unmarshal(raw, &js); err != nil || (js != "FULL" && js != "NONE") {
			return r, fmt.Errorf("JitterStrategy %s: must be FULL or NONE", raw)
		}
		r.fullJitter = js == "FULL"
	}
	return r, nil
}

func parseCatcher(f map[string]json.RawMessage, last bool) (catcher, error) {
	for _, k := range sortedKeys(f) {
		switch k {
		case "ErrorEquals", "Next", "ResultPath", "Comment":
		default:
			return catcher{}, fmt.Errorf("field %q is not supported", k)
		}
	}
	var c catcher
	var err error
	if c.errorEquals, err = parseErrorEquals(f, last); err != nil {
		return c, err
	}
	if err := unmarshalField(f, "Next", &c.next); err != nil || c.next == "" {
		return c, errors.New("Next is required")
	}
	c.resultPath, err = parseOptPath(f, "ResultPath")
	return c, err
}

func parseFail(f map[string]json.RawMessage, st *state) error {
	for _, pair := range [][2]string{{"Error", "ErrorPath"}, {"Cause", "CausePath"}} {
		_, a := f[pair[0]]
		_, b := f[pair[1]]
		if a && b {
			return fmt.Errorf("%s and %s are exclusive", pair[0], pair[1])
		}
	}
	if err := unmarshalField(f, "Error", &st.errorName); err != nil {
		return fmt.Errorf("Error: %w", err)
	}
	if err := unmarshalField(f, "Cause", &st.cause); err != nil {
		return fmt.Errorf("Cause: %w", err)
	}
	for key, dst := range map[string]*expr{"ErrorPath": &st.errorPath, "CausePath": &st.causePath} {
		var s string
		if err := unmarshalField(f, key, &s); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if s == "" {
			continue
		}
		e, err := parseExpr(s)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		*dst = e
	}
	return nil
}

// unmarshalField decodes f[key] into v when present.
func unmarshalField(f map[string]json.RawMessage, key string, v any) error {
	raw, ok := f[key]
	if !ok {
		return nil
	}
	return json.Unmarshal(raw, v)
}

func parseOptPath(f map[string]json.RawMessage, key string) (optPath, error) {
	raw, ok := f[key]
	if !ok {
		return optPath{p: path{text: "$"}}, nil
	}
	if string(raw) == "null" {
		return optPath{null: true}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return optPath{}, fmt.Errorf("%s: must be a path or null", key)
	}
	p, err := parsePath(s)
	if err != nil {
		return optPath{}, fmt.Errorf("%s: %w", key, err)
	}
	if p.context {
		return optPath{}, fmt.Errorf("%s: the context object is read-only", key)
	}
	return optPath{p: p}, nil
}

// seconds decodes a positive whole number of seconds.
func seconds(raw json.RawMessage) (time.Duration, error) {
	var n float64
	if err := json.Unmarshal(raw, &n); err != nil || n < 0 || n != math.Trunc(n) {
		return 0, fmt.Errorf("%s is not a whole number of seconds", raw)
	}
	return time.Duration(n) * time.Second, nil
}

// node is a compiled payload template (Parameters, ResultSelector): fields
// whose names end in ".$" are evaluated against the input.
type node interface {
	eval(in, ctxObj any) (any, error)
}

type objectNode []objectField

type objectField struct {
	key  string
	node node
}

type arrayNode []node

type exprNode struct {
	src string
	e   expr
}

func compileTemplate(raw json.RawMessage) (node, error) {
	v, err := decode(raw)
	if err != nil {
		return nil, err
	}
	return compile(v)
}

func compile(v any) (node, error) {
	switch x := v.(type) {
	case map[string]any:
		var obj objectNode
		for _, k := range sortedKeys(x) {
			if name, ok := strings.CutSuffix(k, ".$"); ok {
				s, isString := x[k].(string)
				if !isString {
					return nil, fmt.Errorf("%s: the value of a .$ field must be a string", k)
				}
				e, err := parseExpr(s)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", k, err)
				}
				obj = append(obj, objectField{key: name, node: exprNode{src: s, e: e}})
				continue
			}
			n, err := compile(x[k])
			if err != nil {
				return nil, fmt.Errorf("%s.%w", k, err)
			}
			obj = append(obj, objectField{key: k, node: n})
		}
		return obj, nil
	case []any:
		arr := make(arrayNode, len(x))
		for i, e := range x {
			n, err := compile(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			arr[i] = n
		}
		return arr, nil
	}
	return literal{v}, nil
}

func (o objectNode) eval(in, ctxObj any) (any, error) {
	out := make(map[string]any, len(o))
	for _, f := range o {
		v, err := f.node.eval(in, ctxObj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.key, err)
		}
		out[f.key] = v
	}
	return out, nil
}

func (a arrayNode) eval(in, ctxObj any) (any, error) {
	out := make([]any, len(a))
	for i, n := range a {
		v, err := n.eval(in, ctxObj)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (e exprNode) eval(in, ctxObj any) (any, error) {
	v, err := e.e.eval(in, ctxObj)
	if err != nil {
		return nil, err
	}
	return deepCopy(v), nil
}
