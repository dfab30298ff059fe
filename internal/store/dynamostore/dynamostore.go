// Package dynamostore implements store.Store and store.Cache on one DynamoDB
// table, for the AWS runtime. The table (keys, indexes, TTL) is declared in
// template.yaml; keys.go describes the item layout.
//
// # Conditional writes
//
// Every state change that two workers could race on is one conditional
// write: ClaimBatch, RenewLease, ReleaseBatch and TransitionTask are one
// UpdateItem each; SaveRowResults (fenced on the batch) and FinishBatch (batch
// DONE plus task counters) are one TransactWriteItems each. A failed
// condition changes nothing and comes back as store.ErrConflict, or
// store.ErrNotFound when the item is missing (told apart from the item the
// failed write returns with ReturnValuesOnConditionCheckFailure, not by a
// second read).
//
// # Retries
//
// Each method makes one attempt; store.Retry is the one retry layer above
// it, and its comment states the budget. Under it stays the SDK's standard
// retryer, which belongs to the call: throttling (ProvisionedThroughput
// Exceeded, ThrottlingException, RequestLimitExceeded), 5xx and connection
// errors, and for single-item writes TransactionConflictException (the
// item met a transaction in progress), all rejected without effect, are
// re-sent up to the client's RetryMaxAttempts (DynamoDB's default: 4
// attempts). TransactWriteItems carries an idempotency token that the SDK
// keeps across those re-sends, so a transaction that committed before a
// lost response is not applied twice. A transaction cancelled by
// contention is returned, not re-sent under the same token: store.Retry
// sends it again as a new request, safe because it changed nothing. A
// plain conditional UpdateItem has no token of DynamoDB's: if the SDK
// re-sends one that had in fact committed, the retry fails its condition.
// ClaimBatch writes a token of its own on the batch and takes a failed
// condition that finds it as its answer; the other writes of a claimed
// batch then see ErrConflict, which the pipeline treats as a lost batch
// (the lease then expires and the batch is redone, keeping saved rows).
//
// # Consistency
//
// Reads of the table (GetTask, GetBatch, ListBatches, ListRows, the read
// after FinishBatch) are strongly consistent. ListTasks and ListOpenBatches
// read global secondary indexes, which are eventually consistent (typically
// well under a second behind): a task created a moment ago may be missing
// from ListTasks, and the sweeper may see a batch's previous state; both
// callers tolerate that.
//
// # Large rows
//
// A row item holds the input cells. A row whose item would exceed
// Options.OverflowAbove keeps its cells in Options.Overflow (S3) under
// overflow/<task>/<row>.json and only a pointer in the item; ListRows
// resolves it. Without Overflow, PutRows refuses rows over DynamoDB's 400 KB
// item limit with an error naming the row and its size.
//
// # Expiry
//
// The table's TTL attribute is expires_at (epoch seconds), and every item
// carries it. A task's items are written with the task's horizon,
// CreatedAt + Options.MaxTaskAge + Options.ResultTTL: the task item by
// CreateTask, its batches and rows by PutBatches and PutRows (which read the
// task anyway, to refuse orphans). Stamping them when the task finishes
// instead would cost one more write per item (200,000 for a large sheet).
// TransitionTask to a final state then brings the task item forward to
// FinishedAt + ResultTTL, which for a task finished within MaxTaskAge is
// before its rows and batches expire, so a task that can still be read can
// always be exported again. Cache entries get CreatedAt + Options.CacheTTL.
package dynamostore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/store"
)

var (
	_ store.Store = (*Store)(nil)
	_ store.Cache = (*Store)(nil)
)

