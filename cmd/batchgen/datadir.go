package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// dataDir is an opened --data directory: the SQLite database (tasks, rows,
// queue, cache), the blob folder, and an exclusive lock so that two runs
// never work the same directory at once. Holding the lock is what lets a run
// treat every leftover lease as belonging to a dead process.
type dataDir struct {
	dir   string
	lock  *os.File
	store *sqlitestore.Store
	blobs *fileblob.Store
}

// defaultDataDir is .batchgen beside the input, or the user's state
// directory when the input's folder is not writable.
func defaultDataDir(input string) string {
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

// openDataDir opens (creating it) the data directory; cacheTTL is how long
// its cache reuses an output (0: store.DefaultCacheTTL).
func openDataDir(dir, input string, cacheTTL time.Duration) (*dataDir, error) {
	if dir == "" {
		dir = defaultDataDir(input)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, unwrapPathError(err))
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, unwrapPathError(err))
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data directory %s is in use by another batchgen process; wait for it or use --data", dir)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	d := &dataDir{dir: dir, lock: lock}
	d.store, err = sqlitestore.Open(filepath.Join(dir, "batchgen.db"), sqlitestore.Options{CacheTTL: cacheTTL})
	if err != nil {
		d.close()
		return nil, fmt.Errorf("open database in %s: %w", dir, err)
	}
	d.blobs, err = fileblob.New(filepath.Join(dir, "blobs"))
	if err != nil {
		d.close()
		return nil, fmt.Errorf("open blob folder in %s: %w", dir, err)
	}
	return d, nil
}

func (d *dataDir) close() {
	if d.store != nil {
		d.store.Close()
	}
	if d.lock != nil {
		syscall.Flock(int(d.lock.Fd()), syscall.LOCK_UN)
		d.lock.Close()
	}
}
