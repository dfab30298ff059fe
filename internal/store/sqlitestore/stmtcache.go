package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
)

// stmtCache keeps the prepared statements of the hot paths (a row-result
// flush, a batch's row read) by their text, so SQLite parses each once per
// connection instead of once per call: parsing was an eighth of a
// 100,000-row run's CPU. database/sql prepares a cached *sql.Stmt again on
// any other connection of the pool by itself, and Tx.StmtContext reuses the
// one prepared on the transaction's connection.
type stmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func newStmtCache(db *sql.DB) *stmtCache { return &stmtCache{db: db, m: map[string]*sql.Stmt{}} }

// get returns query prepared on the cache's pool. Only statements whose
// text comes from a bounded set may be cached (no values spliced into the
// text), or the cache would grow without end.
func (c *stmtCache) get(ctx context.Context, query string) (*sql.Stmt, error) {
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

// inTx returns st for use inside tx. Get st before beginning tx: the write
// pool has one connection, which an open transaction holds, so preparing on
// the pool inside it would wait for itself.
func inTx(ctx context.Context, tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	return tx.StmtContext(ctx, st)
}

// close closes every cached statement.
func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for q, st := range c.m {
		errs = append(errs, st.Close())
		delete(c.m, q)
	}
	return errors.Join(errs...)
}
