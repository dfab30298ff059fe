package asl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/lambda/messages"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"

	"github.com/batchgen/batchgen/internal/clock"
)

// Func is a registered Lambda function: JSON payload in, JSON result out.
// An error is reported the way the Lambda runtime reports it (see Handler).
type Func func(ctx context.Context, payload []byte) ([]byte, error)

// Handler adapts a typed handler, like the ones given to lambda.Start, to a
// Func with the Lambda Go runtime's semantics: the payload is decoded into
// In, the result encoded from Out, and an error is reported with the name
// of its type (or, for a messages.InvokeResponse_Error, its Type), which is
// the Error Step Functions sees.
func Handler[In, Out any](h func(context.Context, In) (Out, error)) Func {
	return func(ctx context.Context, payload []byte) ([]byte, error) {
		var in In
		if err := json.Unmarshal(payload, &in); err != nil {
			return nil, err
		}
		out, err := h(ctx, in)
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	}
}

// DynamoDB is the part of the DynamoDB client the runner calls.
type DynamoDB interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

// Runner executes machines. Its fields must not change while it runs.
type Runner struct {
	// Functions maps function names or ARNs to their handlers. A task's
	// FunctionName (or Resource) matches an entry whose name or ARN ends in
	// the same function name.
	Functions map[string]Func
	// DynamoDB serves dynamodb:updateItem tasks; nil fails them with
	// States.Runtime.
	DynamoDB DynamoDB
	// Clock stamps context times and waits out retry intervals. Defaults
	// to clock.Real.
	Clock clock.Clock
	// IntervalScale multiplies every retry interval, so tests can run a
	// definition's real retry policy quickly. 0 means 1.
	IntervalScale float64
}

// Status is how an execution ended.
type Status string

// Execution statuses.
const (
	StatusSucceeded Status = "SUCCEEDED"
	StatusFailed    Status = "FAILED"
)

// Execution is the result of a run.
type Execution struct {
	Name   string
	Status Status
	// Output is the final state's output (SUCCEEDED).
	Output json.RawMessage
	// Error and Cause say why it FAILED.
	Error, Cause string
	// Steps lists every state entered and every task attempt, in order.
	Steps []Step
}

// Step is one state entry or task attempt.
type Step struct {
	State string
	// Error is the error the attempt raised; empty when it succeeded.
	Error string
}

// stateError is an ASL error: a name to match in Retry and Catch, and a
// cause.
type stateError struct{ name, cause string }

func (e *stateError) Error() string { return e.name + ": " + e.cause }

func runtimeErr(format string, a ...any) *stateError {
	return &stateError{name: ErrRuntime, cause: fmt.Sprintf(format, a...)}
}

var executionSeq atomic.Int64

// maxTransitions bounds a run, so a definition that loops forever fails
// instead of hanging the test.
const maxTransitions = 1000

