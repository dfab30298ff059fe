//go:build emulator

package lambdafn_test

// The end-to-end test: the five handlers wired by lambdafn (as functions/*
// wire them) on moto with resources provisioned from template.yaml, the
// model behind the mock OpenAI-compatible server over real HTTP.
//
// internal/samstack/localrun drives the stack, as cmd/batchgen-localaws
// does: an S3 ObjectCreated event for the uploaded object goes to the
// splitter; a loop standing in for the SQS event source mapping feeds the
// generator (two "instances", up to 10 messages an event, deleting the
// successes and leaving the batch item failures to their new visibility);
// the generator that finishes the last batch starts the export. moto cannot
// run a Go Lambda, so moto's own Step Functions engine executes the real
// definition as provisioned (DefinitionSubstitutions applied) with the
// exporter's Task turned into a callback that localrun answers by calling
// the exporter handler in-process: the engine takes the Retry and Catch
// paths, and the Catch path's UpdateItem goes to moto's DynamoDB. After
// that run, the real stepfn.Starter starts the provisioned machine's
// execution on moto too, so the named execution exists there and moto's run
// of the unchanged definition (whose Lambda call fails) shows that the
// Catch path leaves a finished task alone.
//
// Run: eval "$(infra/emulator/start.sh)"; export AWS_ENDPOINT_URL
//      go test -tags emulator -run TestEndToEnd ./internal/lambdafn/

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	gocmp "github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/awsops"
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/llm/mockserver/mocks3"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/samstack/localrun"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/faultstore"
)

const (
	e2eRows      = 200
	e2eBatchSize = 25
)

// e2e is one provisioned stack with the handlers wired on it.
type e2e struct {
	t     *testing.T
	res   *samstack.Resources
	mock  *mockserver.Server
	logs  *lambdatest.SyncBuffer
	stack *localrun.Stack
	// ops records every AWS operation the stack's functions perform.
	ops *awsops.Recorder
	// rows is the number of rows upload puts in the sheet.
	rows int
}

type e2eOptions struct {
	failRate float64
	// invalidRate breaks that share of the mock's structured answers.
	invalidRate float64
	// callsPerRound, when set, is the generator's CallsPerRound; fewer
	// calls per round make failing rows release their batch more often.
	callsPerRound, rounds int
	// brokenExporter writes results to a bucket that does not exist.
	brokenExporter bool
	// storageFaults makes every fourth claim, row save and batch finish of
	// the generators fail as DynamoDB throttling would.
	storageFaults bool
	// duplicateMessages sends every batch message a second time, in
	// reverse order, as SQS's at-least-once delivery may.
	duplicateMessages bool
	// ops, when set, records the AWS operations of each function under its
	// name (splitter, generator, exporter, sweeper, statemachine).
	ops *awsops.Set
	// rows and batchSize size the sheet; zero means e2eRows and
	// e2eBatchSize.
	rows, batchSize int
	// latency is the mock model's answer time; quotaRPM and maxConcurrency,
	// when set, are QUOTA_RPM and MAX_CONCURRENCY (each instance takes
	// quotaRPM/maxConcurrency); callTimeout, when set, is the generator's
	// CallTimeout.
	latency                  time.Duration
	quotaRPM, maxConcurrency int
	// env adds to the functions' environment (a template parameter's
	// variable, say).
	env         map[string]string
	callTimeout time.Duration
	// providers, when set, returns PROVIDERS_FILE given the mock model's
	// base URL (http://HOST:PORT/v1).
	providers func(mockURL string) string
	// batchDelay is how long the mock's provider batches take.
	batchDelay time.Duration
	// bedrock makes the stack's model a Claude model on Bedrock
	// (ModelProvider=bedrock), whose control plane the mock plays, with
	// batch inference jobs' files in the stack's bucket.
	bedrock bool
}

// bedrockE2EModel is the model of e2eOptions.bedrock.
const bedrockE2EModel = "anthropic.claude-3-5-haiku-20241022-v1:0"

