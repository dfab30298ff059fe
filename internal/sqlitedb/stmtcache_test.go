package sqlitedb_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/batchgen/batchgen/internal/sqlitedb"
)

// openOneConn opens an in-memory database on a one-connection pool, as
// the embedded store's write pool is.
func openOneConn(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE kv (k TEXT PRIMARY KEY, v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestStmtCachePreparesOnce: one text gives one statement however often
// it is asked for, another text another; each runs inside a transaction
// of the one-connection pool without waiting for itself; Close closes
// them.
func TestStmtCachePreparesOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := openOneConn(t)
	c := sqlitedb.NewStmtCache(db)
	const ins, get = `INSERT INTO kv (k, v) VALUES (?, ?)`, `SELECT v FROM kv WHERE k = ?`
	a, err := c.Get(ctx, ins)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Get(ctx, ins)
	if err != nil {
		t.Fatal(err)
	}
	if a != again {
		t.Error("the same text was prepared twice")
	}
	sel, err := c.Get(ctx, get)
	if err != nil {
		t.Fatal(err)
	}
	if sel == a {
		t.Error("two texts share one statement")
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqlitedb.InTx(ctx, tx, a).ExecContext(ctx, "x", 7); err != nil {
		t.Fatalf("insert in the transaction: %v", err)
	}
	var v int
	if err := sqlitedb.InTx(ctx, tx, sel).QueryRowContext(ctx, "x").Scan(&v); err != nil || v != 7 {
		t.Fatalf("read in the transaction = %d, %v; want 7", v, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	if _, err := c.Get(ctx, `SELECT nope FROM`); err == nil {
		t.Error("a malformed statement was prepared")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := sel.QueryRowContext(ctx, "x").Scan(&v); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("a statement ran after Close: error %v, want one saying it is closed", err)
	}
	fresh, err := c.Get(ctx, ins)
	if err != nil {
		t.Fatalf("get after close: %v", err)
	}
	if fresh == a {
		t.Error("get after close returned the closed statement")
	}
}
