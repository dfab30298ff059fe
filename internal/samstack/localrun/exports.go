package localrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/lambda/messages"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/stepfn"
)

// Exports stands in for Step Functions calling the exporter Lambda: moto's
// own Step Functions engine runs the provisioned export definition (its
// Retry and Catch paths, the DynamoDB task, the Fail state), with one
// change, since moto runs Lambda code only in Docker: the Task that invokes
// the exporter becomes an sqs:sendMessage.waitForTaskToken to a callback
// queue, and Exports answers each callback by calling the exporter handler
// in-process, reporting its result with SendTaskSuccess or its error, named
// after the error's type as the Lambda Go runtime names it, with
// SendTaskFailure. Retry intervals are scaled (Config.IntervalScale, down
// to ASL's 1 s minimum). After the local run it starts the real execution of
// the provisioned machine through the product's stepfn.Starter, so the
// named execution exists there too.
type Exports struct {
	sfn      *sfn.Client
	sqs      *sqs.Client
	machine  string // ARN of the callback variant of the definition
	queueURL string
	exporter handlerFunc
	real     pipeline.ExportStarter
	// engine is the state machine's configuration: the service calls the
	// engine made are replayed through it, unsent, so that its recorders
	// (awsops) see them as the state machine's.
	engine aws.Config

	mu   sync.Mutex
	runs map[string]*Execution
}

var _ pipeline.ExportStarter = (*Exports)(nil)

// Execution is what an export run did, read from the engine's history.
type Execution struct {
	Status       sfntypes.ExecutionStatus
	Error, Cause string
	// Steps are the task attempts and other states in order.
	Steps []Step
}

// Step is one task attempt (with the error it failed with, if any) or one
// entered state that is not a task.
type Step struct {
	State string
	Error string
}

// handlerFunc is a Lambda handler on raw JSON.
type handlerFunc func(ctx context.Context, payload []byte) ([]byte, error)

// handler adapts a typed handler to a handlerFunc with the Lambda Go
// runtime's semantics: the payload decoded into In, the result encoded.
func handler[In, Out any](h func(context.Context, In) (Out, error)) handlerFunc {
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

// callbackResource replaces the exporter's Lambda Task.
const callbackResource = "arn:aws:states:::sqs:sendMessage.waitForTaskToken"

// newExports creates the callback queue and the callback variant of the
// provisioned definition on the emulator; Resources.Cleanup deletes them.
func newExports(ctx context.Context, s *Stack, res *samstack.Resources, exporterARN string, exporter handlerFunc, scale float64, real pipeline.ExportStarter, engine aws.Config) (*Exports, error) {
	desc, err := s.SFN.DescribeStateMachine(ctx, &sfn.DescribeStateMachineInput{StateMachineArn: aws.String(res.StateMachineArn)})
	if err != nil {
		return nil, fmt.Errorf("describe state machine %s: %w", res.StateMachineArn, err)
	}
	suffix := strings.TrimPrefix(samstack.UniquePrefix("x"), "x-")
	q, err := s.SQS.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(res.StackName + "-export-callbacks-" + suffix)})
	if err != nil {
		return nil, fmt.Errorf("create the export callback queue: %w", err)
	}
	res.Track(samstack.TypeQueue, aws.ToString(q.QueueUrl))
	def, err := callbackDefinition([]byte(aws.ToString(desc.Definition)), exporterARN, aws.ToString(q.QueueUrl), scale)
	if err != nil {
		return nil, fmt.Errorf("the provisioned definition: %w", err)
	}
	name := res.StackName + "-localrun-" + suffix
	m, err := s.SFN.CreateStateMachine(ctx, &sfn.CreateStateMachineInput{
		Name:       aws.String(name),
		Definition: aws.String(string(def)),
		RoleArn:    aws.String("arn:aws:iam::" + samstack.AccountID + ":role/" + name),
		Type:       desc.Type,
	})
	if err != nil {
		return nil, fmt.Errorf("create the local export state machine: %w", err)
	}
	res.Track(samstack.TypeStateMachine, aws.ToString(m.StateMachineArn))
	return &Exports{
		sfn: s.SFN, sqs: s.SQS, machine: aws.ToString(m.StateMachineArn), queueURL: aws.ToString(q.QueueUrl),
		exporter: exporter, real: real, engine: engine, runs: map[string]*Execution{},
	}, nil
}

