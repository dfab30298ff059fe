package sqsqueue

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/batchgen/batchgen/internal/queue"
)

// errNoDLQ is returned by the DeadLetters methods of a Queue built without
// Options.DLQURL.
var _ queue.HiddenDeadLetters = (*Queue)(nil)

var errNoDLQ = errors.New("no dead-letter queue configured (Options.DLQURL)")

// listDeadRounds bounds the receives of one ListDead call.
const listDeadRounds = 20

// listDeadHidden is how long ListDead hides the dead letters it has seen
// while it looks for more; it shows them again before returning.
const listDeadHidden = 30 * time.Second

// ListDead returns up to max dead-lettered messages without removing them.
// SQS has no peek, and the SDK cannot send a receive's visibility timeout of
// 0 (it omits zero), so ListDead receives the dead letters, hiding them
// while it looks for more (the first receive long-polls, later ones do
// not), then makes them visible again with ChangeMessageVisibilityBatch.
// Each listing counts as a receive of the dead letters
// (ApproximateReceiveCount grows), which matters only if the dead-letter
// queue had a redrive policy of its own; it has none in template.yaml. If
// showing them again fails, ListDead reports it, and the letters reappear
// by themselves after 30 s.
func (q *Queue) ListDead(ctx context.Context, max int) ([]queue.Delivery, error) {
	what := "list dead letters"
	if q.opts.DLQURL == "" {
		return nil, fmt.Errorf("%s: %w", what, errNoDLQ)
	}
	if max < 1 {
		return nil, fmt.Errorf("%s: max %d, want at least 1", what, max)
	}
	seen := map[string]bool{}
	var out []queue.Delivery
	var err error
	for round := 0; round < listDeadRounds && len(out) < max; round++ {
		in := &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(q.opts.DLQURL),
			MaxNumberOfMessages:         int32(min(max-len(out), maxBatch)),
			VisibilityTimeout:           seconds(listDeadHidden, MaxVisibility),
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
		}
		if round == 0 {
			in.WaitTimeSeconds = seconds(q.opts.WaitTime, maxWait)
		}
		var ds []queue.Delivery
		if ds, err = q.receive(ctx, in); err != nil || len(ds) == 0 {
			break
		}
		for _, d := range ds {
			if !seen[d.ID] {
				seen[d.ID] = true
				out = append(out, d)
			}
		}
	}
	if showErr := q.showAgain(context.WithoutCancel(ctx), q.opts.DLQURL, out); showErr != nil {
		err = errors.Join(err, showErr)
	}
	if err != nil {
		return nil, fmt.Errorf("%s from %s: %w", what, q.opts.DLQURL, err)
	}
	return out, nil
}

// HiddenDead implements queue.HiddenDeadLetters: the dead-letter queue's
// ApproximateNumberOfMessagesNotVisible.
func (q *Queue) HiddenDead(ctx context.Context) (int, error) {
	what := "count hidden dead letters"
	if q.opts.DLQURL == "" {
		return 0, fmt.Errorf("%s: %w", what, errNoDLQ)
	}
	name := types.QueueAttributeNameApproximateNumberOfMessagesNotVisible
	out, err := q.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(q.opts.DLQURL), AttributeNames: []types.QueueAttributeName{name},
	})
	if err != nil {
		return 0, fmt.Errorf("%s of %s: %w", what, q.opts.DLQURL, err)
	}
	n, err := strconv.Atoi(out.Attributes[string(name)])
	if err != nil {
		return 0, fmt.Errorf("%s of %s: %s is %q, not a count", what, q.opts.DLQURL, name, out.Attributes[string(name)])
	}
	return n, nil
}

// showAgain makes received messages visible at once, ten per call.
func (q *Queue) showAgain(ctx context.Context, url string, ds []queue.Delivery) error {
	for start := 0; start < len(ds); start += maxBatch {
		part := ds[start:min(start+maxBatch, len(ds))]
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(part))
		for i, d := range part {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(start + i)), ReceiptHandle: aws.String(d.Receipt), VisibilityTimeout: 0,
			}
		}
		out, err := q.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(url), Entries: entries})
		if err != nil {
			return fmt.Errorf("show listed messages again: %w", err)
		}
		if err := batchFailures("message", out.Failed); err != nil {
			return fmt.Errorf("show listed messages again: %w", err)
		}
	}
	return nil
}

// Redrive moves every dead letter back to the work queue and returns how
// many moved: with StartMessageMoveTask where the service has it, else by
// receive, send and delete (see the package comment).
func (q *Queue) Redrive(ctx context.Context) (int, error) {
	what := "redrive " + q.opts.DLQURL + " to " + q.url
	if q.opts.DLQURL == "" {
		return 0, fmt.Errorf("redrive: %w", errNoDLQ)
	}
	if !q.noMoveTask.Load() {
		n, err := q.redriveMoveTask(ctx)
		if !isUnsupported(err) {
			if err != nil {
				return 0, fmt.Errorf("%s: %w", what, err)
			}
			return n, nil
		}
		q.noMoveTask.Store(true)
	}
	n, err := q.redriveByHand(ctx)
	if err != nil {
		return n, fmt.Errorf("%s (moved %d): %w", what, n, err)
	}
	return n, nil
}

