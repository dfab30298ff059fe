//go:build emulator

package lambdafn_test

// The IAM test: every AWS operation each function performs on the emulator
// (moto enforces no IAM) must be granted to that function's role in
// template.yaml, and each role grants nothing its function never uses
// unless an entry of unobserved says why.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awsops"
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
	"github.com/batchgen/batchgen/internal/lambdafn/eventsfn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/samstack/samgrants"
	"github.com/batchgen/batchgen/internal/store"
)

// roles maps the function names the test records under to their logical
// IDs in template.yaml.
var roles = map[string]string{
	"splitter":     "SplitterFunction",
	"generator":    "GeneratorFunction",
	"exporter":     "ExporterFunction",
	"api":          "ApiFunction",
	"sweeper":      "SweeperFunction",
	"events":       "EventsFunction",
	"statemachine": "ExportStateMachine",
}

// unobserved lists the actions a role is granted that the runs below do
// not exercise, each with the reason it is still needed. Keep it short: an
// entry here is a grant no test proves necessary.
var unobserved = map[string]map[string]string{
	"SplitterFunction": {
		"states:StartExecution":   "starts the export of a task that split into no batches; a sheet with no data rows is rejected before that",
		"s3:AbortMultipartUpload": "aborts a multipart upload (a workbook input over 5 MiB kept under inputs/) that failed part-way",
	},
	"ExporterFunction": {
		// s3:GetObject is used on inputs/; overflow/ (cells of rows over
		// 300 KB) has no test of its own here.
		"s3:AbortMultipartUpload": "aborts a multipart upload (results over 5 MiB) that failed part-way",
		"s3:ListBucket":           "makes S3 answer a missing kept input (a task split before inputs were kept) with 404, not 403; every test task keeps its input",
	},
	"GeneratorFunction": {
		"ssm:GetParameter": "reads the model API keys at cold start, only when ModelApiKeyParam or ProviderApiKeyParams is set (the emulator runs use a keyless mock)",
		// No emulator serves Bedrock; internal/llm/bedrock tests the calls
		// through the SDK against a double of the Converse wire format.
		"bedrock:InvokeModel": "calls the model through Bedrock's Converse, only when ModelProvider is bedrock or ProviderBedrockModels is set (the emulator runs use a mock)",
		"s3:GetObject":        "reads the cells of rows over 300 KB from overflow/ (the test sheets have no such rows) and batch inference jobs' output (TestBedrockEconomyOnTheStack)",
		// Batch inference on Bedrock (ModelProvider=bedrock):
		// TestBedrockEconomyOnTheStack runs it and checks these grants.
		"bedrock:CreateModelInvocationJob": "creates Bedrock batch inference jobs (TestBedrockEconomyOnTheStack)",
		"bedrock:GetModelInvocationJob":    "looks at Bedrock batch inference jobs (TestBedrockEconomyOnTheStack)",
		"bedrock:StopModelInvocationJob":   "stops the Bedrock batch inference jobs of a cancelled or auto task",
		"bedrock:ListModelInvocationJobs":  "finds a Bedrock batch inference job whose create answer was lost",
		"iam:PassRole":                     "passes BedrockBatchRole to the jobs it creates: checked by Bedrock, no call of ours",
		"s3:PutObject":                     "writes the input of Bedrock batch inference jobs (TestBedrockEconomyOnTheStack)",
	},
	"ExportStateMachine": {
		"lambda:InvokeFunction": "the Task state invokes the exporter; the emulator runs stand in for that call with the handler itself",
		"dynamodb:UpdateItem":   "the Catch path marks the task FAILED when the export fails for good (TestEndToEndExportFailure runs it)",
		// Step Functions itself uses these to deliver the execution logs
		// (Logging in template.yaml); no code of ours calls them.
		"logs:CreateLogDelivery":        "execution log delivery, by Step Functions",
		"logs:GetLogDelivery":           "execution log delivery, by Step Functions",
		"logs:UpdateLogDelivery":        "execution log delivery, by Step Functions",
		"logs:DeleteLogDelivery":        "execution log delivery, by Step Functions",
		"logs:ListLogDeliveries":        "execution log delivery, by Step Functions",
		"logs:PutResourcePolicy":        "execution log delivery, by Step Functions",
		"logs:DescribeResourcePolicies": "execution log delivery, by Step Functions",
		"logs:DescribeLogGroups":        "execution log delivery, by Step Functions",
	},
}