// Run executes m on input under the execution name. It returns an error
// only when the run itself cannot go on (ctx ended); a failed execution is
// an Execution with Status FAILED.
func (r *Runner) Run(ctx context.Context, m *Machine, name string, input []byte) (*Execution, error) {
	data, err := decode(input)
	if err != nil {
		return nil, fmt.Errorf("run %s: input: %w", name, err)
	}
	if m.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.timeout)
		defer cancel()
	}
	x := &run{r: r, m: m, exec: &Execution{Name: name}, clk: r.Clock}
	if x.clk == nil {
		x.clk = clock.Real{}
	}
	n := executionSeq.Add(1)
	x.ctxObj = map[string]any{
		"Execution": map[string]any{
			"Id":        fmt.Sprintf("arn:aws:states:us-east-1:123456789012:execution:asl:%s", name),
			"Name":      name,
			"Input":     deepCopy(data),
			"StartTime": stamp(x.clk.Now()),
			"RoleArn":   "arn:aws:iam::123456789012:role/asl",
		},
		"StateMachine": map[string]any{"Id": "arn:aws:states:us-east-1:123456789012:stateMachine:asl", "Name": "asl"},
		"State":        map[string]any{},
		"Task":         map[string]any{"Token": fmt.Sprintf("token-%d", n)},
	}
	cur := m.startAt
	for range maxTransitions {
		if err := ctx.Err(); err != nil {
			if errors.Is(err, context.DeadlineExceeded) && m.timeout > 0 {
				return x.fail(&stateError{name: ErrTimeout, cause: "the execution timed out"}), nil
			}
			return nil, fmt.Errorf("run %s: %w", name, err)
		}
		st := m.states[cur]
		x.exec.Steps = append(x.exec.Steps, Step{State: cur})
		x.enter(st, 0)
		out, next, serr := x.state(ctx, st, data)
		if serr != nil {
			if last := &x.exec.Steps[len(x.exec.Steps)-1]; last.Error == "" {
				last.Error = serr.name
			}
			if ctx.Err() != nil && serr.name != ErrTimeout {
				return nil, fmt.Errorf("run %s: %w", name, ctx.Err())
			}
			return x.fail(serr), nil
		}
		data = out
		switch {
		case st.typ == "Fail":
			return x.exec, nil // fail filled it in
		case next == "":
			b, err := json.Marshal(data)
			if err != nil {
				return x.fail(runtimeErr("encode output: %v", err)), nil
			}
			x.exec.Status, x.exec.Output = StatusSucceeded, b
			return x.exec, nil
		}
		cur = next
	}
	return x.fail(runtimeErr("more than %d state transitions", maxTransitions)), nil
}

type run struct {
	r      *Runner
	m      *Machine
	exec   *Execution
	clk    clock.Clock
	ctxObj map[string]any
}

func (x *run) fail(e *stateError) *Execution {
	x.exec.Status, x.exec.Error, x.exec.Cause = StatusFailed, e.name, e.cause
	return x.exec
}

// enter updates the context object's State for st.
func (x *run) enter(st *state, retry int) {
	if retry == 0 {
		x.ctxObj["State"] = map[string]any{"Name": st.name, "EnteredTime": stamp(x.clk.Now()), "RetryCount": json.Number("0")}
		return
	}
	s := x.ctxObj["State"].(map[string]any)
	s["RetryCount"] = json.Number(fmt.Sprint(retry))
}

// stamp formats t the way Step Functions formats context times.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// state runs one state on its raw input and returns its output and the
// next state ("" to end).
func (x *run) state(ctx context.Context, st *state, raw any) (any, string, *stateError) {
	switch st.typ {
	case "Fail":
		x.exec.Status, x.exec.Error, x.exec.Cause = StatusFailed, st.errorName, st.cause
		if st.errorPath != nil {
			v, err := st.errorPath.eval(raw, x.ctxObj)
			s, ok := v.(string)
			if err != nil || !ok {
				return nil, "", runtimeErr("state %s: ErrorPath: %v", st.name, errOr(err, "not a string"))
			}
			x.exec.Error = s
		}
		if st.causePath != nil {
			v, err := st.causePath.eval(raw, x.ctxObj)
			s, ok := v.(string)
			if err != nil || !ok {
				return nil, "", runtimeErr("state %s: CausePath: %v", st.name, errOr(err, "not a string"))
			}
			x.exec.Cause = s
		}
		return raw, "", nil
	case "Succeed":
		in, serr := x.inputPath(st, raw)
		if serr != nil {
			return nil, "", serr
		}
		out, serr := x.outputPath(st, in)
		return out, "", serr
	case "Choice":
		in, serr := x.inputPath(st, raw)
		if serr != nil {
			return nil, "", serr
		}
		next := ""
		for _, rule := range st.choices {
			ok, err := rule.cond.eval(in, x.ctxObj)
			if err != nil {
				return nil, "", runtimeErr("state %s: %v", st.name, err)
			}
			if ok {
				next = rule.next
				break
			}
		}
		if next == "" {
			next = st.defaultNext
		}
		if next == "" {
			return nil, "", &stateError{name: ErrNoChoice, cause: fmt.Sprintf("no choice rule of state %s matched and it has no Default", st.name)}
		}
		out, serr := x.outputPath(st, in)
		return out, next, serr
	case "Pass":
		in, serr := x.effectiveInput(st, raw)
		if serr != nil {
			return nil, "", serr
		}
		result := in
		if st.hasResult {
			result = deepCopy(st.result)
		}
		out, serr := x.finish(st, raw, result)
		return out, st.next, serr
	case "Task":
		return x.task(ctx, st, raw)
	}
	return nil, "", runtimeErr("state type %s", st.typ)
}

