package sqlitedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// Migrate runs the migrations in fsys (files migrations/NNNN_what.sql, applied
// in order) that the database has not seen yet for component, in one
// transaction: with the store's IMMEDIATE transactions, two processes opening
// a new file at once apply them once. A database newer than the binary is an
// error rather than a silent downgrade.
func Migrate(ctx context.Context, db *sql.DB, component string, fsys fs.FS) error {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		component TEXT PRIMARY KEY,
		version   INTEGER NOT NULL
	) STRICT`); err != nil {
		return fmt.Errorf("migrate: create schema_version: %w", err)
	}
	var current int
	err = tx.QueryRowContext(ctx, `SELECT version FROM schema_version WHERE component = ?`, component).Scan(&current)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("migrate: read schema version: %w", err)
	}
	latest := 0
	for _, name := range names {
		prefix, _, _ := strings.Cut(path.Base(name), "_")
		version, err := strconv.Atoi(prefix)
		if err != nil {
			return fmt.Errorf("migrate: migration %s: name must start with its version number", name)
		}
		latest = max(latest, version)
		if version <= current {
			continue
		}
		script, err := fs.ReadFile(fsys, name)
		if err != nil {
			return fmt.Errorf("migrate: read %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, string(script)); err != nil {
			return fmt.Errorf("migrate: apply %s: %w", name, err)
		}
	}
	if current > latest {
		return fmt.Errorf("migrate: database schema version %d of %s is newer than this binary's %d", current, component, latest)
	}
	if current == latest {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (component, version) VALUES (?, ?)
		ON CONFLICT (component) DO UPDATE SET version = excluded.version`, component, latest); err != nil {
		return fmt.Errorf("migrate: record schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}
