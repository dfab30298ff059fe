//go:build emulator

package lambdafn_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/awsops"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// taskNamed is the id of the task of the sheet dropped as name.
func (e *e2e) taskNamed(ctx context.Context, name string) string {
	e.t.Helper()
	tasks, err := e.stack.Store.ListTasks(ctx, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, t := range tasks {
		if t.Source == name || strings.HasSuffix(t.Source, "/"+name) {
			return t.ID
		}
	}
	e.t.Fatalf("no task of %s among %d", name, len(tasks))
	return ""
}

// TestEconomyOnTheStack: a sheet dropped with a settings sidecar asking
// for economy runs on the AWS stack through the provider's batch API, in
// batches as large as a batch may be (one provider batch each). The
// generators park its batches between looks (delayed messages, a second
// here), two instances sharing the journal in the table: every row is
// answered in a provider batch, each line sent once, none online, and no
// message walks toward the dead-letter queue however many looks it took.
func TestEconomyOnTheStack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const rows = 40
	e := newE2E(t, e2eOptions{rows: rows, batchSize: 10, batchDelay: 4 * time.Second, env: map[string]string{"PROVIDER_BATCH_POLL": "1s"}})
	if _, err := e.stack.Upload(ctx, "economy.batchgen.json", []byte(`{"mode": "economy"}`)); err != nil {
		t.Fatal(err)
	}
	ev := e.upload("economy.xlsx", nil)
	if err := e.stack.Splitter.Handle(ctx, ev); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	id := e.taskNamed(ctx, "economy.xlsx") // the sidecar is part of what names it
	task := e.pump(id, 120*time.Second)
	if task.State != store.TaskSucceeded || task.RowsSucceeded != rows || task.Mode != store.ModeEconomy {
		t.Fatalf("task %s (%s) with %d of %d rows succeeded; want SUCCEEDED in economy", task.State, task.Mode, task.RowsSucceeded, rows)
	}
	batchLabel := "openai/mock-1" + pricing.BatchSuffix
	if u := task.UsageByProvider[batchLabel]; u.OutputTokens == 0 || len(task.UsageByProvider) != 1 {
		t.Errorf("usage by provider %+v: want all of it through the batch API, as %q", task.UsageByProvider, batchLabel)
	}
	st := e.mock.Stats()
	if st.Requests != 0 || st.BatchLines != rows {
		t.Errorf("the mock answered %d online requests and ran %d batch lines for %d rows; want none online and each line once", st.Requests, st.BatchLines, rows)
	}
	// The splitter made the economy task's batches large (10 rows asked,
	// pipeline.ParkedEconomyBatchRows given): one task batch, one provider
	// batch, where ten-row batches made four.
	if task.BatchesTotal != 1 || st.BatchesCreated != 1 {
		t.Errorf("%d task batches and %d provider batches for %d rows; want one of each", task.BatchesTotal, st.BatchesCreated, rows)
	}
	journal, err := e.stack.Store.(store.ProviderBatches).ListProviderBatches(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	jobs := 0
	for _, j := range journal {
		if j.Job != "" {
			jobs++
		}
	}
	if jobs != 2*int(st.BatchesCreated) {
		t.Errorf("the table's journal records %d provider batches and their ends, the provider made %d", jobs, st.BatchesCreated)
	}
	// The API's view, from the journal: nothing waited on any more.
	if got := pipeline.JournalWaitingOn(e.stack.Store.(store.ProviderBatches))(id); got != "" {
		t.Errorf("the finished task still waits on %q", got)
	}
	if n := e.stack.MaxReceiveCount(); n > 2 {
		t.Errorf("highest ApproximateReceiveCount %d: parked batches must come back as fresh messages", n)
	}
	if !strings.Contains(e.logs.String(), "batch handed back to wait for its provider batches") {
		t.Error("no batch was parked: the provider batches answered within the first look; the test proves nothing")
	}
	rowsOut := e.resultRows(task.ResultKey)
	col := map[string]int{}
	for i, h := range rowsOut[0] {
		col[h] = i
	}
	for _, r := range rowsOut[1:] {
		if r[col["status"]] != "succeeded" || r[col["provider"]] != batchLabel {
			t.Errorf("result row %v: want succeeded through the batch API", r)
		}
	}
}

// TestBedrockEconomyOnTheStack: with a Claude model on Bedrock as the
// stack's model, an economy task runs as batch inference jobs: their input
// written under provider-batches/ in the stack's bucket, the jobs created,
// looked at and read back through Bedrock's control plane (the mock's
// double, over the emulator's S3), the task batches parked between looks.
// Every row answered by a job, none online; and the generator did nothing
// its role does not grant (the grants only this run uses are listed in
// iam_test.go's unobserved, pointing here).
func TestBedrockEconomyOnTheStack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var ops awsops.Set
	const rows = 200
	e := newE2E(t, e2eOptions{ops: &ops, bedrock: true, rows: rows, batchSize: 100, batchDelay: 3 * time.Second, env: map[string]string{"PROVIDER_BATCH_POLL": "1s"}})
	if _, err := e.stack.Upload(ctx, "bedrock.batchgen.json", []byte(`{"mode": "economy"}`)); err != nil {
		t.Fatal(err)
	}
	ev := e.upload("bedrock.xlsx", nil)
	if err := e.stack.Splitter.Handle(ctx, ev); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	task := e.pump(e.taskNamed(ctx, "bedrock.xlsx"), 120*time.Second)
	label := "bedrock/" + bedrockE2EModel + pricing.BatchSuffix
	if task.State != store.TaskSucceeded || task.RowsSucceeded != rows || task.UsageByProvider[label].OutputTokens == 0 || len(task.UsageByProvider) != 1 {
		t.Fatalf("task %s with %d of %d rows succeeded, usage %+v; want all answered by batch inference jobs (%q)", task.State, task.RowsSucceeded, rows, task.UsageByProvider, label)
	}
	if st := e.mock.Stats(); st.Requests != 0 || st.BatchLines != rows || st.BatchesCreated == 0 || st.BatchesCreated > 2 {
		t.Errorf("the mock had %d online requests, %d batch lines in %d jobs, for %d rows in 2 task batches; want each row once in a job", st.Requests, st.BatchLines, st.BatchesCreated, rows)
	}
	observed := ops.For("generator").Actions()
	for _, want := range []string{"bedrock:CreateModelInvocationJob", "bedrock:GetModelInvocationJob", "s3:PutObject", "s3:GetObject"} {
		if !slices.Contains(observed, want) {
			t.Errorf("the generator did not %s (did %v): the run did not go through batch inference", want, observed)
		}
	}
	checkObservedGranted(t, &ops, "generator")
}
