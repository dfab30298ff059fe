// Package sqsqueue implements queue.Queue and queue.DeadLetters on an SQS
// standard queue and its dead-letter queue, for the AWS runtime.
//
// The work queue's visibility timeout and its RedrivePolicy
// (maxReceiveCount, deadLetterTargetArn) are set on the queue itself, in
// template.yaml; SQS moves a message to the dead-letter queue when a
// receive would exceed maxReceiveCount. The generator Lambda normally gets
// its messages from the SQS event source mapping rather than from Receive;
// Receive serves pollers outside Lambda, tools and tests.
//
// # Limits
//
// SQS caps a message's delay at 15 minutes (Outgoing.Delay is rounded up to
// whole seconds and capped at 900 s), a visibility timeout at 12 hours
// (ChangeVisibility caps at 43,200 s), and one receive at 10 messages. Send
// splits messages into SendMessageBatch calls of at most 10 messages and
// 256 KiB.
//
// # Receipts
//
// SQS accepts a superseded receipt handle (from an earlier receive of a
// message that has since been received again) for ChangeMessageVisibility
// and acts on the message's current delivery; moto does the same, its
// maintainers having checked it against AWS. SQS offers no way to tell such
// a receipt from the current one, so ChangeVisibility returns
// queue.ErrNotFound only when SQS rejects the receipt (the message was
// deleted, is not in flight, or the handle is malformed), and the
// conformance suite's stale-receipt check fails on this adapter. The
// pipeline does not rely on receipts for correctness: batches are fenced in
// the task store.
//
// # Redrive
//
// Redrive uses SQS's StartMessageMoveTask (the console's "start DLQ
// redrive") and waits for the move to finish. Emulators that lack it (moto
// 5.x answers that the action is not implemented) get a portable fallback
// that receives from the dead-letter queue, sends each message to the work
// queue as a new message (receive count 1 on its next delivery) and deletes
// it from the dead-letter queue; a crash between send and delete leaves a
// duplicate, which the pipeline tolerates. The first fallback is
// remembered, so a Queue probes only once.
package sqsqueue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/queue"
)

var (
	_ queue.Queue       = (*Queue)(nil)
	_ queue.DeadLetters = (*Queue)(nil)
)

// SQS limits.
const (
	// MaxDelay is the longest delay SQS accepts for a message.
	MaxDelay = 900 * time.Second
	// MaxVisibility is the longest visibility timeout SQS accepts.
	MaxVisibility = 12 * time.Hour
	// maxBatch is the most messages in one SendMessageBatch or receive.
	maxBatch = 10
	// maxBatchBytes is the most payload in one SendMessageBatch.
	maxBatchBytes = 256 << 10
	// maxWait is the longest long-polling wait SQS accepts.
	maxWait = 20 * time.Second
)

// Defaults of Options.
const (
	// DefaultWaitTime keeps Receive on an empty queue short while still
	// long polling, which asks every SQS server (short polling samples a
	// subset and may miss messages).
	DefaultWaitTime = time.Second
	// DefaultRedriveTimeout bounds how long Redrive waits for a move task.
	DefaultRedriveTimeout = 5 * time.Minute
)

// Options tunes a Queue. The zero value is ready to use, except that
// DeadLetters needs DLQURL.
type Options struct {
	// DLQURL is the dead-letter queue's URL, for ListDead and Redrive.
	DLQURL string
	// WaitTime is Receive's long-polling wait, in whole seconds up to 20.
	// Defaults to DefaultWaitTime; negative: the queue's own
	// ReceiveMessageWaitTimeSeconds (0, short polling, in template.yaml).
	WaitTime time.Duration
	// Visibility, when positive, overrides the queue's visibility timeout
	// for messages received through this Queue (whole seconds, up to 12 h).
	Visibility time.Duration
	// RedriveTimeout bounds how long Redrive waits for SQS's move task to
	// finish. Defaults to DefaultRedriveTimeout.
	RedriveTimeout time.Duration
	// Clock paces Redrive's polling of the move task. Defaults to the wall
	// clock.
	Clock clock.Clock
}

// Queue is a work queue on SQS. Its methods are safe for concurrent use.
type Queue struct {
	client *sqs.Client
	url    string
	opts   Options
	// noMoveTask is set once the service has said it lacks
	// StartMessageMoveTask, so Redrive goes straight to the fallback.
	noMoveTask atomic.Bool
}

