// Package generatorfn is the generator Lambda: SQS batch messages from the
// work queue are claimed and their rows generated through
// pipeline.Generator, with partial batch responses. The package is the
// whole function: its handler (generatorfn.go) depends on the ports and
// aws-lambda-go/events only (TestDependencyEdges holds it to that), and New
// (wire.go) builds it from the function's environment, its providers and
// AWS clients for functions/generator.
package generatorfn

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
)

// Defaults of Handler.
const (
	// DefaultVisibility matches the work queue's VisibilityTimeout in
	// template.yaml.
	DefaultVisibility = 30 * time.Minute
	// DefaultHeadroom is kept free before the invocation's deadline: rows
	// in flight are stopped, their batch released and the message reported
	// for retry before Lambda kills the invocation.
	DefaultHeadroom = 15 * time.Second
)

// generatorMetrics are reported by every invocation, zeros included.
var generatorMetrics = []string{
	metrics.RowsSucceeded, metrics.RowsFailed, metrics.RowsCached, metrics.ModelCalls, metrics.RateLimited,
	metrics.BatchesReleased, metrics.MessagesFailed, metrics.PoisonMessages,
}

// Handler handles SQS batch messages from the work queue's event source
// mapping (ReportBatchItemFailures on). The records of one event are
// processed concurrently through one shared *pipeline.Generator, whose
// Concurrency bounds the model calls of the whole instance. Each outcome is
// settled as pipeline.Generator.Settle decides, the same as in
// pipeline.LocalWorkers; the settlement maps onto the partial batch
// response:
//
//   - SettleDelete: not a batch item failure; Lambda deletes the message.
//   - SettleRetry: the message's visibility is set to the delay and it is
//     reported as a batch item failure, so it comes back after the delay.
//     If its receipt went stale, a fresh copy is sent instead and the old
//     one is left for Lambda to delete (see pipeline.Settlement.Apply).
//   - SettleResend (a batch handed back at the invocation's deadline after
//     finishing rows): a fresh copy is sent and the received message is
//     not a batch item failure, so Lambda deletes it and the batch's
//     receive count starts again; healthy work that outlasts one
//     invocation never reaches the dead-letter queue.
//   - SettleDeadLetter: a batch item failure left invisible for the
//     queue's whole visibility timeout, until the redrive policy moves it
//     to the dead-letter queue.
type Handler struct {
	Generator *pipeline.Generator
	// Queue changes message visibility; receipts are the records'
	// receipt handles.
	Queue queue.Queue
	// Visibility is how long each lease renewal keeps the message
	// invisible. Defaults to DefaultVisibility.
	Visibility time.Duration
	// Headroom is the time kept before the invocation's deadline. Defaults
	// to DefaultHeadroom; when less than twice Headroom remains, half of
	// what remains is kept instead.
	Headroom time.Duration
	// Counter, when non-nil, accumulates this instance's metrics; give it
	// to the generator as its GeneratorConfig.Metrics too. It is flushed to
	// Metrics at the end of every invocation.
	Counter *metrics.Counter
	Metrics *metrics.Emitter
	Logger  *slog.Logger
	// Idle, when set, is called once an invocation's records are all
	// settled: the instance may be frozen until the next invocation, so
	// what it holds for later (the shared quota's seconds leased ahead)
	// is given back rather than left unused by the fleet.
	Idle func(ctx context.Context)
}

// NewCounter returns a Counter that reports the generator's
// metrics, zeros included.
func NewCounter() *metrics.Counter { return metrics.NewCounter(generatorMetrics...) }

// Handle processes one SQS event and reports the messages to keep.
// It returns an error never: every per-message failure is a batch item
// failure, so one bad message cannot make Lambda retry the others.
func (h *Handler) Handle(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	work, stopAt, cancel := h.workContext(ctx)
	defer cancel()
	failed := make([]bool, len(ev.Records))
	var wg sync.WaitGroup
	for i := range ev.Records {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failed[i] = !h.handleRecord(ctx, work, stopAt, ev.Records[i])
		}()
	}
	wg.Wait()
	if h.Idle != nil {
		h.Idle(ctx)
	}
	var resp events.SQSEventResponse
	for i, f := range failed {
		if f {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: ev.Records[i].MessageId})
		}
	}
	if h.Counter != nil && h.Metrics != nil {
		if err := h.Counter.Flush(h.Metrics, nil); err != nil {
			logger(h.Logger).WarnContext(ctx, "write metrics failed", "error", err)
		}
	}
	return resp, nil
}

// workContext is the context of the invocation's work, which ends
// Headroom before ctx's deadline while there is still time to release
// batches and change visibilities, and the time after which no row starts:
// a call started later could not finish and be saved before the work ends,
// so it would be paid for and lost (pipeline.Generator.InvocationEnd).
func (h *Handler) workContext(ctx context.Context) (context.Context, time.Time, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		work, cancel := context.WithCancel(ctx)
		return work, time.Time{}, cancel
	}
	headroom := h.Headroom
	if headroom <= 0 {
		headroom = DefaultHeadroom
	}
	remaining := time.Until(deadline)
	end := h.Generator.InvocationEnd(remaining, headroom)
	work, cancel := context.WithDeadline(ctx, deadline.Add(end.Work-remaining))
	return work, end.StopStarting, cancel
}

// handleRecord runs one message and reports whether Lambda may delete it.
func (h *Handler) handleRecord(ctx, work context.Context, stopAt time.Time, rec events.SQSMessage) bool {
	receiveCount, _ := strconv.Atoi(rec.Attributes["ApproximateReceiveCount"])
	visibility := h.Visibility
	if visibility <= 0 {
		visibility = DefaultVisibility
	}
	out := h.Generator.Process(work, pipeline.Delivery{
		Body:           []byte(rec.Body),
		ReceiveCount:   receiveCount,
		StopStartingAt: stopAt,
		KeepAlive: func(ctx context.Context) error {
			return h.Queue.ChangeVisibility(ctx, rec.ReceiptHandle, visibility)
		},
	})
	// The outcome is persisted; settle the message even though the work
	// context may be over. Not under the invocation's deadline either: the
	// calls in flight at the stop are saved on a detached context and may
	// use up the headroom (a slow store), and a settle cut short then leaves
	// a healthy batch invisible for the whole visibility timeout. Past the
	// real deadline Lambda ends the invocation anyway; until then, settling
	// is always worth trying (LocalWorkers settles the same way).
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	st := h.Generator.Settle(out)
	if h.Counter != nil {
		pipeline.RecordSettlement(h.Counter, st)
	}
	m := pipeline.Message{ID: rec.MessageId, Receipt: rec.ReceiptHandle, Body: []byte(rec.Body), ReceiveCount: receiveCount}
	return st.Apply(actx, h.Queue, m, logger(h.Logger))
}

// logger returns l, or a logger that drops everything when l is nil.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
