// Package dropdir watches a local drop folder for `batchgen serve`: sheets
// that appear under ROOT/incoming/ are handed to the pipeline's Intake, as
// the S3 notification hands a bucket's incoming/ objects to the splitter
// Lambda, and then moved to ROOT/processed/. ROOT is the same directory
// the file blob store of the server is rooted at, so an input's key
// ("incoming/a/b.xlsx") names its file, and its result
// (ROOT/results/a/b.result.xlsx) or error file lands where the exporter
// and the intake put them on AWS.
//
// Files still being written are left alone: a file is taken only once its
// size and modification time were the same at two looks an interval
// apart, and names that are hidden (".name") or end in ".tmp" are never
// taken, so a writer that renames a finished ".tmp" file into place is
// never seen halfway. The folder is polled: a look per interval is what the
// stability rule needs anyway, it works on every file system (network
// shares included, where inotify sees nothing), and it finds files that
// arrived while the server was down.
package dropdir

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/pipeline"
)

// Accepter takes a dropped input (pipeline.Intake).
type Accepter interface {
	Accept(ctx context.Context, key, version string) (pipeline.IntakeResult, error)
}

// Config wires a Folder.
type Config struct {
	// Root holds incoming/, processed/ and results/; required.
	Root string
	// Intake takes the inputs; required.
	Intake Accepter
	// Interval is the time between looks. Defaults to 1 second.
	Interval time.Duration
	// RetryAfter is how long an input whose intake failed (a failure a
	// retry may fix: a full disk, a store error) waits before it is tried
	// again. Defaults to 30 seconds.
	RetryAfter time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Folder is a watched drop folder. Scan and Run must not be called
// concurrently.
type Folder struct {
	cfg Config
	// looks remembers what each waiting file looked like at the last scan.
	looks map[string]look
}

// look is a file as seen at one scan.
type look struct {
	size int64
	mod  time.Time
	// failedAt is when its intake last failed; zero if it never did.
	failedAt time.Time
}

// New returns a Folder for cfg, creating ROOT/incoming if needed.
func New(cfg Config) (*Folder, error) {
	if cfg.Root == "" || cfg.Intake == nil {
		return nil, errors.New("dropdir: Root and Intake are required")
	}
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.RetryAfter = cmp.Or(cfg.RetryAfter, 30*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 || cfg.RetryAfter <= 0 {
		return nil, fmt.Errorf("dropdir: Interval %v and RetryAfter %v must be positive", cfg.Interval, cfg.RetryAfter)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Root, "incoming"), 0o700); err != nil {
		return nil, fmt.Errorf("drop folder: %w", err)
	}
	return &Folder{cfg: cfg, looks: map[string]look{}}, nil
}

// Run scans the folder until ctx ends, waiting Interval after each scan
// ends; it returns nil then. The wait starts when a scan ends, not on a
// ticker: a scan that took long (a big intake) must not be followed at once
// by the next look, or a file whose writer paused for a moment would look
// unchanged across two looks milliseconds apart and be taken half-written.
func (f *Folder) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := f.Scan(ctx); err != nil && ctx.Err() == nil {
			f.cfg.Logger.Warn("drop folder scan failed", "error", err)
		}
		t.Reset(f.cfg.Interval)
	}
}

// Scan looks at the folder once and takes every input that has not changed
// since the previous look. It returns how many inputs it took.
func (f *Folder) Scan(ctx context.Context) (int, error) {
	incoming := filepath.Join(f.cfg.Root, "incoming")
	now := time.Now()
	present := map[string]bool{}
	var ready []string
	err := filepath.WalkDir(incoming, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == incoming {
				return err
			}
			return nil // a folder removed while we walk it
		}
		name := d.Name()
		if p != incoming && strings.HasPrefix(name, ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !d.Type().IsRegular() || strings.HasSuffix(strings.ToLower(name), ".tmp") {
			return nil
		}
		rel, err := filepath.Rel(f.cfg.Root, p)
		if err != nil {
			return nil
		}
		key := filepath.ToSlash(rel)
		if !pipeline.IsInputKey(key) {
			return nil // sidecar prompts, notes, anything but a sheet
		}
		info, err := d.Info()
		if err != nil {
			return nil // gone meanwhile
		}
		present[key] = true
		cur := look{size: info.Size(), mod: info.ModTime()}
		prev, seen := f.looks[key]
		cur.failedAt = prev.failedAt
		f.looks[key] = cur
		switch {
		case !seen || prev.size != cur.size || !prev.mod.Equal(cur.mod):
			// New or still changing: look again next time.
		case !prev.failedAt.IsZero() && now.Sub(prev.failedAt) < f.cfg.RetryAfter:
		default:
			ready = append(ready, key)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("scan drop folder %s: %w", incoming, err)
	}
	for key := range f.looks {
		if !present[key] {
			delete(f.looks, key)
		}
	}
	taken := 0
	for _, key := range ready {
		if ctx.Err() != nil {
			break
		}
		if err := f.take(ctx, key); err != nil {
			l := f.looks[key]
			l.failedAt = time.Now()
			f.looks[key] = l
			f.cfg.Logger.Warn("drop folder input not taken; will try again", "key", key, "retry_after", f.cfg.RetryAfter, "error", err)
			continue
		}
		delete(f.looks, key)
		taken++
	}
	return taken, nil
}

// take hands one stable input to the intake and moves it to processed/
// (pipeline.ProcessedKey) when the intake took it (IntakeResult.Taken), as
// the splitter Lambda does in the bucket (pipeline.IntakeConfig.MoveTaken).
// The input's version is its content hash: the same content dropped again
// (while its task runs, or after it finished) is the same task, and other
// content under the same name is a new one.
func (f *Folder) take(ctx context.Context, key string) error {
	file := filepath.Join(f.cfg.Root, filepath.FromSlash(key))
	version, err := contentHash(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // moved away meanwhile
	}
	if err != nil {
		return err
	}
	res, err := f.cfg.Intake.Accept(ctx, key, version)
	if err != nil {
		return err
	}
	if !res.Taken {
		// The core's rule, shared with the splitter Lambda: only a taken
		// input moves (an object gone meanwhile has nothing to move).
		f.cfg.Logger.Info("drop folder input not taken", "key", key, "task_id", res.TaskID)
		return nil
	}
	dst := filepath.Join(f.cfg.Root, filepath.FromSlash(pipeline.ProcessedKey(key)))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("move %s to processed: %w", key, err)
	}
	// A rename within one file system is atomic and replaces an earlier
	// copy of the same name: the newest drop is the one kept.
	if err := os.Rename(file, dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("move %s to processed: %w", key, err)
	}
	f.cfg.Logger.Info("drop folder input taken", "key", key, "task_id", res.TaskID, "outcome", outcomeName(res.Outcome), "moved_to", path.Clean(pipeline.ProcessedKey(key)))
	return nil
}

func outcomeName(o pipeline.IntakeOutcome) string {
	switch o {
	case pipeline.IntakeSplit:
		return "split"
	case pipeline.IntakeRejected:
		return "rejected"
	}
	return "known"
}

// contentHash is the SHA-256 of the file's content.
func contentHash(file string) (string, error) {
	fh, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", fmt.Errorf("read %s: %w", file, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
