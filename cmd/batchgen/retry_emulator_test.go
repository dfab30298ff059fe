//go:build emulator

package main

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/dynamostore"
)

// TestRetryOnAWS: `batchgen retry TASK --table --queue-url` reopens the
// failed rows of a finished task of the deployed stack (provisioned from
// template.yaml on the emulator), enqueues their batch on the work queue and
// bumps the export generation; a running or unknown task is refused.
func TestRetryOnAWS(t *testing.T) {
	ctx := context.Background()
	cfg, res := deployedStack(t, "retrycli")

	st := dynamostore.New(dynamodb.NewFromConfig(cfg), res.TableName, dynamostore.Options{})
	now := time.Now()
	task := store.Task{ID: "t-retry-1", State: store.TaskRunning, Source: "incoming/x.xlsx", RowsTotal: 2, BatchesTotal: 1,
		Spec: store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 2}, Header: []string{"a"}, CreatedAt: now, UpdatedAt: now}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must2 := func(_ store.SaveRowResultsResult, err error) { t.Helper(); must(err) }
	must(st.CreateTask(ctx, task))
	must(st.PutRows(ctx, []store.Row{{TaskID: task.ID, No: 1, SheetRow: 2, Values: []string{"x"}}, {TaskID: task.ID, No: 2, SheetRow: 3, Values: []string{"y"}}}))
	must(st.PutBatches(ctx, []store.Batch{{TaskID: task.ID, No: 1, FirstRow: 1, RowCount: 2, CreatedAt: now}}))
	b, err := st.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
	must(err)
	must2(st.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: []store.RowResultWrite{{RowNo: 1, Result: store.RowResult{State: store.RowSucceeded, Output: "ok", Attempts: 1}}}, Now: now}))
	must2(st.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: []store.RowResultWrite{{RowNo: 2, Result: store.RowResult{State: store.RowFailed, Error: "quota", ErrorClass: "retry_exhausted", Attempts: 12}}}, Now: now}))
	_, err = st.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 1, Failed: 1, Now: now})
	must(err)
	_, err = st.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskRunning}, To: store.TaskPartial, ResultKey: "results/x.xlsx", Now: now})
	must(err)

	// status and tasks read the deployed table as they read a data directory.
	r := runBinary(t, ctx, "status", task.ID, "--table", res.TableName)
	for _, want := range []string{"t-retry-1  PARTIAL", "rows      2  (succeeded 1, failed 1, skipped 0, pending 0; cached 0)",
		"failures  retry_exhausted 1", "row 2 (sheet row 3)  retry_exhausted: quota", "answered  sim 1"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("status --table: exit %d, want %q in\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}
	if r := runBinary(t, ctx, "tasks", "--table", res.TableName, "--state", "partial", "--since", "1h"); r.code != 0 || !strings.Contains(r.stdout, task.ID) {
		t.Errorf("tasks --table --state partial: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runBinary(t, ctx, "tasks", "--table", res.TableName, "--state", "running"); r.code != 0 || strings.Contains(r.stdout, task.ID) {
		t.Errorf("tasks --table --state running lists the PARTIAL task: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	stack := []string{"--table", res.TableName, "--queue-url", res.QueueURL}
	if r := runBinary(t, ctx, "retry", task.ID, "--table", res.TableName); r.code != 2 || !strings.Contains(r.stderr, "--queue-url") {
		t.Errorf("retry with --table alone: exit %d\n%s", r.code, r.stderr)
	}
	if r := runBinary(t, ctx, append([]string{"retry", "no-such-task"}, stack...)...); r.code != 2 || !strings.Contains(r.stderr, "no task no-such-task") {
		t.Errorf("retry of an unknown task: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = runBinary(t, ctx, append([]string{"retry", task.ID, "--error-class", "retry_exhausted"}, stack...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "1 batch(es) with failed rows of class retry_exhausted re-enqueued") || !strings.Contains(r.stdout, "export generation 1") {
		t.Fatalf("retry on AWS: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	got, err := st.GetTask(ctx, task.ID)
	if err != nil || got.State != store.TaskRunning || got.ExportGen != 1 || got.ResultKey != "" {
		t.Errorf("task after retry = %+v (%v), want RUNNING, export generation 1, no result", got, err)
	}
	// Receive until the queue has been empty for a whole long poll: one
	// short poll can come back empty on a loaded emulator even though the
	// message is there. Messages are told apart by ID and hidden for a few
	// seconds only: a receive whose answer was lost on the way (the SDK
	// then asks again) leaves its message hidden, and it must come back
	// within the loop, not count twice.
	sq := sqs.NewFromConfig(cfg)
	bodies := map[string]string{}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		msgs, err := sq.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: &res.QueueURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 2, VisibilityTimeout: 5})
		if err != nil {
			t.Fatalf("receive from the work queue: %v", err)
		}
		if len(msgs.Messages) == 0 && len(bodies) > 0 {
			break
		}
		for _, m := range msgs.Messages {
			bodies[*m.MessageId] = *m.Body
		}
	}
	// At least once: a send the SDK repeated after a lost answer is a
	// second message with the same body, which the generator's claim
	// makes harmless. What must hold is that batch 1, and only it, is
	// there.
	distinct := slices.Compact(slices.Sorted(maps.Values(bodies)))
	if want := string(pipeline.EncodeBatchMessage(task.ID, 1)); len(distinct) != 1 || distinct[0] != want {
		counts, err := queueAttributes(ctx, sq, res.QueueURL)
		t.Errorf("work queue after retry holds %q, want batch 1 once (%q); queue attributes %v (%v)", bodies, want, counts, err)
	}
	if r := runBinary(t, ctx, append([]string{"retry", task.ID}, stack...)...); r.code != 2 || !strings.Contains(r.stderr, "RUNNING") {
		t.Errorf("retry of a running task: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

}
