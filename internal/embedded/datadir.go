// Package embedded is batchgen's runtime on one machine, the one that
// `batchgen run` and `batchgen serve` both start: a data directory (SQLite
// for tasks, rows, the queue and the cache; files for the blobs) locked by
// the one process that works it, and the workers and the sweeper that work
// its queue (Start). The commands only turn flags into its configuration
// and print.
package embedded

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// DataDir is an opened data directory: the SQLite database (tasks, rows,
// queue, cache), the blob folder, and an exclusive lock so that two
// processes never work the same directory at once. Holding the lock is
// what lets a process treat every leftover lease as belonging to a dead
// one.
type DataDir struct {
	// Dir is the directory's path.
	Dir string
	// Store is its database.
	Store *sqlitestore.Store
	// Blobs is its blob folder (blobs/).
	Blobs *fileblob.Store
	lock  *os.File
}

// DefaultDir is the data directory of an input: .batchgen beside it, or
// the user's state directory when the input's folder is not writable.
func DefaultDir(input string) string {
	beside := filepath.Join(filepath.Dir(input), ".batchgen")
	if err := os.MkdirAll(beside, 0o755); err == nil {
		if f, err := os.CreateTemp(beside, ".probe-*"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return beside
		}
	}
	state := os.Getenv("XDG_STATE_HOME")
	if state == "" {
		if home, err := os.UserHomeDir(); err == nil {
			state = filepath.Join(home, ".local", "state")
		}
	}
	return filepath.Join(state, "batchgen")
}

// Open opens (creating it) and locks data directory dir, DefaultDir(input)
// when dir is empty; cacheTTL is how long its cache reuses an output (0:
// store.DefaultCacheTTL). A directory another process holds is an error
// saying so.
func Open(dir, input string, cacheTTL time.Duration) (*DataDir, error) {
	if dir == "" {
		dir = DefaultDir(input)
	}
	// The data directory holds every task's rows, answers and cached
	// outputs: its owner's alone (one made by an older version, 0755, is
	// closed too).
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, UnwrapPathError(err))
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, UnwrapPathError(err))
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, UnwrapPathError(err))
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data directory %s is in use by another batchgen process; wait for it or use --data", dir)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	d := &DataDir{Dir: dir, lock: lock}
	d.Store, err = sqlitestore.Open(filepath.Join(dir, "batchgen.db"), sqlitestore.Options{CacheTTL: cacheTTL})
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("open database in %s: %w", dir, err)
	}
	d.Blobs, err = fileblob.New(filepath.Join(dir, "blobs"))
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("open blob folder in %s: %w", dir, err)
	}
	return d, nil
}

// Close closes the database and gives up the lock.
func (d *DataDir) Close() {
	if d.Store != nil {
		d.Store.Close()
	}
	if d.lock != nil {
		syscall.Flock(int(d.lock.Fd()), syscall.LOCK_UN)
		d.lock.Close()
	}
}

// NoDataError is a directory that holds no batchgen data.
type NoDataError struct{ Dir string }

func (e *NoDataError) Error() string {
	return fmt.Sprintf("no batchgen data in %s (pass --data, the .batchgen folder beside the input)", e.Dir)
}

// OpenStore opens the database of data directory dir without taking its
// lock: listing, status and cancelling must work while a run is active
// (SQLite serializes the writes). A directory without a database is a
// *NoDataError.
func OpenStore(dir string) (*sqlitestore.Store, error) {
	db := filepath.Join(dir, "batchgen.db")
	if _, err := os.Stat(db); err != nil {
		return nil, &NoDataError{Dir: dir}
	}
	st, err := sqlitestore.Open(db, sqlitestore.Options{})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", db, err)
	}
	return st, nil
}

// UnwrapPathError returns the cause of a *fs.PathError, whose message
// repeats a path the caller already names.
func UnwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