func errOr(err error, fallback string) string {
	if err != nil {
		return err.Error()
	}
	return fallback
}

func (x *run) inputPath(st *state, raw any) (any, *stateError) {
	if st.inputPath.null {
		return map[string]any{}, nil
	}
	v, err := st.inputPath.p.get(raw)
	if err != nil {
		return nil, runtimeErr("state %s: InputPath: %v", st.name, err)
	}
	return v, nil
}

func (x *run) outputPath(st *state, v any) (any, *stateError) {
	if st.outputPath.null {
		return map[string]any{}, nil
	}
	out, err := st.outputPath.p.get(v)
	if err != nil {
		return nil, runtimeErr("state %s: OutputPath: %v", st.name, err)
	}
	return out, nil
}

// effectiveInput applies InputPath and Parameters.
func (x *run) effectiveInput(st *state, raw any) (any, *stateError) {
	in, serr := x.inputPath(st, raw)
	if serr != nil {
		return nil, serr
	}
	if st.parameters == nil {
		return in, nil
	}
	v, err := st.parameters.eval(in, x.ctxObj)
	if err != nil {
		return nil, runtimeErr("state %s: Parameters: %v", st.name, err)
	}
	return v, nil
}

// finish applies ResultSelector, ResultPath and OutputPath to a result.
func (x *run) finish(st *state, raw, result any) (any, *stateError) {
	if st.resultSelector != nil {
		v, err := st.resultSelector.eval(result, x.ctxObj)
		if err != nil {
			return nil, runtimeErr("state %s: ResultSelector: %v", st.name, err)
		}
		result = v
	}
	merged, serr := applyResultPath(st.name, st.resultPath, raw, result)
	if serr != nil {
		return nil, serr
	}
	return x.outputPath(st, merged)
}

func applyResultPath(name string, rp optPath, raw, result any) (any, *stateError) {
	if rp.null {
		return raw, nil
	}
	v, err := rp.p.set(deepCopy(raw), result)
	if err != nil {
		return nil, runtimeErr("state %s: %v", name, err)
	}
	return v, nil
}

// task runs a Task state with its Retry and Catch policies.
func (x *run) task(ctx context.Context, st *state, raw any) (any, string, *stateError) {
	in, serr := x.effectiveInput(st, raw)
	if serr != nil {
		return nil, "", serr
	}
	attempts := make([]int, len(st.retry))
	retries := 0
	for {
		if retries > 0 {
			x.exec.Steps = append(x.exec.Steps, Step{State: st.name})
			x.enter(st, retries)
		}
		result, serr := x.invoke(ctx, st, in)
		if serr == nil {
			out, serr := x.finish(st, raw, result)
			return out, st.next, serr
		}
		x.exec.Steps[len(x.exec.Steps)-1].Error = serr.name
		if serr.name == ErrRuntime || ctx.Err() != nil {
			return nil, "", serr
		}
		if i := matchRetrier(st.retry, serr.name); i >= 0 && attempts[i] < st.retry[i].maxAttempts {
			attempts[i]++
			retries++
			wait := x.retryDelay(st.retry[i], attempts[i])
			select {
			case <-ctx.Done():
				return nil, "", &stateError{name: ErrTimeout, cause: "the execution ended while waiting to retry"}
			case <-x.clk.After(wait):
			}
			continue
		}
		for _, c := range st.catch {
			if matches(c.errorEquals, serr.name) {
				out, cerr := applyResultPath(st.name, c.resultPath, raw, map[string]any{"Error": serr.name, "Cause": serr.cause})
				if cerr != nil {
					return nil, "", cerr
				}
				return out, c.next, nil
			}
		}
		return nil, "", serr
	}
}