func newE2E(t *testing.T, opts e2eOptions) *e2e {
	t.Helper()
	ctx := t.Context()
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatalf("emulator: %v", err)
	}
	prefix := samstack.UniquePrefix("e2e")
	res, err := samstack.Provision(ctx, cfg, "../../template.yaml", prefix)
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		if err := res.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	// Bedrock's batch inference jobs read and write the emulator's S3.
	objects := mocks3.Objects{Client: s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })}
	mock := mockserver.New(mockserver.Config{FailRate: opts.failRate, InvalidRate: opts.invalidRate, Seed: 7, Latency: opts.latency, BatchDelay: opts.batchDelay, Objects: objects})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srvCtx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- mock.Serve(srvCtx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("mock server: %v", err)
		}
	})

	vars := res.Env()
	vars["MODEL_PROVIDER"] = "openai"
	vars["MODEL_NAME"] = "mock-1"
	vars["MODEL_BASE_URL"] = "http://" + ln.Addr().String() + "/v1"
	vars["BATCH_SIZE"] = strconv.Itoa(cmp.Or(opts.batchSize, e2eBatchSize))
	vars["MAX_ROWS"] = "100000"
	vars["LEASE_SECONDS"] = "360"
	vars["LOG_LEVEL"] = "debug"
	if opts.providers != nil {
		vars["PROVIDERS_FILE"] = opts.providers(vars["MODEL_BASE_URL"])
	}
	if opts.bedrock {
		vars["MODEL_PROVIDER"], vars["MODEL_NAME"] = "bedrock", bedrockE2EModel
		vars["MODEL_BASE_URL"] = "http://" + ln.Addr().String()
		vars["BEDROCK_BATCH_ROLE_ARN"] = "arn:aws:iam::" + samstack.AccountID + ":role/" + prefix + "-BedrockBatchRole"
	}
	if opts.quotaRPM > 0 {
		vars["QUOTA_RPM"] = strconv.Itoa(opts.quotaRPM)
	}
	if opts.maxConcurrency > 0 {
		vars["MAX_CONCURRENCY"] = strconv.Itoa(opts.maxConcurrency)
	}
	maps.Copy(vars, opts.env)
	env, err := awswire.LoadEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatalf("LoadEnv: %v", err)
	}

	e := &e2e{t: t, res: res, mock: mock, logs: &lambdatest.SyncBuffer{}, ops: awsops.New(), rows: cmp.Or(opts.rows, e2eRows)}
	t.Cleanup(func() {
		if t.Failed() {
			lines := strings.Split(e.logs.String(), "\n")
			t.Logf("last log lines:\n%s", strings.Join(lines[max(0, len(lines)-80):], "\n"))
		}
	})
	e.stack, err = localrun.New(ctx, localrun.Config{
		AWS: cfg, Resources: res, Env: env,
		Generators: 2, // like two concurrent Lambda environments
		Log:        e.logs, LogLevel: slog.LevelDebug, Metrics: e.logs,
		TempDir:       t.TempDir(),
		IntervalScale: 0.01,
		Customize: func(function string, d *awswire.Deps) {
			if opts.ops != nil {
				name, _, _ := strings.Cut(function, "-") // generator-2 is a generator
				d.AWS = opts.ops.For(name).Attach(d.AWS)
			}
			d.AWS = e.ops.Attach(d.AWS)
			if function == "exporter" && opts.brokenExporter {
				d.Env.BucketName = prefix + "-no-such-bucket"
			}
			d.TuneGenerator = func(st store.Store, cfg *pipeline.GeneratorConfig) store.Store {
				cfg.RetryDelays = []time.Duration{time.Second}
				cfg.CallsPerRound = opts.callsPerRound
				cfg.Rounds = opts.rounds
				cfg.BackoffBase = 10 * time.Millisecond
				cfg.BackoffMax = 50 * time.Millisecond
				cfg.ErrorDelay = time.Second
				if opts.callTimeout > 0 {
					cfg.CallTimeout = opts.callTimeout
				}
				if opts.storageFaults {
					return faultstore.New(st, faultstore.EveryNth(4, "ClaimBatch", "SaveRowResults", "FinishBatch", "GetTask"))
				}
				return st
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// input is one sheet row.
func e2eRow(i int, filtered []int) []string {
	name := fmt.Sprintf("商品 %03d", i)
	if slices.Contains(filtered, i) {
		name += " [[filter]]"
	}
	return []string{name, []string{"玩具", "文具", "厨具"}[i%3]}
}

// upload puts a workbook of e.rows rows under incoming/ and returns the
// S3 event for it.
func (e *e2e) upload(name string, filtered []int) events.S3Event {
	e.t.Helper()
	var rows [][]string
	for i := 1; i <= e.rows; i++ {
		rows = append(rows, e2eRow(i, filtered))
	}
	body := lambdatest.XLSX(e.t, lambdatest.Header, rows, "为{{商品名称}}（{{类目}}）写一句文案")
	ev, err := e.stack.Upload(e.t.Context(), name, body)
	if err != nil {
		e.t.Fatal(err)
	}
	return ev
}

// taskID is the id the splitter derives for the uploaded object.
func (e *e2e) taskID(ev events.S3Event) string {
	e.t.Helper()
	id, err := e.stack.TaskID(ev)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// pump runs the event source mapping until the task is final.
func (e *e2e) pump(taskID string, within time.Duration) store.Task {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), within)
	defer cancel()
	until := func(ctx context.Context) bool { return e.stack.TaskFinal(ctx, taskID) }
	if err := e.stack.Pump(ctx, until, nil); err != nil {
		e.t.Fatal(err)
	}
	task, err := e.stack.Store.GetTask(e.t.Context(), taskID)
	if err != nil {
		e.t.Fatalf("GetTask: %v", err)
	}
	if !task.State.Final() {
		e.t.Fatalf("task %s is %s after %v (%d/%d batches done)", taskID, task.State, within, task.BatchesDone, task.BatchesTotal)
	}
	return task
}

// pumpUntilQuiet runs the event source mapping until done holds and no
// batch of the task is leased: every delivery in flight has ended. Pump
// stops the generators mid-delivery once its condition holds, which a
// deployed stack never does; a delivery cut off there keeps its batch
// leased for LEASE_SECONDS, and a test that goes on with the task (a
// start, a retry) would wait that long for it.
func (e *e2e) pumpUntilQuiet(taskID string, within time.Duration, done func(context.Context) bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), within)
	defer cancel()
	quiet := func(ctx context.Context) bool {
		if !done(ctx) {
			return false
		}
		leased, err := e.stack.Store.ListBatches(ctx, store.ListBatchesParams{TaskID: taskID, States: []store.BatchState{store.BatchRunning}})
		return err == nil && len(leased) == 0
	}
	if err := e.stack.Pump(ctx, quiet, nil); err != nil {
		e.t.Fatal(err)
	}
}

// duplicateMessages sends every batch message of a task once more, last
// batch first.
func (e *e2e) duplicateMessages(batches int, taskID string) {
	e.t.Helper()
	var entries []sqstypes.SendMessageBatchRequestEntry
	for no := batches; no >= 1; no-- {
		entries = append(entries, sqstypes.SendMessageBatchRequestEntry{
			Id: aws.String(fmt.Sprint(no)), MessageBody: aws.String(string(pipeline.EncodeBatchMessage(taskID, no))),
		})
		if len(entries) == 10 || no == 1 {
			out, err := e.stack.SQS.SendMessageBatch(e.t.Context(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(e.res.QueueURL), Entries: entries})
			if err != nil || len(out.Failed) > 0 {
				e.t.Fatalf("send duplicates: %v %+v", err, out)
			}
			entries = entries[:0]
		}
	}
}

// resultRows reads the result workbook at key: the header, then the rows.
// result returns the result object at key, failing the test when there is none.
func (e *e2e) result(key string) []byte {
	e.t.Helper()
	b, ok := e.object(key)
	if !ok {
		e.t.Fatalf("the result is not at %s", key)
	}
	return b
}

func (e *e2e) resultRows(key string) [][]string {
	e.t.Helper()
	b := e.result(key)
	f, err := excelize.OpenReader(bytes.NewReader(b))
	if err != nil {
		e.t.Fatalf("the result is not a workbook: %v", err)
	}
	defer f.Close()
	// The result is the dropped workbook itself: its prompt sheet comes
	// back too, beside the input sheet with the answers.
	if sheets := f.GetSheetList(); !slices.Equal(sheets, []string{"商品", "prompt"}) {
		e.t.Errorf("result sheets = %q, want the input's 商品 and prompt", sheets)
	}
	rows, err := f.GetRows(f.GetSheetList()[0])
	if err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// checkResult asserts the result of the dropped input is at resultKey,
// every row came back in order with its input, and exactly the filtered
// rows failed.
func (e *e2e) checkResult(resultKey string, filtered []int) {
	e.t.Helper()
	rows := e.resultRows(resultKey)
	wantHeader := append(slices.Clone(lambdatest.Header), pipeline.ResultColumns...)
	if diff := gocmp.Diff(wantHeader, rows[0]); diff != "" {
		e.t.Errorf("result header mismatch (-want +got):\n%s", diff)
	}
	if len(rows) != e.rows+1 {
		e.t.Fatalf("result has %d data rows, want %d", len(rows)-1, e.rows)
	}
	for i := 1; i <= e.rows; i++ {
		row := rows[i]
		for len(row) < len(wantHeader) {
			row = append(row, "")
		}
		in := e2eRow(i, filtered)
		prompt := "为" + in[0] + "（" + in[1] + "）写一句文案"
		want := []string{in[0], in[1], "Copy for: " + prompt, "succeeded", ""}
		if slices.Contains(filtered, i) {
			want = []string{in[0], in[1], "", "failed", "content_filter"}
		}
		got := []string{row[0], row[1], row[2], row[3], row[5]}
		if diff := gocmp.Diff(want, got); diff != "" {
			e.t.Errorf("result row %d mismatch (-want +got):\n%s", i, diff)
		}
	}
}

// checkBilledOnce asserts no prompt was answered twice, and that every row
// that should succeed was answered once.
func (e *e2e) checkBilledOnce(filtered []int) {
	e.t.Helper()
	stats := e.mock.Stats()
	for i := 1; i <= e.rows; i++ {
		in := e2eRow(i, filtered)
		prompt := "为" + in[0] + "（" + in[1] + "）写一句文案"
		want := int64(1)
		if slices.Contains(filtered, i) {
			want = 0
		}
		if got := stats.PerPrompt[prompt].Succeeded; got != want {
			e.t.Errorf("row %d answered %d times, want %d", i, got, want)
		}
	}
}

// metricSum adds up a metric over the EMF lines written so far.
func (e *e2e) metricSum(name string) float64 {
	var sum float64
	for _, l := range e.logs.Lines(e.t) {
		if _, ok := l["_aws"]; !ok {
			continue
		}
		if v, ok := l[name].(float64); ok {
			sum += v
		}
	}
	return sum
}

// checkExecution asserts the named execution exists on the emulator and
// that moto's own run of it (whose Lambda call fails) did not overturn the
// task's final state.
func (e *e2e) checkExecution(taskID string, want store.TaskState) {
	e.t.Helper()
	arn := strings.Replace(e.res.StateMachineArn, ":stateMachine:", ":execution:", 1) + ":" + taskID
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := e.stack.SFN.DescribeExecution(e.t.Context(), &sfn.DescribeExecutionInput{ExecutionArn: aws.String(arn)})
		if err != nil {
			e.t.Fatalf("no execution named after the task on the emulator: %v", err)
		}
		if aws.ToString(out.Name) != taskID {
			e.t.Errorf("execution name = %q, want %q", aws.ToString(out.Name), taskID)
		}
		if out.Status != sfntypes.ExecutionStatusRunning {
			e.t.Logf("the emulator's execution %s ended %s %s", taskID, out.Status, aws.ToString(out.Error))
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("execution %s still running after 60s", arn)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-e.t.Context().Done():
			e.t.Fatal(e.t.Context().Err())
		}
	}
	task, err := e.stack.Store.GetTask(e.t.Context(), taskID)
	if err != nil {
		e.t.Fatal(err)
	}
	if task.State != want {
		e.t.Errorf("after the emulator's execution the task is %s (%s), want %s", task.State, task.Error, want)
	}
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		opts      e2eOptions
		filtered  []int
		deliver   int // how many times the S3 event is delivered
		wantState store.TaskState
	}{
		{name: "happy path", deliver: 1, wantState: store.TaskSucceeded},
		{
			// Two calls per round: a row failing twice releases its batch,
			// which comes back after the graded delay; twelve calls in all
			// make a retryable row that never succeeds all but impossible.
			name: "provider faults", opts: e2eOptions{failRate: 0.2, callsPerRound: 2, rounds: 6},
			filtered: []int{7, 77, 150}, deliver: 1, wantState: store.TaskPartial,
		},
		{name: "duplicate upload event", deliver: 2, wantState: store.TaskSucceeded},
		{name: "every message delivered twice", opts: e2eOptions{duplicateMessages: true}, deliver: 1, wantState: store.TaskSucceeded},
		{name: "throttled table", opts: e2eOptions{storageFaults: true}, deliver: 1, wantState: store.TaskSucceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newE2E(t, tc.opts)
			ev := e.upload("商品 list.xlsx", tc.filtered)
			taskID := e.taskID(ev)

			var wg sync.WaitGroup
			errs := make([]error, tc.deliver)
			for i := range tc.deliver {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = e.stack.Splitter.Handle(t.Context(), ev)
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("splitter: %v", err)
			}
			tasks, err := e.stack.Store.ListTasks(t.Context(), 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(tasks) != 1 || tasks[0].ID != taskID {
				t.Fatalf("tasks after %d deliveries = %+v, want one task %s", tc.deliver, tasks, taskID)
			}
			if tc.opts.duplicateMessages {
				e.duplicateMessages(tasks[0].BatchesTotal, taskID)
			}

			// 200 rows take seconds; the slack is for a loaded machine, where the
			// emulator's Step Functions engine answers slowly.
			task := e.pump(taskID, 150*time.Second)
			if task.State != tc.wantState || task.RowsFailed != len(tc.filtered) || task.RowsSucceeded != e2eRows-len(tc.filtered) {
				t.Errorf("task = %s, %d succeeded, %d failed; want %s with %d failed",
					task.State, task.RowsSucceeded, task.RowsFailed, tc.wantState, len(tc.filtered))
			}
			if run := e.stack.Exports.Execution(taskID); run == nil || run.Status != sfntypes.ExecutionStatusSucceeded {
				t.Fatalf("export execution = %+v, want SUCCEEDED", run)
			}
			// One export, one StartExecution, however often the batches'
			// messages or the upload event came.
			if n := e.ops.Counts()[awsops.Name(sfn.ServiceID, "StartExecution")]; n != 1 {
				t.Errorf("%d StartExecution calls for one export, want 1 (ops: %v)", n, e.ops.Counts())
			}
			// A dropped file's result is named after it, not after the task.
			if want := "results/商品 list.result.xlsx"; task.ResultKey != want {
				t.Errorf("result key = %q, want %q", task.ResultKey, want)
			}
			e.checkResult("results/商品 list.result.xlsx", tc.filtered)
			e.checkBilledOnce(tc.filtered)
			if got := e.metricSum(metrics.RowsFailed); got != float64(len(tc.filtered)) {
				t.Errorf("EMF RowsFailed sums to %v, want %d", got, len(tc.filtered))
			}
			if tc.opts.failRate > 0 {
				// The faults took the retry paths: in-round retries, and
				// batches released and redelivered through the queue.
				if n := e.mock.Stats().ServerErrors; n == 0 {
					t.Error("the mock answered no 5xx; the fault path was not exercised")
				}
				if n := e.metricSum(metrics.BatchesReleased); n == 0 {
					t.Error("no batch was released for a later delivery")
				}
				if n := e.stack.MaxReceiveCount(); n < 2 {
					t.Errorf("highest ApproximateReceiveCount = %d, want a redelivered message", n)
				}
			}
			e.checkExecution(taskID, tc.wantState)

			// A late redelivery of the upload event changes nothing.
			if err := e.stack.Splitter.Handle(t.Context(), ev); err != nil {
				t.Fatalf("late redelivery: %v", err)
			}
			after, err := e.stack.Store.GetTask(t.Context(), taskID)
			if err != nil || after.State != tc.wantState {
				t.Errorf("after a late redelivery the task is %s (%v), want %s", after.State, err, tc.wantState)
			}
		})
	}
}