func TestIAMGrantsMatchUse(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var ops awsops.Set
	// Faults in the model take the generator's release paths (visibility
	// changes) as well as the happy one.
	e := newE2E(t, e2eOptions{ops: &ops, failRate: 0.2, callsPerRound: 2, rounds: 6,
		batchDelay: 2 * time.Second, env: map[string]string{"PROVIDER_BATCH_POLL": "1s"}})

	// 1. A drop-folder sheet, run to its export.
	ev := e.upload("iam.xlsx", []int{3})
	dropped := e.taskID(ev)
	if err := e.stack.Splitter.Handle(ctx, ev); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	e.pump(dropped, 90*time.Second)

	// 2. A rejected sheet: the splitter writes the error file.
	bad, err := e.stack.Upload(ctx, "no-rows.csv", []byte("a,b\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.stack.Splitter.Handle(ctx, bad); err != nil {
		t.Fatalf("splitter on a rejected sheet: %v", err)
	}

	// 3. The API: create a task, upload through the presigned URL, split
	// it, read it, list tasks, cancel it, read a finished one and an
	// unknown one.
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	apiDeps := awswire.NewDeps(e.stack.Env, ops.For("api").Attach(cfg), "api")
	h, err := apifn.New(apiDeps)
	if err != nil {
		t.Fatal(err)
	}
	// The caller is the drop folder's principal, so the dropped task is
	// theirs to read and retry.
	call := func(method, path, body string, want int) []byte {
		t.Helper()
		resp, out := lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: pipeline.LocalOwner, Method: method, Target: path, ContentType: "application/json", Body: body})
		if resp.StatusCode != want {
			t.Fatalf("%s %s = %d %s, want %d", method, path, resp.StatusCode, out, want)
		}
		return out
	}
	var created api.CreateTaskResponse
	body := lambdatest.XLSX(t, lambdatest.Header, [][]string{{"a", "b"}, {"c", "d"}}, "{{商品名称}}")
	if err := json.Unmarshal(call("POST", "/api/tasks", fmt.Sprintf(`{"filename":"via-api.xlsx","size":%d}`, len(body)), http.StatusCreated), &created); err != nil {
		t.Fatal(err)
	}
	call("GET", "/api/tasks/"+created.ID, "", http.StatusOK) // awaiting upload
	// The event stream, through the Function URL adapter as the events
	// function serves it: a task awaiting its sheet (its upload record).
	// With the template's cap on a principal's streams, counted in the table.
	evEnv := e.stack.Env
	evEnv.MaxStreams = 10
	evDeps := awswire.NewDeps(evEnv, ops.For("events").Attach(cfg), "events")
	stream, err := eventsfn.New(ctx, evDeps, api.Fixed(pipeline.LocalOwner))
	if err != nil {
		t.Fatal(err)
	}
	if got := streamFirstEvent(t, stream, created.ID); !strings.Contains(got, `"status":"AWAITING_UPLOAD"`) {
		t.Errorf("event stream of a task awaiting its sheet: %q", got)
	}
	e.putUpload(created, body)
	key := pipeline.IncomingKey(created.ID, "via-api.xlsx")
	if err := e.stack.Splitter.Handle(ctx, e.uploadedEvent(key)); err != nil {
		t.Fatalf("splitter on the API upload: %v", err)
	}
	call("GET", "/api/tasks?limit=10", "", http.StatusOK)
	// A split task's stream: its rows done are counted from its batches.
	if got := streamFirstEvent(t, stream, created.ID); !strings.Contains(got, "event: snapshot") || !strings.Contains(got, `"rows_done":0`) {
		t.Errorf("event stream of a task being generated: %q", got)
	}
	call("POST", "/api/tasks/"+created.ID+"/cancel", "", http.StatusAccepted)
	call("GET", "/api/tasks/"+dropped, "", http.StatusOK) // finished: presigns the result
	// A finished task's stream: the task and its presigned result link.
	if got := streamFirstEvent(t, stream, dropped); !strings.Contains(got, "event: done") || !strings.Contains(got, `"result_url":"http`) {
		t.Errorf("event stream of a finished task: %q", got)
	}
	call("GET", "/api/tasks/no-such-task", "", http.StatusNotFound)

	// 4. The sweeper: a split task nobody works on, with one batch claimed
	// by a worker that died. The first pass re-enqueues the waiting batches
	// and resets the expired lease; after every batch was claimed once
	// more, the second pass fails them as stuck (a transaction fenced by
	// an update of the batch), which finishes the task and starts its export. The
	// cancelled API task's export is started by the sweeper too.
	stuckEv := e.upload("stuck.xlsx", nil)
	stuck := e.taskID(stuckEv)
	if err := e.stack.Splitter.Handle(ctx, stuckEv); err != nil {
		t.Fatal(err)
	}
	task, err := e.stack.Store.GetTask(ctx, stuck)
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	claimAll := func(nos ...int) {
		t.Helper()
		for _, no := range nos {
			if _, err := e.stack.Store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: stuck, BatchNo: no, Owner: "dead", Now: past, LeaseUntil: past.Add(time.Minute)}); err != nil {
				t.Fatalf("claim batch %d: %v", no, err)
			}
		}
	}
	claimAll(1)
	if err := e.stack.TuneSweeper(func(c *pipeline.SweeperConfig) { c.PendingAfter = time.Nanosecond }); err != nil {
		t.Fatal(err)
	}
	report, err := e.stack.Sweeper.Handle(ctx, events.EventBridgeEvent{})
	if err != nil {
		t.Fatalf("first sweep: %v", err)
	}
	if report.Requeued == 0 || report.LeasesReset != 1 {
		t.Errorf("first sweep = %+v, want requeued batches and one lease reset", report)
	}
	all := make([]int, task.BatchesTotal)
	for i := range all {
		all[i] = i + 1
	}
	claimAll(all...)
	if err := e.stack.TuneSweeper(func(c *pipeline.SweeperConfig) { c.PendingAfter, c.MaxClaims = time.Nanosecond, 1 }); err != nil {
		t.Fatal(err)
	}
	report, err = e.stack.Sweeper.Handle(ctx, events.EventBridgeEvent{})
	if err != nil {
		t.Fatalf("second sweep: %v", err)
	}
	if report.BatchesFailed != task.BatchesTotal {
		t.Errorf("second sweep = %+v, want %d batches failed as stuck", report, task.BatchesTotal)
	}
	if got, err := e.stack.Store.GetTask(ctx, stuck); err != nil || !got.State.Final() {
		t.Errorf("the stuck task is %s (%v), want final", got.State, err)
	}

	// 5. Retry through the API: the dropped task is PARTIAL (row 3 is
	// filtered), its failed rows run again.
	call("POST", "/api/tasks/"+dropped+"/retry", "", http.StatusAccepted)

	// 6. An economy task dropped with its settings: the generators journal
	// its provider batches in the table and park its batches between
	// looks, each a fresh message (sqs:SendMessage).
	if _, err := e.stack.Upload(ctx, "economy.batchgen.json", []byte(`{"mode": "economy"}`)); err != nil {
		t.Fatal(err)
	}
	ecoEv := e.upload("economy.xlsx", nil)
	if err := e.stack.Splitter.Handle(ctx, ecoEv); err != nil {
		t.Fatalf("splitter on the economy sheet: %v", err)
	}
	eco := e.taskNamed(ctx, "economy.xlsx")
	if got := e.pump(eco, 90*time.Second); got.State != store.TaskSucceeded || got.Mode != store.ModeEconomy {
		t.Errorf("the economy task is %s in mode %q, want SUCCEEDED in economy", got.State, got.Mode)
	}

	checkGrants(t, &ops)
}