// callbackDefinition rewrites the Tasks that invoke exporterARN into
// callbacks through queueURL and scales every retrier's intervals.
func callbackDefinition(def []byte, exporterARN, queueURL string, scale float64) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(def, &m); err != nil {
		return nil, err
	}
	states, ok := m["States"].(map[string]any)
	if !ok {
		return nil, errors.New("no States")
	}
	rewritten := 0
	for name, raw := range states {
		st, ok := raw.(map[string]any)
		if !ok {
			continue
		}
		if retriers, ok := st["Retry"].([]any); ok && scale > 0 {
			for _, r := range retriers {
				rm, _ := r.(map[string]any)
				for _, k := range []string{"IntervalSeconds", "MaxDelaySeconds"} {
					if v, ok := rm[k].(float64); ok {
						rm[k] = math.Max(1, math.Round(v*scale))
					}
				}
			}
		}
		if st["Type"] != "Task" {
			continue
		}
		resource, _ := st["Resource"].(string)
		params, _ := st["Parameters"].(map[string]any)
		switch {
		case resource == "arn:aws:states:::lambda:invoke":
			fn, _ := params["FunctionName"].(string)
			if fn != exporterARN {
				return nil, fmt.Errorf("state %s invokes %q; localrun runs only the exporter %s", name, fn, exporterARN)
			}
			body := map[string]any{"token.$": "$$.Task.Token"}
			for k, v := range params {
				switch k {
				case "Payload":
					body["payload"] = v
				case "Payload.$":
					body["payload.$"] = v
				}
			}
			st["Resource"] = callbackResource
			st["Parameters"] = map[string]any{"QueueUrl": queueURL, "MessageBody": body}
			rewritten++
		case strings.HasPrefix(resource, "arn:aws:lambda:"):
			return nil, fmt.Errorf("state %s invokes %s directly; localrun expects arn:aws:states:::lambda:invoke", name, resource)
		}
	}
	if rewritten == 0 {
		return nil, fmt.Errorf("no Task invokes the exporter %s", exporterARN)
	}
	return json.Marshal(m)
}

// StartExport runs the export of taskID's generation to its end unless it
// ran before, then starts the provisioned machine's execution the way the
// product does (its Lambda call fails on moto; the Catch path leaves the
// finished task alone).
func (a *Exports) StartExport(ctx context.Context, taskID string, generation int) error {
	return a.start(ctx, taskID, generation, a.real)
}

func (a *Exports) start(ctx context.Context, taskID string, generation int, real pipeline.ExportStarter) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	name := stepfn.ExecutionName(taskID, generation)
	if _, done := a.runs[name]; !done {
		input, err := json.Marshal(map[string]string{"task_id": taskID})
		if err != nil {
			return fmt.Errorf("run export of %s: %w", taskID, err)
		}
		out, err := a.sfn.StartExecution(ctx, &sfn.StartExecutionInput{
			StateMachineArn: aws.String(a.machine), Name: aws.String(name), Input: aws.String(string(input)),
		})
		if err != nil {
			return fmt.Errorf("run export of %s: %w", taskID, err)
		}
		exec, err := a.serve(ctx, aws.ToString(out.ExecutionArn))
		if err != nil {
			return fmt.Errorf("run export of %s: %w", taskID, err)
		}
		a.runs[name] = exec
	}
	return real.StartExport(ctx, taskID, generation)
}

// Execution returns the run of taskID's first export, or nil if none ran.
func (a *Exports) Execution(taskID string) *Execution {
	return a.ExecutionOf(taskID, 0)
}

// ExecutionOf returns the run of taskID's export of generation, or nil if
// none ran.
func (a *Exports) ExecutionOf(taskID string, generation int) *Execution {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[stepfn.ExecutionName(taskID, generation)]
}

// callback is the message the rewritten Task sends.
type callback struct {
	Token   string          `json:"token"`
	Payload json.RawMessage `json:"payload"`
}

// serve answers the execution's callbacks until it ends.
func (a *Exports) serve(ctx context.Context, arn string) (*Execution, error) {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		desc, err := a.sfn.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: aws.String(arn)})
		if err != nil {
			return nil, fmt.Errorf("describe execution: %w", err)
		}
		if desc.Status != sfntypes.ExecutionStatusRunning {
			return a.history(ctx, desc)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("execution %s still running after 10 minutes", arn)
		}
		out, err := a.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(a.queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
		})
		if err != nil {
			return nil, fmt.Errorf("receive export callbacks: %w", err)
		}
		for _, m := range out.Messages {
			if _, err := a.sqs.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(a.queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				return nil, fmt.Errorf("delete export callback: %w", err)
			}
			var cb callback
			if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &cb); err != nil || cb.Token == "" {
				return nil, fmt.Errorf("export callback %q: not a task token and payload", aws.ToString(m.Body))
			}
			if err := a.answer(ctx, cb); err != nil {
				return nil, err
			}
		}
	}
}

// answer calls the exporter and reports the outcome to the engine as
// lambda:invoke would: {"Payload": result, "StatusCode": 200}, or the
// error's type name with the runtime's JSON error as the cause.
func (a *Exports) answer(ctx context.Context, cb callback) error {
	out, err := a.call(ctx, cb.Payload)
	if err != nil {
		name, msg := errorType(err), err.Error()
		var ire messages.InvokeResponse_Error
		if errors.As(err, &ire) {
			name, msg = ire.Type, ire.Message
		}
		cause, _ := json.Marshal(struct {
			Message string `json:"errorMessage"`
			Type    string `json:"errorType"`
		}{msg, name})
		_, err := a.sfn.SendTaskFailure(ctx, &sfn.SendTaskFailureInput{TaskToken: aws.String(cb.Token), Error: aws.String(name), Cause: aws.String(string(cause))})
		if err != nil && !staleToken(err) {
			return fmt.Errorf("report the exporter's failure: %w", err)
		}
		return nil
	}
	if len(out) == 0 {
		out = []byte("null")
	}
	result, err := json.Marshal(map[string]any{"Payload": json.RawMessage(out), "StatusCode": 200})
	if err != nil {
		return err
	}
	if _, err := a.sfn.SendTaskSuccess(ctx, &sfn.SendTaskSuccessInput{TaskToken: aws.String(cb.Token), Output: aws.String(string(result))}); err != nil && !staleToken(err) {
		return fmt.Errorf("report the exporter's result: %w", err)
	}
	return nil
}