func TestEndToEndExportFailure(t *testing.T) {
	t.Parallel()
	e := newE2E(t, e2eOptions{brokenExporter: true})
	ev := e.upload("broken.xlsx", nil)
	taskID := e.taskID(ev)
	if err := e.stack.Splitter.Handle(t.Context(), ev); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	task := e.pump(taskID, 90*time.Second)
	if task.State != store.TaskFailed || !strings.HasPrefix(task.Error, "export failed: ExportError: ") {
		t.Errorf("task = %s %q, want FAILED by the state machine's Catch", task.State, task.Error)
	}
	if task.FinishedAt.IsZero() {
		t.Error("the Catch path did not set finished_at")
	}
	run := e.stack.Exports.Execution(taskID)
	if run == nil {
		t.Fatal("no export execution ran")
	}
	// The exporter's error is retried 5 times before the Catch marks the task.
	var want []localrun.Step
	for range 6 {
		want = append(want, localrun.Step{State: "Export", Error: "ExportError"})
	}
	want = append(want, localrun.Step{State: "MarkTaskFailed"}, localrun.Step{State: "ExportFailed"})
	if diff := gocmp.Diff(want, run.Steps); diff != "" {
		t.Errorf("export execution steps mismatch (-want +got):\n%s", diff)
	}
	if run.Status != sfntypes.ExecutionStatusFailed || run.Error != "ExportFailed" {
		t.Errorf("export execution = %s %s, want FAILED ExportFailed", run.Status, run.Error)
	}
	e.checkExecution(taskID, store.TaskFailed)
	if _, err := e.stack.S3.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: aws.String(e.res.BucketName), Key: aws.String("results/broken.result.xlsx")}); err == nil {
		t.Error("a failed export left a result")
	}
}

