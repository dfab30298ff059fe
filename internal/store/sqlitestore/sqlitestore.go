// Package sqlitestore implements store.Store and store.Cache on one SQLite
// file, for the embedded runtime (batchgen run, batchgen serve). It uses the
// pure-Go modernc.org/sqlite driver so the binary needs no cgo.
//
// # Connections
//
// A Store holds two pools on the same file, in WAL mode:
//
//   - a write pool of exactly one connection. Every write of this process,
//     the queue's included (see DB), goes through it, so goroutines queue up
//     in database/sql instead of spinning in SQLite's busy handler: no
//     SQLITE_BUSY storms however many workers run, with or without -race.
//     Transactions begin IMMEDIATE (_txlock=immediate): they take the write
//     lock up front, so a writer in another process makes them wait in
//     busy_timeout rather than fail when a read would be upgraded.
//   - a read pool of query_only connections (Options.ReadConns). In WAL mode
//     readers never block the writer nor wait for it, so an export paging
//     through 200,000 rows does not stall the workers.
//
// Every conditional method is one UPDATE ... WHERE ... (RETURNING) or one
// short transaction on the write connection, so a second process opening the
// same file (a rerun after a kill) is serialised by SQLite's own lock, and a
// killed process's WAL is recovered by the next open.
package sqlitestore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/sqlitedb"
	"github.com/batchgen/batchgen/internal/store"
)

var (
	_ store.Store = (*Store)(nil)
	_ store.Cache = (*Store)(nil)
)

//go:embed migrations/*.sql
var migrations embed.FS

// component names this package's row in the shared schema_version table;
// the queue on the same file keeps its own.
const component = "sqlitestore"

// Options tunes Open. The zero value is ready to use.
type Options struct {
	// BusyTimeout is how long a statement waits for another process's write
	// lock before failing with SQLITE_BUSY. Defaults to 10s.
	BusyTimeout time.Duration
	// ReadConns caps the pool of read-only connections. Defaults to 4.
	ReadConns int
	// Clock stamps cache entries. Defaults to clock.Real{}.
	Clock clock.Clock
	// CacheTTL is how long a cache entry is reused. Defaults to
	// store.DefaultCacheTTL; negative: forever.
	CacheTTL time.Duration
}

// Store is the SQLite task store. Its methods are safe for concurrent use.
type Store struct {
	path  string
	write *sql.DB
	read  *sql.DB
	clock clock.Clock
	// cacheTTL is Options.CacheTTL with its default; negative: forever.
	cacheTTL time.Duration
	// writeStmts and readStmts hold the hot paths' prepared statements,
	// one cache per pool.
	writeStmts, readStmts *sqlitedb.StmtCache
}

// Open opens, or creates, the database at path and migrates its schema. path
// is a file name; in-memory databases are refused because the two pools
// would see two different databases.
func Open(path string, opts Options) (*Store, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("open task store %q: want a plain file name (no \":memory:\", \"file:\" URI or '?')", path)
	}
	if opts.BusyTimeout < 0 || opts.ReadConns < 0 {
		return nil, fmt.Errorf("open task store %q: negative BusyTimeout or ReadConns", path)
	}
	if opts.BusyTimeout == 0 {
		opts.BusyTimeout = 10 * time.Second
	}
	if opts.ReadConns == 0 {
		opts.ReadConns = 4
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.CacheTTL == 0 {
		opts.CacheTTL = store.DefaultCacheTTL
	}
	// A new database is its owner's alone (SQLite gives its -wal and -shm
	// files the database's mode): it holds every task's rows and answers.
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
		f.Close()
	}
	common := fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)",
		opts.BusyTimeout.Milliseconds())

	write, err := sql.Open("sqlite", path+"?_txlock=immediate&_pragma=journal_mode(WAL)&"+common)
	if err != nil {
		return nil, fmt.Errorf("open task store %q: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxLifetime(0)
	write.SetConnMaxIdleTime(0)
	if err := sqlitedb.Migrate(context.Background(), write, component, migrations); err != nil {
		write.Close()
		return nil, fmt.Errorf("open task store %q: %w", path, err)
	}

	read, err := sql.Open("sqlite", path+"?"+common+"&_query_only=1")
	if err != nil {
		write.Close()
		return nil, fmt.Errorf("open task store %q: %w", path, err)
	}
	read.SetMaxOpenConns(opts.ReadConns)
	read.SetMaxIdleConns(opts.ReadConns)
	return &Store{path: path, write: write, read: read, clock: opts.Clock, cacheTTL: opts.CacheTTL,
		writeStmts: sqlitedb.NewStmtCache(write), readStmts: sqlitedb.NewStmtCache(read)}, nil
}

// DB returns the write pool, so that the queue (package sqlitequeue) keeps
// its messages in the same file and its writes queue up behind the store's
// instead of contending with them. The Store owns it: do not close it. It
// has one connection, so a caller must not call Store or Queue methods
// while it holds an open *sql.Rows or *sql.Tx from it: that would deadlock.
func (s *Store) DB() *sql.DB { return s.write }

// Close closes both pools. The last connection to close checkpoints the WAL.
func (s *Store) Close() error {
	if err := errors.Join(s.readStmts.Close(), s.writeStmts.Close(), s.read.Close(), s.write.Close()); err != nil {
		return fmt.Errorf("close task store %q: %w", s.path, err)
	}
	return nil
}

// millis converts t to the stored form: Unix milliseconds, NULL for the zero time.
func millis(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMilli(), Valid: true}
}

// fromMillis is the inverse of millis.
func fromMillis(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.UnixMilli(n.Int64).UTC()
}

// isForeignKeyErr reports whether err is SQLite refusing a row whose task
// does not exist.
func isForeignKeyErr(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}

// placeholders returns "(?, ?, ?), (?, ?, ?)" for rows tuples of cols values.
func placeholders(rows, cols int) string {
	tuple := "(" + strings.TrimSuffix(strings.Repeat("?, ", cols), ", ") + ")"
	return strings.TrimSuffix(strings.Repeat(tuple+", ", rows), ", ")
}

// scanner is what *sql.Row and *sql.Rows have in common.
type scanner = sqlitedb.Scanner
