package asl_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambda/messages"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/awsemu/asl"
	"github.com/batchgen/batchgen/internal/clock"
)

func mustParse(t *testing.T, def string) *asl.Machine {
	t.Helper()
	m, err := asl.Parse([]byte(def))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return m
}

func run(t *testing.T, r *asl.Runner, def, input string) *asl.Execution {
	t.Helper()
	exec, err := r.Run(t.Context(), mustParse(t, def), "exec-1", []byte(input))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return exec
}

// jsonEqual compares JSON texts structurally.
func jsonEqual(t *testing.T, want string, got []byte) {
	t.Helper()
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want JSON: %v", err)
	}
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("output is not JSON: %v: %s", err, got)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("output mismatch (-want +got):\n%s", diff)
	}
}

func TestParseRejectsWhatItCannotRun(t *testing.T) {
	t.Parallel()
	task := func(extra string) string {
		return `{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:123456789012:function:f", ` + extra + `"End": true}}}`
	}
	tests := []struct {
		name, def, want string
	}{
		{"not JSON", `{`, "parse definition"},
		{"no StartAt", `{"States": {"A": {"Type": "Succeed"}}}`, "StartAt is required"},
		{"StartAt names nothing", `{"StartAt": "B", "States": {"A": {"Type": "Succeed"}}}`, `StartAt "B" names no state`},
		{"JSONata", `{"QueryLanguage": "JSONata", "StartAt": "A", "States": {"A": {"Type": "Succeed"}}}`, "QueryLanguage"},
		{"unknown top-level field", `{"StartAt": "A", "Extra": 1, "States": {"A": {"Type": "Succeed"}}}`, `"Extra" is not supported`},
		{"Wait state", `{"StartAt": "A", "States": {"A": {"Type": "Wait", "Seconds": 1, "End": true}}}`, `state type "Wait" is not supported`},
		{"Map state", `{"StartAt": "A", "States": {"A": {"Type": "Map", "End": true}}}`, `state type "Map" is not supported`},
		{"Parallel state", `{"StartAt": "A", "States": {"A": {"Type": "Parallel", "End": true}}}`, `state type "Parallel" is not supported`},
		{"heartbeat", task(`"HeartbeatSeconds": 5, `), `"HeartbeatSeconds" is not supported`},
		{"unknown resource", `{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage", "Parameters": {}, "End": true}}}`, "is not supported"},
		{"callback pattern", `{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken", "End": true}}}`, "is not supported"},
		{"invoke without Payload", `{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Parameters": {"FunctionName": "f"}, "End": true}}}`, "Parameters.Payload is required"},
		{"invoke type", `{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Parameters": {"FunctionName": "f", "Payload": {}, "InvocationType": "Event"}, "End": true}}}`, "Parameters.InvocationType is not supported"},
		{"update item extra", `{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:states:::dynamodb:updateItem", "Parameters": {"TableName": "t", "Key": {}, "ReturnConsumedCapacity": "TOTAL"}, "End": true}}}`, "ReturnConsumedCapacity is not supported"},
		{"recursive descent", task(`"InputPath": "$..a", `), "recursive descent"},
		{"wildcard", task(`"InputPath": "$.a[*]", `), "index"},
		{"unknown intrinsic", task(`"Parameters": {"id.$": "States.UUID()"}, `), "States.UUID is not supported"},
		{"format arity", task(`"Parameters": {"id.$": "States.Format('{} {}', $.a)"}, `), "2 {} for 1 arguments"},
		{"Next and End", `{"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "A", "End": true}}}`, "exactly one of Next and End"},
		{"Next to nowhere", `{"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "B"}}}`, `goes to "B"`},
		{"States.ALL not last", task(`"Retry": [{"ErrorEquals": ["States.ALL"]}, {"ErrorEquals": ["X"]}], `), "States.ALL must appear alone"},
		{"retrier field", task(`"Retry": [{"ErrorEquals": ["X"], "BackoffRates": 2}], `), `"BackoffRates" is not supported`},
		{"jitter", task(`"Retry": [{"ErrorEquals": ["X"], "JitterStrategy": "HALF"}], `), "FULL or NONE"},
		{"Fail with Error and ErrorPath", `{"StartAt": "A", "States": {"A": {"Type": "Fail", "Error": "X", "ErrorPath": "$.e"}}}`, "exclusive"},
		{"Choice operator", `{"StartAt": "A", "States": {"A": {"Type": "Choice", "Choices": [{"Variable": "$.t", "TimestampEquals": "x", "Next": "B"}]}, "B": {"Type": "Succeed"}}}`, "TimestampEquals is not supported"},
		{"Choice operand", `{"StartAt": "A", "States": {"A": {"Type": "Choice", "Choices": [{"Variable": "$.n", "NumericEquals": "1", "Next": "B"}]}, "B": {"Type": "Succeed"}}}`, "needs a number operand"},
		{"ResultPath into the context", task(`"ResultPath": "$$.x", `), "read-only"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := asl.Parse([]byte(tc.def))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestPassAndPaths(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	r := &asl.Runner{Clock: clock.NewFake(start)}
	def := `{
	  "StartAt": "Shape",
	  "States": {
	    "Shape": {
	      "Type": "Pass",
	      "InputPath": "$.order",
	      "Parameters": {
	        "id.$": "$.id",
	        "first.$": "$.items[0]",
	        "label.$": "States.Format('order {} of {} ({})', $.id, $['customer name'], $.total)",
	        "exec.$": "$$.Execution.Name",
	        "entered.$": "$$.State.EnteredTime",
	        "static": {"nested": [1, {"deep.$": "$.id"}]},
	        "json.$": "States.JsonToString($.items)",
	        "parsed.$": "States.StringToJson('{\"a\": 1}')",
	        "pair.$": "States.Array($.id, 'x')"
	      },
	      "ResultPath": "$.shaped",
	      "Next": "Keep"
	    },
	    "Keep": {"Type": "Pass", "Result": {"ok": true}, "ResultPath": "$.a.b", "OutputPath": "$.a", "Next": "Done"},
	    "Done": {"Type": "Succeed"}
	  }
	}`
	exec := run(t, r, def, `{"order": {"id": "o-1", "customer name": "Ada", "total": 12.5, "items": ["x", "y"]}}`)
	if exec.Status != asl.StatusSucceeded {
		t.Fatalf("status = %s %s %s", exec.Status, exec.Error, exec.Cause)
	}
	jsonEqual(t, `{"b": {"ok": true}}`, exec.Output)
	if diff := cmp.Diff([]asl.Step{{State: "Shape"}, {State: "Keep"}, {State: "Done"}}, exec.Steps); diff != "" {
		t.Errorf("steps mismatch (-want +got):\n%s", diff)
	}

	// The first state's own output, checked through a one-state machine.
	one := strings.Replace(def, `"Next": "Keep"`, `"End": true`, 1)
	exec = run(t, r, one, `{"order": {"id": "o-1", "customer name": "Ada", "total": 12.5, "items": ["x", "y"]}}`)
	jsonEqual(t, `{
	  "order": {"id": "o-1", "customer name": "Ada", "total": 12.5, "items": ["x", "y"]},
	  "shaped": {
	    "id": "o-1", "first": "x", "label": "order o-1 of Ada (12.5)", "exec": "exec-1",
	    "entered": "2025-06-01T12:00:00.000Z", "static": {"nested": [1, {"deep": "o-1"}]},
	    "json": "[\"x\",\"y\"]", "parsed": {"a": 1}, "pair": ["o-1", "x"]
	  }
	}`, exec.Output)
}

func TestChoice(t *testing.T) {
	t.Parallel()
	def := `{
	  "StartAt": "Route",
	  "States": {
	    "Route": {
	      "Type": "Choice",
	      "Choices": [
	        {"And": [{"Variable": "$.n", "NumericGreaterThanEquals": 10}, {"Not": {"Variable": "$.tag", "StringEquals": "skip"}}], "Next": "Big"},
	        {"Variable": "$.n", "NumericLessThanPath": "$.limit", "Next": "Small"},
	        {"Or": [{"Variable": "$.flag", "BooleanEquals": true}, {"Variable": "$.name", "StringMatches": "log-*.txt"}], "Next": "Flagged"},
	        {"Variable": "$.missing", "IsPresent": true, "Next": "Big"}
	      ],
	      "Default": "Other"
	    },
	    "Big": {"Type": "Pass", "Result": "big", "End": true},
	    "Small": {"Type": "Pass", "Result": "small", "End": true},
	    "Flagged": {"Type": "Pass", "Result": "flagged", "End": true},
	    "Other": {"Type": "Pass", "Result": "other", "End": true}
	  }
	}`
	tests := []struct{ input, want string }{
		{`{"n": 12, "tag": "x", "limit": 0}`, `"big"`},
		{`{"n": 12, "tag": "skip", "limit": 0, "flag": false, "name": "z"}`, `"other"`},
		{`{"n": 3, "tag": "x", "limit": 5}`, `"small"`},
		{`{"n": 7, "tag": "x", "limit": 5, "flag": true}`, `"flagged"`},
		{`{"n": 7, "tag": "x", "limit": 5, "flag": false, "name": "log-2025.txt"}`, `"flagged"`},
		{`{"n": 7, "tag": "x", "limit": 5, "flag": false, "name": "log-2025.csv"}`, `"other"`},
	}
	r := &asl.Runner{}
	for _, tc := range tests {
		exec := run(t, r, def, tc.input)
		if exec.Status != asl.StatusSucceeded {
			t.Errorf("input %s: status %s %s", tc.input, exec.Error, exec.Cause)
			continue
		}
		if string(exec.Output) != tc.want {
			t.Errorf("input %s: output %s, want %s", tc.input, exec.Output, tc.want)
		}
	}

	// A rule reading a missing variable is a runtime error, as in Step
	// Functions (only IsPresent may look at missing fields).
	exec := run(t, r, def, `{"n": 12, "tag": "skip", "limit": 0}`)
	if exec.Status != asl.StatusFailed || exec.Error != asl.ErrRuntime {
		t.Errorf("missing variable = %s %s, want FAILED %s", exec.Status, exec.Error, asl.ErrRuntime)
	}

	noDefault := strings.Replace(def, `"Default": "Other"`, `"Comment": "no default"`, 1)
	exec = run(t, r, noDefault, `{"n": 7, "tag": "x", "limit": 5, "flag": false, "name": "a"}`)
	if exec.Status != asl.StatusFailed || exec.Error != asl.ErrNoChoice {
		t.Errorf("no match without Default = %s %s, want FAILED %s", exec.Status, exec.Error, asl.ErrNoChoice)
	}
}

// flakyError is a function error type; the runtime reports it by name.
type flakyError struct{ n int }

func (e *flakyError) Error() string { return "flaky failure" }

type exportIn struct {
	TaskID string `json:"task_id"`
}

type exportOut struct {
	State string `json:"state"`
}

func TestLambdaInvokeRetryAndCatch(t *testing.T) {
	t.Parallel()
	def := `{
	  "StartAt": "Work",
	  "States": {
	    "Work": {
	      "Type": "Task",
	      "Resource": "arn:aws:states:::lambda:invoke",
	      "Parameters": {"FunctionName": "arn:aws:lambda:us-east-1:123456789012:function:worker", "Payload": {"task_id.$": "$.task_id"}},
	      "ResultSelector": {"result.$": "$.Payload"},
	      "ResultPath": "$.work",
	      "Retry": [
	        {"ErrorEquals": ["NeverRetried"], "MaxAttempts": 0},
	        {"ErrorEquals": ["flakyError"], "IntervalSeconds": 1, "BackoffRate": 2, "MaxAttempts": 2}
	      ],
	      "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Failed"}],
	      "End": true
	    },
	    "Failed": {"Type": "Fail", "Error": "WorkFailed", "CausePath": "States.Format('task {}: {}', $.task_id, $.error.Error)"}
	  }
	}`
	tests := []struct {
		name      string
		failures  int   // calls that fail before one succeeds
		err       error // what a failing call returns
		want      asl.Status
		wantErr   string
		wantCause string
		wantSteps []asl.Step
		wantOut   string
	}{
		{
			name: "succeeds after retries", failures: 2, err: &flakyError{}, want: asl.StatusSucceeded,
			wantSteps: []asl.Step{{"Work", "flakyError"}, {"Work", "flakyError"}, {"Work", ""}},
			wantOut:   `{"task_id": "t-1", "work": {"result": {"state": "SUCCEEDED"}}}`,
		},
		{
			name: "retries exhausted then caught", failures: 3, err: &flakyError{}, want: asl.StatusFailed,
			wantErr: "WorkFailed", wantCause: "task t-1: flakyError",
			wantSteps: []asl.Step{{"Work", "flakyError"}, {"Work", "flakyError"}, {"Work", "flakyError"}, {"Failed", ""}},
		},
		{
			name: "MaxAttempts 0 is not retried by a later retrier", failures: 1,
			err: messages.InvokeResponse_Error{Type: "NeverRetried", Message: "no"}, want: asl.StatusFailed,
			wantErr: "WorkFailed", wantCause: "task t-1: NeverRetried",
			wantSteps: []asl.Step{{"Work", "NeverRetried"}, {"Failed", ""}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			calls := 0
			worker := asl.Handler(func(_ context.Context, in exportIn) (exportOut, error) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if in.TaskID != "t-1" {
					return exportOut{}, errors.New("wrong payload " + in.TaskID)
				}
				if calls <= tc.failures {
					return exportOut{}, tc.err
				}
				return exportOut{State: "SUCCEEDED"}, nil
			})
			r := &asl.Runner{Functions: map[string]asl.Func{"worker": worker}, IntervalScale: 0.001}
			exec := run(t, r, def, `{"task_id": "t-1"}`)
			if exec.Status != tc.want || exec.Error != tc.wantErr || exec.Cause != tc.wantCause {
				t.Errorf("execution = %s %q %q, want %s %q %q", exec.Status, exec.Error, exec.Cause, tc.want, tc.wantErr, tc.wantCause)
			}
			if diff := cmp.Diff(tc.wantSteps, exec.Steps); diff != "" {
				t.Errorf("steps mismatch (-want +got):\n%s", diff)
			}
			if tc.wantOut != "" {
				jsonEqual(t, tc.wantOut, exec.Output)
			}
		})
	}
}

func TestFunctionErrors(t *testing.T) {
	t.Parallel()
	def := `{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:123456789012:function:f:live", "End": true}}}`
	tests := []struct {
		name      string
		fns       map[string]asl.Func
		wantErr   string
		wantCause string
	}{
		{
			name:      "typed error",
			fns:       map[string]asl.Func{"f": asl.Handler(func(context.Context, exportIn) (exportOut, error) { return exportOut{}, &flakyError{} })},
			wantErr:   "flakyError",
			wantCause: `{"errorMessage":"flaky failure","errorType":"flakyError"}`,
		},
		{
			name: "panic",
			fns: map[string]asl.Func{"arn:aws:lambda:us-east-1:123456789012:function:f": asl.Handler(func(context.Context, exportIn) (exportOut, error) {
				panic("boom")
			})},
			wantErr:   "string",
			wantCause: `{"errorMessage":"boom","errorType":"string"}`,
		},
		{
			name:      "bad payload",
			fns:       map[string]asl.Func{"f": asl.Handler(func(context.Context, []int) (exportOut, error) { return exportOut{}, nil })},
			wantErr:   "UnmarshalTypeError",
			wantCause: `{"errorMessage":"json: cannot unmarshal object into Go value of type []int","errorType":"UnmarshalTypeError"}`,
		},
		{
			name:      "no such function",
			fns:       map[string]asl.Func{"g": asl.Handler(func(context.Context, exportIn) (exportOut, error) { return exportOut{}, nil })},
			wantErr:   asl.ErrLambdaNotFound,
			wantCause: "Function not found: arn:aws:lambda:us-east-1:123456789012:function:f:live",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			exec := run(t, &asl.Runner{Functions: tc.fns}, def, `{"task_id": "x"}`)
			if exec.Status != asl.StatusFailed || exec.Error != tc.wantErr || exec.Cause != tc.wantCause {
				t.Errorf("execution = %s %q %q, want FAILED %q %q", exec.Status, exec.Error, exec.Cause, tc.wantErr, tc.wantCause)
			}
		})
	}
}

func TestTaskTimeout(t *testing.T) {
	t.Parallel()
	def := `{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:123456789012:function:f", "TimeoutSeconds": 1,
	  "Retry": [{"ErrorEquals": ["States.TaskFailed"]}], "End": true}}}`
	stall := asl.Handler(func(ctx context.Context, _ exportIn) (exportOut, error) {
		<-ctx.Done()
		return exportOut{}, ctx.Err()
	})
	exec := run(t, &asl.Runner{Functions: map[string]asl.Func{"f": stall}}, def, `{}`)
	// States.TaskFailed does not match a timeout, so it is not retried.
	if exec.Status != asl.StatusFailed || exec.Error != asl.ErrTimeout || len(exec.Steps) != 1 {
		t.Errorf("execution = %s %q after %d steps, want one FAILED %s attempt", exec.Status, exec.Error, len(exec.Steps), asl.ErrTimeout)
	}
}

func TestRuntimeErrorsAreNotCaught(t *testing.T) {
	t.Parallel()
	def := `{"StartAt": "A", "States": {
	  "A": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:123456789012:function:f", "Parameters": {"x.$": "$.missing"},
	        "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "B"}], "End": true},
	  "B": {"Type": "Succeed"}}}`
	f := asl.Handler(func(context.Context, exportIn) (exportOut, error) { return exportOut{}, nil })
	exec := run(t, &asl.Runner{Functions: map[string]asl.Func{"f": f}}, def, `{}`)
	if exec.Status != asl.StatusFailed || exec.Error != asl.ErrRuntime || !strings.Contains(exec.Cause, "missing") {
		t.Errorf("execution = %s %q %q, want FAILED States.Runtime naming the path", exec.Status, exec.Error, exec.Cause)
	}
}

// fakeDynamoDB records UpdateItem calls and answers with err.
type fakeDynamoDB struct {
	mu    sync.Mutex
	calls []*dynamodb.UpdateItemInput
	err   error
}

func (f *fakeDynamoDB) UpdateItem(_ context.Context, in *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, in)
	if f.err != nil {
		return nil, f.err
	}
	return &dynamodb.UpdateItemOutput{}, nil
}