// FromConfig returns a Queue on the SQS queue at queueURL with a client
// built from cfg.
func FromConfig(cfg aws.Config, queueURL string, opts Options) *Queue {
	return New(sqs.NewFromConfig(cfg), queueURL, opts)
}

// New returns a Queue on the SQS queue at queueURL.
func New(client *sqs.Client, queueURL string, opts Options) *Queue {
	if opts.WaitTime == 0 {
		opts.WaitTime = DefaultWaitTime
	}
	if opts.RedriveTimeout <= 0 {
		opts.RedriveTimeout = DefaultRedriveTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	return &Queue{client: client, url: queueURL, opts: opts}
}

// URL returns the work queue's URL, for messages.
func (q *Queue) URL() string { return q.url }

// seconds rounds d up to whole seconds within [0, limit], as SQS takes
// delays and timeouts: rounding up never shortens a wait that was asked for.
func seconds(d, limit time.Duration) int32 {
	d = min(max(d, 0), limit)
	return int32(math.Ceil(d.Seconds()))
}

// Send enqueues msgs in SendMessageBatch calls of at most 10 messages and
// 256 KiB. Messages of failed entries, or of chunks after a failed call,
// are not sent; the error names the failed entries (by their index in msgs)
// and SQS's reasons. Entries sent before an error stay sent.
func (q *Queue) Send(ctx context.Context, msgs []queue.Outgoing) error {
	for _, c := range chunks(msgs) {
		if err := q.sendChunk(ctx, msgs, c[0], c[1]); err != nil {
			return fmt.Errorf("send %d messages to %s: %w", len(msgs), q.url, err)
		}
	}
	return nil
}

// chunks splits msgs into [start, end) ranges of at most 10 messages and
// 256 KiB of bodies; a single larger message gets a chunk of its own (and
// SQS's verdict on its size).
func chunks(msgs []queue.Outgoing) [][2]int {
	var out [][2]int
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && end-start < maxBatch && (end == start || size+len(msgs[end].Body) <= maxBatchBytes) {
			size += len(msgs[end].Body)
			end++
		}
		out = append(out, [2]int{start, end})
		start = end
	}
	return out
}

// sendChunk sends msgs[start:end] in one SendMessageBatch; entry IDs are
// the messages' indexes in msgs, so failures name them.
func (q *Queue) sendChunk(ctx context.Context, msgs []queue.Outgoing, start, end int) error {
	entries := make([]types.SendMessageBatchRequestEntry, 0, end-start)
	for i := start; i < end; i++ {
		entries = append(entries, types.SendMessageBatchRequestEntry{
			Id:             aws.String(strconv.Itoa(i)),
			MessageBody:    aws.String(string(msgs[i].Body)),
			DelaySeconds:   seconds(msgs[i].Delay, MaxDelay),
			MessageGroupId: messageGroupID(msgs[i].Group),
		})
	}
	out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q.url), Entries: entries})
	if err != nil {
		return fmt.Errorf("messages %d-%d: %w", start, end-1, err)
	}
	return batchFailures("message", out.Failed)
}

// batchFailures turns the failed entries of a batch call into one error
// naming each entry, or nil.
func batchFailures(what string, failed []types.BatchResultErrorEntry) error {
	if len(failed) == 0 {
		return nil
	}
	parts := make([]string, len(failed))
	for i, f := range failed {
		parts[i] = fmt.Sprintf("%s %s: %s (%s)", what, aws.ToString(f.Id), aws.ToString(f.Code), aws.ToString(f.Message))
	}
	return fmt.Errorf("%d failed: %s", len(failed), strings.Join(parts, "; "))
}

// maxGroupID is the longest MessageGroupId SQS takes.
const maxGroupID = 128

// messageGroupID is group as an SQS MessageGroupId: on a standard queue it
// names the tenant of a fair queue. SQS takes up to 128 letters, digits and
// ASCII punctuation; a group it would refuse (a principal with other
// characters, or a longer one) is sent as a digest of itself, which
// tells the same tenants apart. nil for no group.
func messageGroupID(group string) *string {
	if group == "" {
		return nil
	}
	ok := len(group) <= maxGroupID
	for i := 0; ok && i < len(group); i++ {
		ok = group[i] > ' ' && group[i] <= '~'
	}
	if ok {
		return aws.String(group)
	}
	sum := sha256.Sum256([]byte(group))
	return aws.String("sha256-" + hex.EncodeToString(sum[:]))
}