// checkObservedGranted checks that what the named functions did is
// granted to their roles in template.yaml.
func checkObservedGranted(t *testing.T, ops *awsops.Set, names ...string) {
	t.Helper()
	grants, err := samgrants.RoleGrants(t.Context(), "../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		id := roles[name]
		for _, a := range ops.For(name).Actions() {
			if !slices.ContainsFunc(grants[id], func(g samgrants.Grant) bool { return g.Matches(a) }) {
				t.Errorf("%s needs %s (operations %v), which template.yaml does not grant its role", id, a, ops.For(name).Ops())
			}
		}
	}
}

// checkGrants compares what each function did with what template.yaml
// grants its role.
func checkGrants(t *testing.T, ops *awsops.Set) {
	t.Helper()
	grants, err := samgrants.RoleGrants(t.Context(), "../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range ops.Names() {
		if _, ok := roles[name]; !ok && name != "store" && name != "starter" {
			t.Errorf("operations recorded under %q, which is no function", name)
		}
	}
	for name, id := range roles {
		observed := ops.For(name).Actions()
		if len(observed) == 0 && name != "statemachine" {
			t.Errorf("%s performed no AWS operation: the runs did not exercise it", name)
		}
		granted := grants[id]
		t.Logf("%s: observed %v", id, observed)
		for _, a := range observed {
			if !slices.ContainsFunc(granted, func(g samgrants.Grant) bool { return g.Matches(a) }) {
				t.Errorf("%s needs %s (operations %v), which template.yaml does not grant its role", id, a, ops.For(name).Ops())
			}
		}
		for _, g := range granted {
			used := slices.ContainsFunc(observed, g.Matches)
			reason, allowed := unobserved[id][g.Action]
			switch {
			case used && allowed:
				t.Errorf("%s: %s is listed as unobserved (%q) but was used: drop the entry", id, g.Action, reason)
			case !used && !allowed:
				t.Errorf("%s is granted %s (%s) but never used it: remove the grant, or list it in unobserved with the reason", id, g.Action, g.From)
			}
		}
		for a := range unobserved[id] {
			if !slices.ContainsFunc(granted, func(g samgrants.Grant) bool { return g.Action == a }) {
				t.Errorf("%s: unobserved lists %s, which the role is not granted", id, a)
			}
		}
	}
	if t.Failed() {
		t.Logf("grants: %+v", grants)
	}
}

// streamFirstEvent opens a task's event stream through the events
// function's handler and returns the stream up to its first event, then
// hangs up.
func streamFirstEvent(t *testing.T, h *eventsfn.Handler, id string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	path := "/api/tasks/" + id + "/events"
	req := &events.LambdaFunctionURLRequest{RawPath: path, Headers: map[string]string{"accept": "text/event-stream"}}
	req.RequestContext.DomainName = "events.lambda-url.eu-west-1.on.aws"
	req.RequestContext.HTTP.Method, req.RequestContext.HTTP.Path = http.MethodGet, path
	resp, err := h.Handle(ctx, req)
	if err != nil {
		t.Fatalf("events %s: %v", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("events %s: %d %s", id, resp.StatusCode, b)
	}
	var out strings.Builder
	lines := bufio.NewReader(resp.Body)
	for {
		line, err := lines.ReadString('\n')
		out.WriteString(line)
		if err != nil || line == "\n" && strings.Contains(out.String(), "event: ") {
			return out.String()
		}
	}
}
