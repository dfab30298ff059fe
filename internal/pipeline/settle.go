package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/queue"
)

// SettleAction is what becomes of a message the generator has processed.
type SettleAction int

const (
	// SettleDelete removes the message: the batch is done, its task is
	// over, or another worker owns the batch.
	SettleDelete SettleAction = iota + 1
	// SettleRetry makes the message visible again after Settlement.Delay:
	// the batch was released with rows still pending (the graded backoff),
	// or handling it failed transiently.
	SettleRetry
	// SettleDeadLetter leaves the message invisible for the rest of its
	// visibility timeout; after the queue's maximum receive count the queue
	// moves it to the dead-letter queue. For messages that can never be
	// processed (*PoisonError).
	SettleDeadLetter
	// SettleResend sends a fresh copy of the message after Settlement.Delay
	// and removes the received one, so the batch starts again from a receive
	// count of zero: for a batch handed back at the runtime's deadline after
	// it made progress, which must not walk healthy work toward the
	// dead-letter queue one deadline at a time.
	SettleResend
)

// String names the action in logs and test failures.
func (a SettleAction) String() string {
	switch a {
	case SettleDelete:
		return "delete"
	case SettleRetry:
		return "retry"
	case SettleDeadLetter:
		return "dead-letter"
	case SettleResend:
		return "resend"
	}
	return fmt.Sprintf("SettleAction(%d)", int(a))
}

// Settlement is the one decision of what to do with a processed message.
// It is data so that each runtime carries it out with its own queue
// (LocalWorkers and the Lambda handler through Apply) while the decision
// itself is made only by Settle.
type Settlement struct {
	Action SettleAction
	// Delay is when a SettleRetry message comes back; 0 is at once.
	Delay time.Duration
	// Err is the failure behind a retry or a dead-letter, for the log; nil
	// for a delete and for a released batch.
	Err error
}

// Settle decides what becomes of the message whose processing came to out:
//
//   - Ack: delete it.
//   - Err is a *PoisonError: dead-letter it.
//   - Err is anything else: retry after the generator's ErrorDelay.
//   - HandedBack with Progress: the batch ran out of time after finishing
//     rows; resend it at once (a fresh message, receive count reset).
//   - HandedBack without progress but QuotaStarved: resend it at once too.
//     The batch made no call: its rows waited for the quota (busy with
//     other batches) until the time came. Using up a receive would walk a
//     healthy batch toward the dead-letter queue for the quota's sake; it
//     is sound to skip because nothing was tried that could fail, and a
//     limiter that fails on its own is not starvation.
//   - Parked: the batch's rows wait on provider batches that run for
//     hours; resend it after out.RetryAfter (a poll's wait), a fresh
//     message each time, for a day's wait must not walk it toward the
//     dead-letter queue.
//   - HandedBack without progress: retry at once, using up a receive, so a
//     batch that cannot finish a row within a delivery still dead-letters.
//   - otherwise: the batch was released; retry after out.RetryAfter, the
//     graded backoff.
func (g *Generator) Settle(out Outcome) Settlement {
	return settle(out, g.cfg.ErrorDelay)
}

func settle(out Outcome, errorDelay time.Duration) Settlement {
	var poison *PoisonError
	switch {
	case out.Ack:
		return Settlement{Action: SettleDelete}
	case errors.As(out.Err, &poison):
		return Settlement{Action: SettleDeadLetter, Err: out.Err}
	case out.Err != nil:
		return Settlement{Action: SettleRetry, Delay: errorDelay, Err: out.Err}
	case out.HandedBack && (out.Progress > 0 || out.QuotaStarved):
		return Settlement{Action: SettleResend}
	case out.Parked:
		return Settlement{Action: SettleResend, Delay: out.RetryAfter}
	default:
		return Settlement{Action: SettleRetry, Delay: out.RetryAfter}
	}
}

// Message is a received message as Apply needs it: the receipt to act on
// and the body, to send again when the receipt has gone stale.
type Message struct {
	ID           string
	Receipt      string
	Body         []byte
	ReceiveCount int
}

// again is m sent again after delay, in the group its body names.
func (m Message) again(delay time.Duration) queue.Outgoing {
	if bm, err := DecodeBatchMessage(m.Body); err == nil {
		return queue.Outgoing{Body: m.Body, Delay: delay, Group: bm.Owner}
	}
	return queue.Outgoing{Body: m.Body, Delay: delay}
}

// Apply carries out s on m through q, except for the deletion itself: it
// reports whether m is to be removed, which the caller does its own way
// (LocalWorkers deletes it; the Lambda handler leaves it out of the batch
// item failures, so the event source mapping deletes it). Failures are
// logged to log, not returned: whatever goes wrong, the message comes back
// at the latest when its visibility ends, and the sweeper re-enqueues a
// batch whose message was lost.
//
// A retry whose visibility change fails (the receipt went stale because the
// visibility expired while the batch ran, and another worker may have
// received the message and deleted it, seeing the batch owned) sends a fresh
// copy with the delay instead and has the stale one removed, so the batch is
// never left without a message. Duplicates are harmless: claims are
// conditional.
func (s Settlement) Apply(ctx context.Context, q queue.Queue, m Message, log *slog.Logger) (remove bool) {
	log = log.With("message_id", m.ID, "receive_count", m.ReceiveCount)
	if bm, err := DecodeBatchMessage(m.Body); err == nil {
		ctx = logging.With(ctx, logging.TaskID, bm.TaskID, logging.BatchNo, bm.BatchNo)
	}
	switch s.Action {
	case SettleDelete:
		return true
	case SettleDeadLetter:
		log.ErrorContext(ctx, "poison message; it will be dead-lettered", "body", truncate(string(m.Body), 300), "error", s.Err)
		return false
	}
	if s.Action == SettleResend {
		if err := q.Send(ctx, []queue.Outgoing{m.again(s.Delay)}); err != nil {
			// Fall back to the normal retry: it uses up a receive, but the
			// batch is not left without a message.
			log.WarnContext(ctx, "resend handed-back message failed; retrying it instead", "error", err)
			s = Settlement{Action: SettleRetry, Delay: s.Delay}
		} else {
			return true
		}
	}
	if s.Err != nil {
		log.WarnContext(ctx, "message failed; will retry", "retry_in", s.Delay, "error", s.Err)
	}
	err := q.ChangeVisibility(ctx, m.Receipt, s.Delay)
	if err == nil {
		return false
	}
	if !errors.Is(err, queue.ErrNotFound) {
		log.WarnContext(ctx, "change visibility failed; sending a fresh message", "error", err)
	}
	if err := q.Send(ctx, []queue.Outgoing{m.again(s.Delay)}); err != nil {
		log.ErrorContext(ctx, "re-send message failed; it comes back when its visibility ends, or the sweeper re-enqueues the batch", "error", err)
		return false
	}
	return true
}