// Receive long-polls for up to max messages (at most 10, SQS's limit) for
// Options.WaitTime, and returns as soon as any arrive.
func (q *Queue) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	what := "receive from " + q.url
	if max < 1 {
		return nil, fmt.Errorf("%s: max %d, want at least 1", what, max)
	}
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(q.url),
		MaxNumberOfMessages:         int32(min(max, maxBatch)),
		WaitTimeSeconds:             seconds(q.opts.WaitTime, maxWait),
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount, types.MessageSystemAttributeNameMessageGroupId},
	}
	if q.opts.Visibility > 0 {
		in.VisibilityTimeout = seconds(q.opts.Visibility, MaxVisibility)
	}
	ds, err := q.receive(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return ds, nil
}

// receive runs one ReceiveMessage and converts what it returned.
func (q *Queue) receive(ctx context.Context, in *sqs.ReceiveMessageInput) ([]queue.Delivery, error) {
	out, err := q.client.ReceiveMessage(ctx, in)
	if err != nil {
		return nil, err
	}
	ds := make([]queue.Delivery, 0, len(out.Messages))
	for _, m := range out.Messages {
		d, err := delivery(m)
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// delivery converts a received SQS message.
func delivery(m types.Message) (queue.Delivery, error) {
	raw := m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]
	count, err := strconv.Atoi(raw)
	if err != nil {
		return queue.Delivery{}, fmt.Errorf("message %s: receive count %q: %w", aws.ToString(m.MessageId), raw, err)
	}
	return queue.Delivery{
		ID:           aws.ToString(m.MessageId),
		Receipt:      aws.ToString(m.ReceiptHandle),
		Body:         []byte(aws.ToString(m.Body)),
		ReceiveCount: count,
		Group:        m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
	}, nil
}

// Delete deletes the delivery's message. SQS accepts a receipt of a message
// already deleted, so deleting twice is not an error; a receipt SQS
// rejects as invalid is reported, wrapping queue.ErrNotFound.
func (q *Queue) Delete(ctx context.Context, receipt string) error {
	_, err := q.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(q.url), ReceiptHandle: aws.String(receipt)})
	if isReceiptGone(err) {
		return fmt.Errorf("delete from %s: %w: %w", q.url, queue.ErrNotFound, err)
	}
	if err != nil {
		return fmt.Errorf("delete from %s: %w", q.url, err)
	}
	return nil
}

// ChangeVisibility makes the delivered message visible again after d,
// rounded up to whole seconds and capped at 12 hours. It returns
// queue.ErrNotFound when SQS rejects the receipt (see the package comment
// for what SQS cannot detect).
func (q *Queue) ChangeVisibility(ctx context.Context, receipt string, d time.Duration) error {
	_, err := q.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          aws.String(q.url),
		ReceiptHandle:     aws.String(receipt),
		VisibilityTimeout: seconds(d, MaxVisibility),
	})
	if isReceiptGone(err) {
		return fmt.Errorf("change visibility in %s: %w: %w", q.url, queue.ErrNotFound, err)
	}
	if err != nil {
		return fmt.Errorf("change visibility in %s: %w", q.url, err)
	}
	return nil
}

// isReceiptGone reports whether err says a receipt names no in-flight
// message: ReceiptHandleIsInvalid, MessageNotInflight, or SQS's
// InvalidParameterValue for a receipt of a message that no longer exists.
func isReceiptGone(err error) bool {
	if err == nil {
		return false
	}
	var invalid *types.ReceiptHandleIsInvalid
	var notInflight *types.MessageNotInflight
	if errors.As(err, &invalid) || errors.As(err, &notInflight) {
		return true
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "ReceiptHandleIsInvalid", "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight":
		return true
	case "InvalidParameterValue":
		msg := strings.ToLower(ae.ErrorMessage())
		return strings.Contains(msg, "receipthandle") || strings.Contains(msg, "receipt handle")
	}
	return false
}