// isUnsupported reports whether err says the service does not implement
// the operation. AWS answers every SQS JSON request with a JSON body; moto
// 5.x answers StartMessageMoveTask with an HTML 500 page ("action has not
// been implemented"), which the SDK fails to deserialize; other emulators
// answer 501 or an unknown-operation code.
func isUnsupported(err error) bool {
	if err == nil {
		return false
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "InvalidAction", "UnsupportedOperation", "NotImplemented", "UnknownOperationException":
			return true
		}
	}
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) {
		return false
	}
	var de *smithy.DeserializationError
	return re.HTTPStatusCode() == http.StatusNotImplemented ||
		(re.HTTPStatusCode() >= http.StatusInternalServerError && errors.As(err, &de))
}

// queueARN looks up a queue's ARN, which the move task takes.
func (q *Queue) queueARN(ctx context.Context, url string) (string, error) {
	out, err := q.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return "", fmt.Errorf("ARN of %s: %w", url, err)
	}
	arn := out.Attributes[string(types.QueueAttributeNameQueueArn)]
	if arn == "" {
		return "", fmt.Errorf("ARN of %s: not returned", url)
	}
	return arn, nil
}

// moveTaskPoll is how often Redrive checks a running move task.
const moveTaskPoll = time.Second

// redriveMoveTask starts an SQS move task from the dead-letter queue to the
// work queue and waits until it finishes.
func (q *Queue) redriveMoveTask(ctx context.Context) (int, error) {
	src, err := q.queueARN(ctx, q.opts.DLQURL)
	if err != nil {
		return 0, err
	}
	dst, err := q.queueARN(ctx, q.url)
	if err != nil {
		return 0, err
	}
	start, err := q.client.StartMessageMoveTask(ctx, &sqs.StartMessageMoveTaskInput{
		SourceArn: aws.String(src), DestinationArn: aws.String(dst),
	})
	if err != nil {
		return 0, fmt.Errorf("start move task: %w", err)
	}
	handle := aws.ToString(start.TaskHandle)
	ctx, cancel := context.WithTimeout(ctx, q.opts.RedriveTimeout)
	defer cancel()
	for {
		out, err := q.client.ListMessageMoveTasks(ctx, &sqs.ListMessageMoveTasksInput{SourceArn: aws.String(src), MaxResults: aws.Int32(10)})
		if err != nil {
			return 0, fmt.Errorf("move task %s: %w", handle, err)
		}
		// The newest task comes first. Only a RUNNING task carries its
		// handle; another handle means a redrive started after ours.
		if len(out.Results) == 0 {
			return 0, fmt.Errorf("move task %s: not listed", handle)
		}
		t := out.Results[0]
		if h := aws.ToString(t.TaskHandle); h != "" && h != handle {
			return 0, fmt.Errorf("move task %s: another move task %s started meanwhile", handle, h)
		}
		moved := int(t.ApproximateNumberOfMessagesMoved)
		switch aws.ToString(t.Status) {
		case "COMPLETED":
			return moved, nil
		case "FAILED", "CANCELLED":
			return moved, fmt.Errorf("move task %s %s after %d messages: %s",
				handle, aws.ToString(t.Status), moved, aws.ToString(t.FailureReason))
		}
		select {
		case <-q.opts.Clock.After(moveTaskPoll):
		case <-ctx.Done():
			return 0, fmt.Errorf("move task %s still running: %w", handle, ctx.Err())
		}
	}
}

// redriveHidden is how long the fallback hides a dead letter it is moving,
// so a concurrent ListDead or Redrive does not take it too.
const redriveHidden = 30 * time.Second

// redriveByHand moves dead letters ten at a time: receive, send each as a
// new message, delete the sent ones, until a long poll finds none.
func (q *Queue) redriveByHand(ctx context.Context) (int, error) {
	moved := 0
	for {
		ds, err := q.receive(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(q.opts.DLQURL),
			MaxNumberOfMessages:         maxBatch,
			WaitTimeSeconds:             seconds(max(q.opts.WaitTime, time.Second), maxWait),
			VisibilityTimeout:           seconds(redriveHidden, MaxVisibility),
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount, types.MessageSystemAttributeNameMessageGroupId},
		})
		if err != nil {
			return moved, fmt.Errorf("receive dead letters: %w", err)
		}
		if len(ds) == 0 {
			return moved, nil
		}
		send := make([]types.SendMessageBatchRequestEntry, len(ds))
		for i, d := range ds {
			// The group is already a valid MessageGroupId: it was sent as one.
			send[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(d.Body)), MessageGroupId: messageGroupID(d.Group)}
		}
		out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q.url), Entries: send})
		if err != nil {
			return moved, fmt.Errorf("send dead letters back: %w", err)
		}
		// Delete only what was sent; a failed entry stays dead and is
		// reported.
		var del []types.DeleteMessageBatchRequestEntry
		for _, ok := range out.Successful {
			i, err := strconv.Atoi(aws.ToString(ok.Id))
			if err != nil || i < 0 || i >= len(ds) {
				return moved, fmt.Errorf("send dead letters back: unexpected entry ID %q", aws.ToString(ok.Id))
			}
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: ok.Id, ReceiptHandle: aws.String(ds[i].Receipt)})
		}
		if len(del) > 0 {
			dout, err := q.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q.opts.DLQURL), Entries: del})
			if err != nil {
				return moved, fmt.Errorf("delete redriven dead letters: %w", err)
			}
			if err := batchFailures("dead letter", dout.Failed); err != nil {
				return moved, fmt.Errorf("delete redriven dead letters (now duplicated in the work queue): %w", err)
			}
		}
		moved += len(del)
		if err := batchFailures("dead letter", out.Failed); err != nil {
			return moved, fmt.Errorf("send dead letters back: %w", err)
		}
	}
}
