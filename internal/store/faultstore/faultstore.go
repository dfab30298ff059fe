// Package faultstore wraps a store.Store and injects failures, to prove that
// the pipeline rides out a database that is briefly unavailable, locked or
// throttled without losing a result. It is for tests and chaos runs only.
package faultstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/batchgen/batchgen/internal/store"
)

// ErrInjected is the transient failure the wrapper returns (it stands for
// SQLITE_BUSY, a dropped connection, or DynamoDB's
// ProvisionedThroughputExceeded).
var ErrInjected = errors.New("injected storage fault: throttled")

// Decider says whether the n-th call (1-based) of method should fail.
type Decider func(method string, n int) bool

// EveryNth fails every n-th call of each listed method (all methods when
// none are listed).
func EveryNth(n int, methods ...string) Decider {
	only := map[string]bool{}
	for _, m := range methods {
		only[m] = true
	}
	return func(method string, call int) bool {
		return (len(only) == 0 || only[method]) && call%n == 0
	}
}

// Store is a store.Store whose calls fail when the Decider says so; failed
// calls never reach the wrapped store.
type Store struct {
	inner  store.Store
	decide Decider

	mu       sync.Mutex
	calls    map[string]int
	injected map[string]int
}

var _ store.Store = (*Store)(nil)

// New wraps inner.
func New(inner store.Store, decide Decider) *Store {
	return &Store{inner: inner, decide: decide, calls: map[string]int{}, injected: map[string]int{}}
}

// Injected returns how many failures were injected per method.
func (s *Store) Injected() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.injected))
	for k, v := range s.injected {
		out[k] = v
	}
	return out
}

func (s *Store) fault(method string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[method]++
	if s.decide(method, s.calls[method]) {
		s.injected[method]++
		return fmt.Errorf("%s: %w", method, ErrInjected)
	}
	return nil
}

// CreateTask implements store.Store.
func (s *Store) CreateTask(ctx context.Context, t store.Task) error {
	if err := s.fault("CreateTask"); err != nil {
		return err
	}
	return s.inner.CreateTask(ctx, t)
}

// GetTask implements store.Store.
func (s *Store) GetTask(ctx context.Context, id string) (store.Task, error) {
	if err := s.fault("GetTask"); err != nil {
		return store.Task{}, err
	}
	return s.inner.GetTask(ctx, id)
}

// ListTasks implements store.Store.
func (s *Store) ListTasks(ctx context.Context, limit int) ([]store.Task, error) {
	if err := s.fault("ListTasks"); err != nil {
		return nil, err
	}
	return s.inner.ListTasks(ctx, limit)
}

// ListTasksByOwner implements store.Store.
func (s *Store) ListTasksByOwner(ctx context.Context, p store.ListTasksByOwnerParams) ([]store.Task, error) {
	if err := s.fault("ListTasksByOwner"); err != nil {
		return nil, err
	}
	return s.inner.ListTasksByOwner(ctx, p)
}

// TransitionTask implements store.Store.
func (s *Store) TransitionTask(ctx context.Context, p store.TransitionTaskParams) (store.Task, error) {
	if err := s.fault("TransitionTask"); err != nil {
		return store.Task{}, err
	}
	return s.inner.TransitionTask(ctx, p)
}

// SetTerms implements store.Store.
func (s *Store) SetTerms(ctx context.Context, taskID string, terms store.Terms) (store.Task, error) {
	if err := s.fault("SetTerms"); err != nil {
		return store.Task{}, err
	}
	return s.inner.SetTerms(ctx, taskID, terms)
}

// PutRows implements store.Store.
func (s *Store) PutRows(ctx context.Context, rows []store.Row) error {
	if err := s.fault("PutRows"); err != nil {
		return err
	}
	return s.inner.PutRows(ctx, rows)
}

// ListRows implements store.Store.
func (s *Store) ListRows(ctx context.Context, p store.ListRowsParams) ([]store.Row, error) {
	if err := s.fault("ListRows"); err != nil {
		return nil, err
	}
	return s.inner.ListRows(ctx, p)
}

// PutBatches implements store.Store.
func (s *Store) PutBatches(ctx context.Context, batches []store.Batch) error {
	if err := s.fault("PutBatches"); err != nil {
		return err
	}
	return s.inner.PutBatches(ctx, batches)
}

// GetBatch implements store.Store.
func (s *Store) GetBatch(ctx context.Context, taskID string, no int) (store.Batch, error) {
	if err := s.fault("GetBatch"); err != nil {
		return store.Batch{}, err
	}
	return s.inner.GetBatch(ctx, taskID, no)
}

// ListBatches implements store.Store.
func (s *Store) ListBatches(ctx context.Context, p store.ListBatchesParams) ([]store.Batch, error) {
	if err := s.fault("ListBatches"); err != nil {
		return nil, err
	}
	return s.inner.ListBatches(ctx, p)
}

// ListOpenBatches implements store.Store.
func (s *Store) ListOpenBatches(ctx context.Context, p store.ListOpenBatchesParams) ([]store.Batch, error) {
	if err := s.fault("ListOpenBatches"); err != nil {
		return nil, err
	}
	return s.inner.ListOpenBatches(ctx, p)
}

// ParkBatch implements store.Store.
func (s *Store) ParkBatch(ctx context.Context, p store.ParkBatchParams) error {
	if err := s.fault("ParkBatch"); err != nil {
		return err
	}
	return s.inner.ParkBatch(ctx, p)
}

// ClaimBatch implements store.Store.
func (s *Store) ClaimBatch(ctx context.Context, p store.ClaimBatchParams) (store.Batch, error) {
	if err := s.fault("ClaimBatch"); err != nil {
		return store.Batch{}, err
	}
	return s.inner.ClaimBatch(ctx, p)
}

// RenewLease implements store.Store.
func (s *Store) RenewLease(ctx context.Context, p store.RenewLeaseParams) error {
	if err := s.fault("RenewLease"); err != nil {
		return err
	}
	return s.inner.RenewLease(ctx, p)
}

// ReleaseBatch implements store.Store.
func (s *Store) ReleaseBatch(ctx context.Context, p store.ReleaseBatchParams) error {
	if err := s.fault("ReleaseBatch"); err != nil {
		return err
	}
	return s.inner.ReleaseBatch(ctx, p)
}

// TouchBatch implements store.Store.
func (s *Store) TouchBatch(ctx context.Context, p store.TouchBatchParams) error {
	if err := s.fault("TouchBatch"); err != nil {
		return err
	}
	return s.inner.TouchBatch(ctx, p)
}

// SaveRowResults implements store.Store.
func (s *Store) SaveRowResults(ctx context.Context, p store.SaveRowResultsParams) (store.SaveRowResultsResult, error) {
	if err := s.fault("SaveRowResults"); err != nil {
		return store.SaveRowResultsResult{}, err
	}
	return s.inner.SaveRowResults(ctx, p)
}

// FinishBatch implements store.Store.
func (s *Store) FinishBatch(ctx context.Context, p store.FinishBatchParams) (store.Task, error) {
	if err := s.fault("FinishBatch"); err != nil {
		return store.Task{}, err
	}
	return s.inner.FinishBatch(ctx, p)
}