func (x *run) retryDelay(r retrier, attempt int) time.Duration {
	d := float64(r.interval) * math.Pow(r.backoff, float64(attempt-1))
	if r.maxDelay > 0 && d > float64(r.maxDelay) {
		d = float64(r.maxDelay)
	}
	if r.fullJitter {
		d = rand.Float64() * d
	}
	if s := x.r.IntervalScale; s > 0 {
		d *= s
	}
	return time.Duration(d)
}

func matchRetrier(rs []retrier, name string) int {
	for i, r := range rs {
		if matches(r.errorEquals, name) {
			return i
		}
	}
	return -1
}

// matches reports whether an error name is one of names. States.ALL
// matches every error and States.TaskFailed every error but a timeout;
// neither matches States.Runtime, which is never retried or caught.
func matches(names []string, name string) bool {
	for _, n := range names {
		switch {
		case n == name:
			return true
		case name == ErrRuntime:
		case n == ErrAll:
			return true
		case n == ErrTaskFailed && name != ErrTimeout:
			return true
		}
	}
	return false
}

// invoke runs a task's resource once.
func (x *run) invoke(ctx context.Context, st *state, in any) (any, *stateError) {
	if st.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, st.timeout)
		defer cancel()
	}
	var result any
	var serr *stateError
	switch st.kind {
	case kindLambdaARN:
		result, serr = x.callFunction(ctx, st.resource, in)
	case kindLambdaInvoke:
		params := in.(map[string]any)
		fn, ok := params["FunctionName"].(string)
		if !ok {
			return nil, runtimeErr("state %s: FunctionName is not a string", st.name)
		}
		var out any
		if out, serr = x.callFunction(ctx, fn, params["Payload"]); serr == nil {
			result = map[string]any{
				"ExecutedVersion":     "$LATEST",
				"Payload":             out,
				"SdkHttpMetadata":     map[string]any{"httpStatusCode": json.Number("200")},
				"SdkResponseMetadata": map[string]any{"requestId": fmt.Sprintf("asl-%d", executionSeq.Add(1))},
				"StatusCode":          json.Number("200"),
			}
		}
	case kindDynamoDBUpdate:
		result, serr = x.updateItem(ctx, st, in.(map[string]any))
	}
	if serr == nil {
		return result, nil
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && st.timeout > 0 {
		return nil, &stateError{name: ErrTimeout, cause: fmt.Sprintf("state %s timed out after %v", st.name, st.timeout)}
	}
	return nil, serr
}

// functionName returns the function name inside a name, a partial ARN or
// a full ARN (with or without a qualifier).
func functionName(s string) string {
	if i := strings.Index(s, ":function:"); i >= 0 {
		s = s[i+len(":function:"):]
		if j := strings.IndexByte(s, ':'); j >= 0 {
			s = s[:j]
		}
	}
	return s
}

func (x *run) callFunction(ctx context.Context, fn string, payload any) (result any, serr *stateError) {
	var h Func
	for k, f := range x.r.Functions {
		if k == fn || functionName(k) == functionName(fn) {
			h = f
			break
		}
	}
	if h == nil {
		return nil, &stateError{name: ErrLambdaNotFound, cause: fmt.Sprintf("Function not found: %s", fn)}
	}
	in, err := json.Marshal(payload)
	if err != nil {
		return nil, runtimeErr("encode payload for %s: %v", fn, err)
	}
	defer func() {
		if p := recover(); p != nil {
			result, serr = nil, functionError(typeName(p), fmt.Sprint(p))
		}
	}()
	out, err := h(ctx, in)
	if err != nil {
		var ire messages.InvokeResponse_Error
		if errors.As(err, &ire) {
			return nil, functionError(ire.Type, ire.Message)
		}
		return nil, functionError(typeName(err), err.Error())
	}
	if len(out) == 0 {
		return nil, nil
	}
	v, err := decode(out)
	if err != nil {
		return nil, runtimeErr("function %s returned invalid JSON: %v", fn, err)
	}
	return v, nil
}

