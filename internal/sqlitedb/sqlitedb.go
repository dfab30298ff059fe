// Package sqlitedb holds what the components sharing one SQLite database
// (the task store and the queue live in one file) do alike: their embedded
// migrations, each component with its own version in a schema_version
// table, and the conditional statements whose "no row matched" is an
// answer, not a success.
package sqlitedb

import (
	"context"
	"database/sql"
)

// Execer runs a statement: a *sql.DB or a *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Exec runs query and returns how many rows it changed, for the callers
// whose WHERE is a condition (a fence, a receipt): zero rows is then the
// answer that the condition failed, and the caller names it.
func Exec(ctx context.Context, db Execer, query string, args ...any) (int64, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Queryer runs a query: a *sql.DB or a *sql.Tx.
type Queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Scanner reads one result row: a *sql.Row or a *sql.Rows.
type Scanner interface {
	Scan(dest ...any) error
}

// QueryAll runs query and returns every row it returns as scan reads it,
// in order; nil when there is none. The caller wraps the error with what
// it was listing.
func QueryAll[T any](ctx context.Context, db Queryer, scan func(Scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