// attribute replays a service call the engine made (resourceType
// "dynamodb", resource "updateItem") through the state machine's
// configuration with a transport that sends nothing, so that a recorder
// attached to it (the IAM test's) sees the call the role must allow. The
// sqs callback is left out: it stands in for the Lambda invoke.
func (a *Exports) attribute(ctx context.Context, resourceType, resource string) error {
	if resourceType != "dynamodb" {
		return fmt.Errorf("the export definition calls %s:%s, which localrun cannot attribute to the state machine", resourceType, resource)
	}
	c := dynamodb.NewFromConfig(a.engine, func(o *dynamodb.Options) {
		o.HTTPClient = unsent{}
		o.RetryMaxAttempts = 1
	})
	table, key := aws.String("unsent"), map[string]ddbtypes.AttributeValue{"PK": &ddbtypes.AttributeValueMemberS{Value: "unsent"}}
	var err error
	switch resource {
	case "updateItem":
		_, err = c.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: key})
	case "putItem":
		_, err = c.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: key})
	case "getItem":
		_, err = c.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: key})
	case "deleteItem":
		_, err = c.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: table, Key: key})
	default:
		return fmt.Errorf("the export definition calls dynamodb:%s, which localrun cannot attribute to the state machine", resource)
	}
	if err != nil {
		return fmt.Errorf("attribute dynamodb:%s to the state machine: %w", resource, err)
	}
	return nil
}

// unsent answers every request with an empty JSON success, sending
// nothing.
type unsent struct{}

func (unsent) Do(r *http.Request) (*http.Response, error) {
	return &http.Response{
		StatusCode: http.StatusOK, Status: "200 OK", Request: r,
		Header: http.Header{"Content-Type": []string{"application/x-amz-json-1.0"}},
		Body:   io.NopCloser(strings.NewReader("{}")),
	}, nil
}

// staleToken reports whether err says the callback's execution no longer
// waits for it: a callback sent before an interrupted StartExport, whose
// execution a later StartExport (or the engine's timeout) has ended since.
// Step Functions drops such an answer; so does Exports.
func staleToken(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "InvalidToken", "TaskTimedOut", "TaskDoesNotExist":
		return true
	}
	return false
}

// call runs the exporter handler; a panic is an error, as the runtime
// reports it.
func (a *Exports) call(ctx context.Context, payload []byte) (out []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, messages.InvokeResponse_Error{Type: errorType(p), Message: fmt.Sprint(p)}
		}
	}()
	return a.exporter(ctx, payload)
}

// errorType names v's type as the Lambda Go runtime does.
func errorType(v any) string {
	t := reflect.TypeOf(v)
	if t == nil {
		return "nil"
	}
	if t.Kind() == reflect.Pointer {
		return t.Elem().Name()
	}
	return t.Name()
}

// history reads the execution's steps from the engine.
func (a *Exports) history(ctx context.Context, desc *sfn.DescribeExecutionOutput) (*Execution, error) {
	exec := &Execution{Status: desc.Status, Error: aws.ToString(desc.Error), Cause: aws.ToString(desc.Cause)}
	state := ""
	pages := sfn.NewGetExecutionHistoryPaginator(a.sfn, &sfn.GetExecutionHistoryInput{ExecutionArn: desc.ExecutionArn})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("execution history: %w", err)
		}
		for _, ev := range page.Events {
			switch {
			case ev.StateEnteredEventDetails != nil:
				state = aws.ToString(ev.StateEnteredEventDetails.Name)
				if ev.Type != sfntypes.HistoryEventTypeTaskStateEntered {
					exec.Steps = append(exec.Steps, Step{State: state})
				}
			case ev.Type == sfntypes.HistoryEventTypeTaskScheduled:
				exec.Steps = append(exec.Steps, Step{State: state})
				if d := ev.TaskScheduledEventDetails; d != nil && aws.ToString(d.ResourceType) != "sqs" {
					if err := a.attribute(ctx, aws.ToString(d.ResourceType), aws.ToString(d.Resource)); err != nil {
						return nil, err
					}
				}
			case ev.TaskFailedEventDetails != nil && len(exec.Steps) > 0:
				exec.Steps[len(exec.Steps)-1].Error = aws.ToString(ev.TaskFailedEventDetails.Error)
			case ev.TaskTimedOutEventDetails != nil && len(exec.Steps) > 0:
				exec.Steps[len(exec.Steps)-1].Error = aws.ToString(ev.TaskTimedOutEventDetails.Error)
			}
		}
	}
	return exec, nil
}