// awsCallBudget is the most AWS calls (model calls excluded) a 1,000-row
// job may make through the functions: grouped fenced row-result writes,
// one cache read per batch, batched split writes, no polling for cancel.
const awsCallBudget = 600

// TestAWSCallsPerThousandRows runs a 1,000-row job through the handlers
// and counts every AWS call they make with the awsops middleware. make
// bench prints the line it logs.
func TestAWSCallsPerThousandRows(t *testing.T) {
	t.Parallel()
	const rows = 1000
	calls := &awsops.Set{}
	e := newE2E(t, e2eOptions{rows: rows, batchSize: 100, ops: calls})
	ev := e.upload("count.xlsx", nil)
	taskID := e.taskID(ev)
	if err := e.stack.Splitter.Handle(t.Context(), ev); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	task := e.pump(taskID, 5*time.Minute)
	if task.State != store.TaskSucceeded || task.RowsSucceeded != rows {
		t.Fatalf("task = %s with %d rows succeeded, want SUCCEEDED with %d", task.State, task.RowsSucceeded, rows)
	}
	e.checkResult("results/count.result.xlsx", nil)
	e.checkBilledOnce(nil)

	perOp := map[string]int{}
	var lines []string
	total := 0
	for _, fn := range calls.Names() {
		if fn == "store" { // the test's own reads
			continue
		}
		r := calls.For(fn)
		total += r.Total()
		lines = append(lines, fmt.Sprintf("  %-12s %4d  %v", fn, r.Total(), r.Counts()))
		for op, n := range r.Counts() {
			perOp[op] += n
		}
	}
	t.Logf("AWS calls by function:\n%s", strings.Join(lines, "\n"))
	t.Logf("AWS calls by operation: %v", perOp)
	t.Logf("AWS calls per 1,000 rows: %d (budget %d)", total*1000/rows, awsCallBudget)
	if total > awsCallBudget*rows/1000 {
		t.Errorf("%d AWS calls for %d rows, over the budget of %d per 1,000 rows", total, rows, awsCallBudget)
	}
	// Per-row calls are gone: nothing is called once per row or more.
	for op, n := range perOp {
		if n >= rows {
			t.Errorf("%s called %d times for %d rows: a per-row call is back", op, n, rows)
		}
	}
}