// exportDefinition is the repository's export state machine with its
// DefinitionSubstitutions applied.
func exportDefinition(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../../infra/statemachine/export.asl.json")
	if err != nil {
		t.Fatal(err)
	}
	return strings.NewReplacer(
		"${ExporterFunctionArn}", "arn:aws:lambda:us-east-1:123456789012:function:exporter",
		"${TableName}", "batchgen-table",
	).Replace(string(b))
}

// TestExportDefinition runs the real export definition: success passes the
// exporter's result through; a failing exporter makes the Catch path mark
// the task FAILED with one conditional UpdateItem; a condition that fails
// (the task already finished) is not retried.
func TestExportDefinition(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	// The exporter's own errors are retried 5 times (a task not ready yet, a
	// transient failure) before the Catch marks the task failed.
	exportFails := func(then ...asl.Step) []asl.Step {
		steps := make([]asl.Step, 0, 6+len(then))
		for range 6 {
			steps = append(steps, asl.Step{State: "Export", Error: "ExportError"})
		}
		return append(steps, then...)
	}
	tests := []struct {
		name      string
		exportErr error
		dynamoErr error
		want      asl.Status
		wantErr   string
		wantSteps []asl.Step
		wantCalls int
	}{
		{
			name: "export succeeds", want: asl.StatusSucceeded,
			wantSteps: []asl.Step{{"Export", ""}},
		},
		{
			name: "export fails and the task is marked", exportErr: &ExportError{}, want: asl.StatusFailed, wantErr: "ExportFailed",
			wantSteps: exportFails(asl.Step{State: "MarkTaskFailed"}, asl.Step{State: "ExportFailed"}),
			wantCalls: 1,
		},
		{
			name: "finished task is left alone", exportErr: &ExportError{}, want: asl.StatusFailed, wantErr: "ExportFailed",
			dynamoErr: &smithy.GenericAPIError{Code: "ConditionalCheckFailedException", Message: "The conditional request failed"},
			wantSteps: exportFails(asl.Step{State: "MarkTaskFailed", Error: "DynamoDB.ConditionalCheckFailedException"}, asl.Step{State: "ExportFailed"}),
			wantCalls: 1,
		},
		{
			name: "throttled marking is retried", exportErr: &ExportError{}, want: asl.StatusFailed, wantErr: "ExportFailed",
			dynamoErr: &smithy.GenericAPIError{Code: "ProvisionedThroughputExceededException", Message: "slow down"},
			wantSteps: exportFails(
				asl.Step{State: "MarkTaskFailed", Error: "DynamoDB.ProvisionedThroughputExceededException"},
				asl.Step{State: "MarkTaskFailed", Error: "DynamoDB.ProvisionedThroughputExceededException"},
				asl.Step{State: "MarkTaskFailed", Error: "DynamoDB.ProvisionedThroughputExceededException"},
				asl.Step{State: "MarkTaskFailed", Error: "DynamoDB.ProvisionedThroughputExceededException"},
				asl.Step{State: "MarkTaskFailed", Error: "DynamoDB.ProvisionedThroughputExceededException"},
				asl.Step{State: "MarkTaskFailed", Error: "DynamoDB.ProvisionedThroughputExceededException"},
				asl.Step{State: "ExportFailed"},
			),
			wantCalls: 6,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ddb := &fakeDynamoDB{err: tc.dynamoErr}
			exporter := asl.Handler(func(_ context.Context, in exportIn) (exportOut, error) {
				if tc.exportErr != nil {
					return exportOut{}, tc.exportErr
				}
				return exportOut{State: "SUCCEEDED"}, nil
			})
			clk := clock.NewFake(start)
			r := &asl.Runner{
				Functions: map[string]asl.Func{"arn:aws:lambda:us-east-1:123456789012:function:exporter": exporter},
				DynamoDB:  ddb, Clock: &autoClock{Fake: clk}, IntervalScale: 0.001,
			}
			exec := run(t, r, exportDefinition(t), `{"task_id": "t-9"}`)
			if exec.Status != tc.want || exec.Error != tc.wantErr {
				t.Fatalf("execution = %s %q %q, want %s %q", exec.Status, exec.Error, exec.Cause, tc.want, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantSteps, exec.Steps); diff != "" {
				t.Errorf("steps mismatch (-want +got):\n%s", diff)
			}
			if tc.want == asl.StatusSucceeded {
				jsonEqual(t, `{"task_id": "t-9", "export": {"result": {"state": "SUCCEEDED"}}}`, exec.Output)
				return
			}
			if !strings.HasPrefix(exec.Cause, "task t-9: ExportError: ") {
				t.Errorf("cause = %q, want it to name the task and the error", exec.Cause)
			}
			if len(ddb.calls) != tc.wantCalls {
				t.Fatalf("UpdateItem called %d times, want %d", len(ddb.calls), tc.wantCalls)
			}
			in := ddb.calls[0]
			got := map[string]string{
				"table": aws.ToString(in.TableName), "condition": aws.ToString(in.ConditionExpression),
				"update": aws.ToString(in.UpdateExpression),
				"pk":     in.Key["PK"].(*types.AttributeValueMemberS).Value, "sk": in.Key["SK"].(*types.AttributeValueMemberS).Value,
				"#state": in.ExpressionAttributeNames["#state"],
				":error": in.ExpressionAttributeValues[":error"].(*types.AttributeValueMemberS).Value,
				":now":   in.ExpressionAttributeValues[":now"].(*types.AttributeValueMemberS).Value,
			}
			want := map[string]string{
				"table": "batchgen-table", "condition": "attribute_exists(PK) AND #state IN (:pending, :running, :exporting)",
				"update": "SET #state = :failed, #error = :error, updated_at = :now, finished_at = :now",
				"pk":     "TASK#t-9", "sk": "TASK", "#state": "state",
				":error": `export failed: ExportError: {"errorMessage":"export broke","errorType":"ExportError"}`,
			}
			now := got[":now"]
			delete(got, ":now")
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("UpdateItem input mismatch (-want +got):\n%s", diff)
			}
			// The retries took (scaled) time on the runner's clock.
			if at, err := time.Parse(time.RFC3339, now); err != nil || at.Before(start) || at.After(start.Add(time.Hour)) {
				t.Errorf(":now %q is not an RFC 3339 time shortly after the start: %v", now, err)
			}
		})
	}
}

// ExportError mimics the exporter's error type: Step Functions sees its
// name.
type ExportError struct{}

func (*ExportError) Error() string { return "export broke" }

// autoClock is a fake clock whose timers fire at once (advancing the fake
// time), so retry waits take no real time but are still taken.
type autoClock struct{ *clock.Fake }

func (c *autoClock) After(d time.Duration) <-chan time.Time {
	ch := c.Fake.After(d)
	c.Fake.Advance(d)
	return ch
}
