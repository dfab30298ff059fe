// Package queue is the work queue port: at-least-once delivery of small
// messages with a visibility timeout, a receive count and a dead-letter
// destination. Adapters: sqlitequeue (embedded) and sqsqueue (AWS); both pass
// the conformance suite in queuetest.
package queue

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned when a receipt no longer names an in-flight
// message (it was deleted, or its visibility expired and it was received
// again under a new receipt).
var ErrNotFound = errors.New("message not found")

// Outgoing is a message to send.
type Outgoing struct {
	Body []byte
	// Delay keeps the message invisible for this long after sending.
	Delay time.Duration
	// Group names the tenant whose work the message carries (a batch's
	// principal). Queues share their consumers fairly among groups with
	// work waiting: the embedded queue serves them in turn, and an SQS
	// standard queue takes it as the MessageGroupId of a fair queue. ""
	// is a group of its own.
	Group string
}

// Delivery is a received message.
type Delivery struct {
	// ID identifies the message across deliveries.
	ID string
	// Receipt identifies this delivery; Delete and ChangeVisibility take it.
	Receipt string
	Body    []byte
	// ReceiveCount is how many times the message has been received, this
	// delivery included.
	ReceiveCount int
	// Group is the group the message was sent in (Outgoing.Group), where
	// the adapter reports it: the dead letters that SQS redrives by hand
	// keep their group.
	Group string
}

// Queue is an at-least-once queue. A received message stays invisible for the
// queue's visibility timeout and is then delivered again unless deleted. A
// message received more than the queue's maximum receive count moves to the
// dead-letter queue instead of being delivered.
type Queue interface {
	// Send enqueues messages. It may split them into several calls; on error
	// some may have been sent (duplicates are harmless to the pipeline).
	Send(ctx context.Context, msgs []Outgoing) error
	// Receive returns up to max visible messages, possibly none, without
	// blocking for long.
	Receive(ctx context.Context, max int) ([]Delivery, error)
	// Delete acknowledges a delivery. Deleting twice is not an error.
	Delete(ctx context.Context, receipt string) error
	// ChangeVisibility makes a delivered message visible again after d
	// (0: at once). It returns ErrNotFound for a deleted message; for the
	// receipt of an earlier delivery of a message received again since,
	// adapters that can tell return ErrNotFound too, but SQS cannot, so
	// callers must not rely on it.
	ChangeVisibility(ctx context.Context, receipt string, d time.Duration) error
}

// DeadLetters lists and redrives messages in the dead-letter queue.
type DeadLetters interface {
	// ListDead returns up to max dead-lettered messages without removing them.
	ListDead(ctx context.Context, max int) ([]Delivery, error)
	// Redrive moves every dead-lettered message back to the work queue with a
	// fresh receive count and returns how many moved.
	Redrive(ctx context.Context) (int, error)
}

// HiddenDeadLetters is DeadLetters whose letters can be out of sight for a
// while: SQS hides a message someone received (a list, a receive whose
// answer was lost) until its visibility timeout ends, and a redrive cannot
// move it meanwhile. The embedded queue never hides a dead letter.
type HiddenDeadLetters interface {
	// HiddenDead returns about how many dead letters are hidden now.
	HiddenDead(ctx context.Context) (int, error)
}

// Backlog reports how much work waits in a queue, for the queue-depth
// metrics. SQS publishes its own (ApproximateNumberOfMessagesVisible,
// ApproximateAgeOfOldestMessage); the embedded queue implements this.
type Backlog interface {
	// Backlog returns how many live messages are visible now and the age
	// of the oldest live message (visible, delayed or in flight; zero when
	// there is none).
	Backlog(ctx context.Context) (visible int, oldest time.Duration, err error)
}
