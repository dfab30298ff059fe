package localrun

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCallbackDefinition: the exporter's Lambda Task of the real
// definition becomes a callback through the queue, with everything else
// (ResultSelector, Retry, Catch, the DynamoDB task) left to the engine, and
// the retry intervals scaled down to ASL's 1 s minimum.
func TestCallbackDefinition(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../../infra/statemachine/export.asl.json")
	if err != nil {
		t.Fatal(err)
	}
	const arn = "arn:aws:lambda:us-east-1:123456789012:function:exporter"
	def := strings.NewReplacer("${ExporterFunctionArn}", arn, "${TableName}", "t").Replace(string(raw))
	out, err := callbackDefinition([]byte(def), arn, "http://q/1/callbacks", 0.01)
	if err != nil {
		t.Fatal(err)
	}
	var got, orig map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(def), &orig); err != nil {
		t.Fatal(err)
	}
	export := got["States"].(map[string]any)["Export"].(map[string]any)
	wantParams := map[string]any{
		"QueueUrl":    "http://q/1/callbacks",
		"MessageBody": map[string]any{"payload": map[string]any{"task_id.$": "$.task_id"}, "token.$": "$$.Task.Token"},
	}
	if diff := cmp.Diff(callbackResource, export["Resource"]); diff != "" {
		t.Errorf("Resource (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantParams, export["Parameters"]); diff != "" {
		t.Errorf("Parameters (-want +got):\n%s", diff)
	}
	origExport := orig["States"].(map[string]any)["Export"].(map[string]any)
	for _, k := range []string{"ResultSelector", "ResultPath", "Catch", "TimeoutSeconds"} {
		if diff := cmp.Diff(origExport[k], export[k]); diff != "" {
			t.Errorf("%s changed (-orig +got):\n%s", k, diff)
		}
	}
	var intervals []any
	for _, r := range export["Retry"].([]any) {
		rm := r.(map[string]any)
		intervals = append(intervals, rm["ErrorEquals"], rm["MaxAttempts"], rm["IntervalSeconds"], rm["MaxDelaySeconds"])
	}
	want := []any{
		[]any{"Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException", "Lambda.TooManyRequestsException"}, 6.0, 1.0, 1.0,
		[]any{"NotReadyError", "ExportError"}, 5.0, 1.0, 1.0,
	}
	if diff := cmp.Diff(want, intervals); diff != "" {
		t.Errorf("retriers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(orig["States"].(map[string]any)["MarkTaskFailed"].(map[string]any)["Parameters"],
		got["States"].(map[string]any)["MarkTaskFailed"].(map[string]any)["Parameters"]); diff != "" {
		t.Errorf("MarkTaskFailed changed (-orig +got):\n%s", diff)
	}

	for _, tc := range []struct{ name, def, wantErr string }{
		{"another function", strings.Replace(def, arn, arn+"-other", 1), "runs only the exporter"},
		{"no exporter task", `{"StartAt":"A","States":{"A":{"Type":"Pass","End":true}}}`, "no Task invokes the exporter"},
		{"not JSON", `{`, "unexpected end"},
	} {
		if _, err := callbackDefinition([]byte(tc.def), arn, "q", 1); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error = %v, want it to contain %q", tc.name, err, tc.wantErr)
		}
	}
}
