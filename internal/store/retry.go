package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
)

// The store's one retry layer, and its budget.
//
// A write that failed for a reason other than a verdict (ErrConflict,
// ErrNotFound) is tried again by Retry, up to RetryAttempts times in all,
// backing off from RetryFirstDelay, doubling: 50 ms, 100 ms, ... 800 ms,
// 1.55 s of waiting at most. Callers use it for the writes whose loss
// would waste paid work: a batch's row results and its finish.
//
// Below it, each adapter makes single attempts. The only retries under it
// are the AWS SDK's own, which belong to one call rather than to the store:
// a throttled, 5xx or dropped DynamoDB request, or a single-item write
// that met a transaction in progress, was rejected without effect, and
// the SDK re-sends it with the same idempotency token (a
// TransactWriteItems that did commit before its answer was lost is then
// not applied twice). A transaction cancelled by contention is not among
// them: dynamostore returns it, and Retry sends it again as a new request,
// which is safe because a cancelled transaction changed nothing. SQLite
// waits on a lock inside the call, up to its busy timeout.
const (
	// RetryAttempts is how many times Retry calls its function at most.
	RetryAttempts = 6
	// RetryFirstDelay is the wait after the first failure; each later one
	// doubles it.
	RetryFirstDelay = 50 * time.Millisecond
)

// Retry runs write until it succeeds, returns a verdict (ErrConflict,
// ErrNotFound), ctx ends, or RetryAttempts calls have failed; it returns
// the last error. clk times the waits (a fake clock in tests); log, when
// not nil, records each failure that is tried again.
func Retry(ctx context.Context, clk clock.Clock, log *slog.Logger, write func() error) error {
	delay := RetryFirstDelay
	for try := 1; ; try++ {
		err := write()
		if err == nil || errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
			return err
		}
		if try == RetryAttempts {
			return fmt.Errorf("%w (failed %d times)", err, try)
		}
		if log != nil {
			log.WarnContext(ctx, "store write failed; retrying", "try", try, "delay", delay, "error", err)
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-clk.After(delay):
		}
		delay *= 2
	}
}