// functionError is a function's error as Step Functions reports it: the
// runtime's error type as the name, its JSON error payload as the cause.
func functionError(typ, msg string) *stateError {
	cause, _ := json.Marshal(struct {
		Message string `json:"errorMessage"`
		Type    string `json:"errorType"`
	}{msg, typ})
	return &stateError{name: typ, cause: string(cause)}
}

// typeName names v's type as the Lambda Go runtime does.
func typeName(v any) string {
	t := reflect.TypeOf(v)
	if t == nil {
		return "nil"
	}
	if t.Kind() == reflect.Pointer {
		return t.Elem().Name()
	}
	return t.Name()
}

func (x *run) updateItem(ctx context.Context, st *state, p map[string]any) (any, *stateError) {
	if x.r.DynamoDB == nil {
		return nil, runtimeErr("state %s: the runner has no DynamoDB client", st.name)
	}
	in := &dynamodb.UpdateItemInput{}
	var err error
	str := func(key string) (*string, error) {
		v, ok := p[key]
		if !ok {
			return nil, nil
		}
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%s is not a string", key)
		}
		return aws.String(s), nil
	}
	if in.TableName, err = str("TableName"); err != nil {
		return nil, runtimeErr("state %s: %v", st.name, err)
	}
	if in.UpdateExpression, err = str("UpdateExpression"); err != nil {
		return nil, runtimeErr("state %s: %v", st.name, err)
	}
	if in.ConditionExpression, err = str("ConditionExpression"); err != nil {
		return nil, runtimeErr("state %s: %v", st.name, err)
	}
	rv, err := str("ReturnValues")
	if err != nil {
		return nil, runtimeErr("state %s: %v", st.name, err)
	}
	if rv != nil {
		in.ReturnValues = dynamoReturnValue(*rv)
	}
	if in.Key, err = toAttributeMap(p["Key"]); err != nil {
		return nil, runtimeErr("state %s: Key: %v", st.name, err)
	}
	if v, ok := p["ExpressionAttributeValues"]; ok {
		if in.ExpressionAttributeValues, err = toAttributeMap(v); err != nil {
			return nil, runtimeErr("state %s: ExpressionAttributeValues: %v", st.name, err)
		}
	}
	if v, ok := p["ExpressionAttributeNames"]; ok {
		m, isMap := v.(map[string]any)
		if !isMap {
			return nil, runtimeErr("state %s: ExpressionAttributeNames is not an object", st.name)
		}
		in.ExpressionAttributeNames = map[string]string{}
		for k, n := range m {
			s, isString := n.(string)
			if !isString {
				return nil, runtimeErr("state %s: ExpressionAttributeNames.%s is not a string", st.name, k)
			}
			in.ExpressionAttributeNames[k] = s
		}
	}
	out, err := x.r.DynamoDB.UpdateItem(ctx, in)
	if err != nil {
		var api smithy.APIError
		if errors.As(err, &api) {
			return nil, &stateError{name: "DynamoDB." + api.ErrorCode(), cause: fmt.Sprintf("%s (Service: DynamoDb, Error Code: %s)", api.ErrorMessage(), api.ErrorCode())}
		}
		return nil, &stateError{name: "DynamoDB.SdkClientException", cause: err.Error()}
	}
	result := map[string]any{}
	if len(out.Attributes) > 0 {
		attrs, err := fromAttributeMap(out.Attributes)
		if err != nil {
			return nil, runtimeErr("state %s: %v", st.name, err)
		}
		result["Attributes"] = attrs
	}
	return result, nil
}
