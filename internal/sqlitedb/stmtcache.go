package sqlitedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
)

// StmtCache keeps the prepared statements of the hot paths (a row-result
// flush, a batch's row read, a queue receive) by their text, so SQLite
// parses each once per connection instead of once per call: parsing was an
// eighth of a 100,000-row run's CPU. database/sql prepares a cached
// *sql.Stmt again on any other connection of the pool by itself, and
// Tx.StmtContext reuses the one prepared on the transaction's connection.
type StmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// NewStmtCache returns an empty cache of statements prepared on db.
func NewStmtCache(db *sql.DB) *StmtCache { return &StmtCache{db: db, m: map[string]*sql.Stmt{}} }

// Get returns query prepared on the cache's pool. Only statements whose
// text comes from a bounded set may be cached (no values spliced into the
// text), or the cache would grow without end.
func (c *StmtCache) Get(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.m[query]; ok {
		return st, nil
	}
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	c.m[query] = st
	return st, nil
}

// InTx returns st for use inside tx. Get st before beginning tx: a write
// pool has one connection, which an open transaction holds, so preparing on
// the pool inside it would wait for itself.
func InTx(ctx context.Context, tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	return tx.StmtContext(ctx, st)
}

// Close closes every cached statement. Statements left open are closed
// with their connections when the pool closes.
func (c *StmtCache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for q, st := range c.m {
		errs = append(errs, st.Close())
		delete(c.m, q)
	}
	return errors.Join(errs...)
}