// Defaults of Options.
const (
	// DefaultOverflowAbove leaves about 100 KB of a 400 KB item for the
	// row's result (output and error), which SaveRowResults adds later.
	DefaultOverflowAbove = 300 << 10
	// DefaultWriteConcurrency is how many writes PutRows and PutBatches
	// keep in flight (transactions of up to 100 rows, or overflow rows one
	// by one).
	DefaultWriteConcurrency = 16
	// DefaultResultTTL keeps a finished task as long as template.yaml
	// keeps its result file (ResultRetentionDays).
	DefaultResultTTL = 30 * 24 * time.Hour
	// DefaultCacheTTL is how long a cached model output is kept.
	DefaultCacheTTL = store.DefaultCacheTTL
	// DefaultMaxTaskAge is as long as a dead-lettered work message is
	// kept (the DLQ's 14-day retention in template.yaml): a task still
	// unfinished after that can no longer be completed from its messages.
	DefaultMaxTaskAge = 14 * 24 * time.Hour
)

// Options tunes a Store. The zero value is ready to use.
type Options struct {
	// Overflow, when set, holds the cells of rows too large for one item
	// (see OverflowAbove). Without it such rows are refused.
	Overflow blob.Store
	// OverflowAbove is the estimated item size in bytes above which a row's
	// cells go to Overflow. Defaults to DefaultOverflowAbove; at most
	// DynamoDB's 400 KB limit.
	OverflowAbove int
	// WriteConcurrency bounds the writes in flight in one PutRows or
	// PutBatches call. Defaults to DefaultWriteConcurrency.
	WriteConcurrency int
	// ResultTTL is how long after reaching a final state a task item
	// expires. Defaults to DefaultResultTTL; negative: never.
	ResultTTL time.Duration
	// CacheTTL is how long a cache entry lives. Defaults to
	// DefaultCacheTTL; negative: forever.
	CacheTTL time.Duration
	// MaxTaskAge is how long a task may run before ResultTTL starts
	// counting anyway: every item of a task expires at the latest
	// CreatedAt + MaxTaskAge + ResultTTL (see Expiry in the package
	// comment). Defaults to DefaultMaxTaskAge. Ignored when ResultTTL is
	// negative.
	MaxTaskAge time.Duration
	// Clock stamps cache entries and paces transaction retries. Defaults
	// to the wall clock.
	Clock clock.Clock
}

// Store is a store.Store and store.Cache on one DynamoDB table. Its methods
// are safe for concurrent use.
type Store struct {
	db    *dynamodb.Client
	table string
	opts  Options
}

// New returns a Store on table. The client's retryer handles throttling;
// see the package comment.
func New(client *dynamodb.Client, table string, opts Options) *Store {
	if opts.OverflowAbove <= 0 || opts.OverflowAbove > maxItemSize {
		opts.OverflowAbove = DefaultOverflowAbove
	}
	if opts.WriteConcurrency <= 0 {
		opts.WriteConcurrency = DefaultWriteConcurrency
	}
	if opts.ResultTTL == 0 {
		opts.ResultTTL = DefaultResultTTL
	}
	if opts.MaxTaskAge <= 0 {
		opts.MaxTaskAge = DefaultMaxTaskAge
	}
	if opts.CacheTTL == 0 {
		opts.CacheTTL = DefaultCacheTTL
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	return &Store{db: client, table: table, opts: opts}
}

// Table returns the table name, for messages and tests.
func (s *Store) Table() string { return s.table }

// retryConflicts adds TransactionConflictException to the retryable errors
// of one call: a single-item write that met an ongoing transaction was
// rejected without effect.
func retryConflicts(o *dynamodb.Options) {
	o.Retryer = retry.AddWithErrorCodes(o.Retryer, (&types.TransactionConflictException{}).ErrorCode())
}

// transact runs one TransactWriteItems. A transaction cancelled only by
// contention or throttling comes back as it is, for store.Retry to send
// again as a new request (see the package comment).
func (s *Store) transact(ctx context.Context, items []types.TransactWriteItem) error {
	_, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	return err
}

// Cancellation reason codes of TransactionCanceledException.
const (
	reasonNone      = "None"
	reasonCondition = "ConditionalCheckFailed"
)

// cancelReasons returns the reasons of a cancelled transaction.
func cancelReasons(err error) ([]types.CancellationReason, bool) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return nil, false
	}
	return tce.CancellationReasons, true
}

