//go:build emulator

package lambdafn_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/batchgen/batchgen/internal/store"
)

// TestEndToEndSlowModelLowQuota: a slow model under a low quota runs every
// invocation into its deadline many more times than the queue's
// maxReceiveCount (5), yet each hand-back after progress is resent as a
// fresh message, so every row is done and the dead-letter queue stays
// empty.
func TestEndToEndSlowModelLowQuota(t *testing.T) {
	t.Parallel()
	e := newE2E(t, e2eOptions{
		rows: 24, batchSize: 12,
		latency:  300 * time.Millisecond,
		quotaRPM: 120, maxConcurrency: 2, // 1 call a second per instance
		callTimeout: time.Second,
	})
	// An invocation has 6 s: rows start for its first 4.5 s (6 s minus a
	// call's timeout and the 0.5 s kept to settle), so a batch of 12 rows
	// at one call a second needs several invocations.
	e.stack.InvocationTimeout = 6 * time.Second
	for _, g := range e.stack.Generators {
		g.Headroom = 500 * time.Millisecond
	}
	ev := e.upload("slow.xlsx", nil)
	id := e.taskID(ev)
	if err := e.stack.Splitter.Handle(t.Context(), ev); err != nil {
		t.Fatalf("split: %v", err)
	}
	task := e.pump(id, 2*time.Minute)
	if task.State != store.TaskSucceeded {
		t.Fatalf("task %s, want SUCCEEDED", task.State)
	}
	rows, err := e.stack.Store.ListRows(t.Context(), store.ListRowsParams{TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.State != store.RowSucceeded {
			t.Errorf("row %d is %s (%s), want SUCCEEDED", r.No, r.State, r.Error)
		}
	}
	// Each batch needs several invocations (a hand-back without progress,
	// when the quota held every row back, is a normal retry and uses a
	// receive; those with progress are resent and do not).
	if released := e.metricSum("BatchesReleased"); released < 4 {
		t.Errorf("%v hand-backs, want at least 4: the invocations must have run into their deadline", released)
	}
	out, err := e.stack.SQS.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(e.res.DLQURL),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible},
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range out.Attributes {
		if n, _ := strconv.Atoi(v); n != 0 {
			t.Errorf("dead-letter queue %s = %d, want empty", k, n)
		}
	}
}
