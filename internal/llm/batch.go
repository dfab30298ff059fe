package llm

import (
	"context"
	"time"
)

// The provider batch port: the rows of a task sent as one job that the
// provider answers within hours at about half the online price (OpenAI's
// Batch API, Anthropic's Message Batches, Bedrock's model invocation jobs).
// Answers come back in no particular order and are matched to their
// requests by the caller's own ids, never by position.

// BatchLine is one request of a provider batch under the caller's id.
type BatchLine struct {
	// ID is the caller's id for the line (a row's); unique in the batch.
	ID  string
	Req Request
}

// BatchState is where a provider batch is.
type BatchState string

// Batch states. Running covers the provider's validating, in progress,
// finalizing and cancelling; the others are final.
const (
	BatchRunning   BatchState = "running"
	BatchDone      BatchState = "done"
	BatchFailed    BatchState = "failed"
	BatchExpired   BatchState = "expired"
	BatchCancelled BatchState = "cancelled"
)

// Final reports whether a batch in state s has all the results it will
// have.
func (s BatchState) Final() bool { return s != BatchRunning }

// BatchStatus is what the provider reports of a batch.
type BatchStatus struct {
	ID    string
	State BatchState
	// Total, Completed and Failed count its lines as the provider does:
	// answered, and failed (answered with an error, or left unfinished by
	// an expiry or a cancel).
	Total, Completed, Failed int
	// Error says why a batch failed as a whole (its file was refused), and
	// ErrorClass how to take it: ClassRateLimited for a queue limit (the
	// batch, smaller or later, may be sent again: nothing was billed).
	Error      string
	ErrorClass ErrorClass
}

// BatchResult is one line's outcome: an answer, or an error classed as an
// online call's would be. A line the batch left unfinished (expired,
// cancelled) has an error of class ClassBatchUnfinished.
type BatchResult struct {
	ID       string
	Response Response
	Err      *Error
}

// ClassBatchUnfinished marks a line a provider batch did not run (it
// expired or was cancelled first): retryable, in the next batch or online,
// and nothing was billed for it.
const ClassBatchUnfinished ErrorClass = "batch_unfinished"

// BatchLimits are the most one provider batch may hold: a caller splits
// larger work into several.
type BatchLimits struct {
	// Lines is the most requests of one batch; Bytes the most bytes of its
	// requests as sent.
	Lines int
	Bytes int64
	// MinLines is the fewest requests a batch may hold (Bedrock's jobs
	// take at least 100); 0 for none. Fewer go online.
	MinLines int
}

// BatchQuery describes a batch that may have been sent, for FindBatch.
type BatchQuery struct {
	// Key is the caller's id of the batch (SubmitBatch's).
	Key string
	// Lines is how many lines it had.
	Lines int
	// Since is when its first submit began: the batch cannot be older.
	Since time.Time
	// Taken are the provider ids of batches known to be other ones.
	Taken map[string]bool
}

// FindWindow is how long after BatchQuery.Since a batch may have been
// created by a submit begun then (its retries and timeouts included), and
// how far the provider's clock may be behind.
const FindWindow = 15 * time.Minute

// BatchProvider runs provider batches. Implementations are adapters of
// providers that sell them.
type BatchProvider interface {
	// BatchLimits are the provider's limits of one batch.
	BatchLimits() BatchLimits
	// SubmitBatch sends lines as one batch under key, the caller's id of
	// it, and returns the provider's id. A submit whose answer was lost
	// (a timeout, a server error) may still have created the batch:
	// FindBatch tells.
	SubmitBatch(ctx context.Context, key string, lines []BatchLine) (string, error)
	// FindBatch returns the id of the batch sent as q describes, "" when
	// the provider has none: the caller sends its lines again only then,
	// so that a batch is never paid twice.
	FindBatch(ctx context.Context, q BatchQuery) (string, error)
	// BatchStatus reports batch id.
	BatchStatus(ctx context.Context, id string) (BatchStatus, error)
	// BatchResults returns the outcome of every line of a final batch
	// (answered, failed, or unfinished), in no particular order.
	BatchResults(ctx context.Context, id string) ([]BatchResult, error)
	// CancelBatch asks the provider to stop batch id; the lines it
	// finished keep their answers.
	CancelBatch(ctx context.Context, id string) error
}