// reasonCode returns the code of reasons[i], or "" when there is none.
func reasonCode(reasons []types.CancellationReason, i int) string {
	if i >= len(reasons) || reasons[i].Code == nil {
		return ""
	}
	return *reasons[i].Code
}

// updateIf is the store's one conditional UpdateItem: u applied to item k
// if cond (built with u's expression) holds, retried on transaction
// conflicts. It returns the item as updated when returnNew asks for it;
// when cond fails, the error is one conditionFailed reads, carrying the
// item as it was.
func (s *Store) updateIf(ctx context.Context, k map[string]types.AttributeValue, cond string, u *update, returnNew bool) (map[string]types.AttributeValue, error) {
	in := &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		ConditionExpression:                 aws.String(cond),
		UpdateExpression:                    aws.String(u.String()),
		ExpressionAttributeNames:            u.e.attrNames(),
		ExpressionAttributeValues:           u.e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if returnNew {
		in.ReturnValues = types.ReturnValueAllNew
	}
	out, err := s.db.UpdateItem(ctx, in, retryConflicts)
	if err != nil {
		return nil, err
	}
	return out.Attributes, nil
}

// conditionFailed reports whether err is a failed condition of a single-item
// write, and returns the item as it was (nil when it did not exist), which
// the write asked for with ReturnValuesOnConditionCheckFailure ALL_OLD.
func conditionFailed(err error) (old map[string]types.AttributeValue, ok bool) {
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return nil, false
	}
	return ccf.Item, true
}

// carriesToken reports whether the item old, as a failed condition returned
// it, holds token in attr: the write that failed is the SDK's re-sending of
// one already applied whose answer was lost (ClaimBatch, TransitionTask).
func carriesToken(old map[string]types.AttributeValue, attr, token string) bool {
	mine, ok := old[attr].(*types.AttributeValueMemberS)
	return ok && mine.Value == token
}

// notFoundOrConflict returns ErrNotFound when old is nil (the item did not
// exist) and ErrConflict otherwise.
func notFoundOrConflict(old map[string]types.AttributeValue) error {
	if len(old) == 0 {
		return store.ErrNotFound
	}
	return store.ErrConflict
}

// forEach runs fn on every index of n items with at most limit calls in
// flight, and returns the first error; after an error no new calls start.
func forEach(ctx context.Context, n, limit int, fn func(ctx context.Context, i int) error) error {
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		next  = make(chan int)
	)
	for range min(limit, n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					once.Do(func() {
						first = err
						cancel(err)
					})
				}
			}
		})
	}
	fed := 0
feed:
	for ; fed < n; fed++ {
		select {
		case next <- fed:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	switch {
	case first != nil:
		return first
	case fed < n:
		return context.Cause(ctx)
	}
	return nil
}

// queryPages runs in page by page and calls keep with each item, until the
// last page or, when limit > 0, until keep has kept limit items (it says
// whether it kept one). With a limit, each page asks for what is still
// wanted plus slack (items keep may pass over), at most maxPage.
func (s *Store) queryPages(ctx context.Context, in *dynamodb.QueryInput, limit, slack int, maxPage int, keep func(map[string]types.AttributeValue) (bool, error)) error {
	kept := 0
	for {
		if limit > 0 {
			in.Limit = aws.Int32(int32(min(limit-kept+slack, maxPage)))
		}
		page, err := s.db.Query(ctx, in)
		if err != nil {
			return err
		}
		for _, item := range page.Items {
			ok, err := keep(item)
			if err != nil {
				return err
			}
			if ok {
				kept++
			}
		}
		if len(page.LastEvaluatedKey) == 0 || limit > 0 && kept >= limit {
			return nil
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
	}
}
