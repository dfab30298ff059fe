// Package fileblob implements blob.Store on a directory, for the embedded
// runtime: key "results/T.xlsx" is the file ROOT/results/T.xlsx.
//
// Put writes a hidden temporary file beside the target, fsyncs it and
// renames it over the target, so readers (and a crash) see the old file or
// the whole new one. Operating-system errors come back wrapped, with the
// path, so a caller can tell the user "disk full" (errors.Is(err,
// syscall.ENOSPC)) or "permission denied" (errors.Is(err, fs.ErrPermission)).
package fileblob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/batchgen/batchgen/internal/blob"
)

var _ blob.Store = (*Store)(nil)

// ErrInvalidKey is returned for a key that is empty, absolute, has empty,
// "." or ".." elements, or contains a backslash or NUL: such a key could
// name a file outside the root, or different files on different systems.
var ErrInvalidKey = errors.New("invalid blob key")

// tempMarker is part of every temporary file's name, so leftovers of a
// crash can be recognised.
const tempMarker = ".tmp-"

// Store keeps objects as files under a root directory. Its methods are safe
// for concurrent use.
type Store struct {
	root string
}

// New returns a Store rooted at root, creating the directory if needed.
func New(root string) (*Store, error) {
	if root == "" {
		return nil, errors.New("new file blob store: empty root")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("new file blob store %s: %w", root, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("new file blob store: %w", err)
	}
	return &Store{root: abs}, nil
}

// Path returns the file that holds key, for messages that tell the user
// where a result is.
func (s *Store) Path(key string) (string, error) {
	if err := validateKey(key); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

// openInRoot opens key's file without leaving the root: a symbolic link
// that leads out of it (incoming/x.prompt.txt -> any file of the machine,
// dropped by someone who may write the drop folder but not read the rest)
// is not followed, and the object counts as missing.
func (s *Store) openInRoot(key string) (*os.File, error) {
	f, err := os.OpenInRoot(s.root, filepath.FromSlash(key))
	// os.Root says so only in its error's text ("path escapes from parent").
	if err != nil && !isMissing(err) && strings.Contains(err.Error(), "escapes") {
		return nil, fmt.Errorf("%w: a link out of %s is not followed", fs.ErrNotExist, s.root)
	}
	return f, err
}

// validateKey returns ErrInvalidKey, wrapped with the key, unless key is a
// clean relative slash-separated path.
func validateKey(key string) error {
	if key == "" || key == "." || strings.ContainsAny(key, "\\\x00") || !fs.ValidPath(key) {
		return fmt.Errorf("%w %q: want a relative slash-separated path without \".\", \"..\", empty elements or backslashes", ErrInvalidKey, key)
	}
	return nil
}

// Put stores everything read from r under key, atomically: a temporary file
// in the target's directory is written, fsynced and renamed over the target.
// On any error the temporary file is removed and the old object stays.
func (s *Store) Put(ctx context.Context, key string, r io.Reader) (err error) {
	path, err := s.Path(key)
	if err != nil {
		return fmt.Errorf("put blob: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("put blob %q: %w", key, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+tempMarker+"*")
	if err != nil {
		return fmt.Errorf("put blob %q: %w", key, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()

	src := &sourceReader{ctx: ctx, r: r}
	if _, err := io.Copy(f, src); err != nil {
		if src.err != nil {
			return fmt.Errorf("put blob %q: read source: %w", key, src.err)
		}
		return fmt.Errorf("put blob %q: %w", key, err)
	}
	// CreateTemp makes the file private, which it stays: the data directory
	// is its owner's alone.
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("put blob %q: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("put blob %q: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("put blob %q: %w", key, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("put blob %q: %w", key, err)
	}
	// Make the rename itself durable. Some file systems cannot sync a
	// directory; the object is in place either way, so that is not an error.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// sourceReader reads from r, stops when ctx is done, and remembers r's own
// error so that Put can tell a broken source from a failing disk.
type sourceReader struct {
	ctx context.Context
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		s.err = err
		return 0, err
	}
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// Open returns the object's content or blob.ErrNotFound.
func (s *Store) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	if _, err := s.Path(key); err != nil {
		return nil, fmt.Errorf("open blob: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("open blob %q: %w", key, err)
	}
	f, err := s.openInRoot(key)
	if isMissing(err) {
		return nil, fmt.Errorf("open blob %q: %w", key, blob.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("open blob %q: %w", key, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open blob %q: %w", key, err)
	}
	if info.IsDir() {
		// A folder of other objects ("results/" of "results/T.xlsx") is no object.
		f.Close()
		return nil, fmt.Errorf("open blob %q: %w", key, blob.ErrNotFound)
	}
	return f, nil
}

// Size returns the object's size in bytes, or an error wrapping
// blob.ErrNotFound; with it a folder is a pipeline.DropFolder.
func (s *Store) Size(ctx context.Context, key string) (int64, error) {
	if _, err := s.Path(key); err != nil {
		return 0, fmt.Errorf("size of blob: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("size of blob %q: %w", key, err)
	}
	var info fs.FileInfo
	f, err := s.openInRoot(key)
	if err == nil {
		info, err = f.Stat()
		f.Close()
	}
	if isMissing(err) || err == nil && info.IsDir() {
		return 0, fmt.Errorf("size of blob %q: %w", key, blob.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("size of blob %q: %w", key, err)
	}
	return info.Size(), nil
}

// Delete removes the object; a missing key is not an error. Folders left
// empty stay: removing them would race with a Put creating a sibling.
func (s *Store) Delete(ctx context.Context, key string) error {
	path, err := s.Path(key)
	if err != nil {
		return fmt.Errorf("delete blob: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete blob %q: %w", key, err)
	}
	info, err := os.Lstat(path)
	if isMissing(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete blob %q: %w", key, err)
	}
	if info.IsDir() {
		return nil // a folder is no object
	}
	if err := os.Remove(path); err != nil && !isMissing(err) {
		return fmt.Errorf("delete blob %q: %w", key, err)
	}
	return nil
}

// isMissing reports whether err says there is no file at a path, including
// when a parent element is a file ("results/T.xlsx/x").
func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// Move renames the file of from onto to's, creating to's folders: a rename
// within one file system is atomic, so to holds the old file or the moved
// one, and from is gone in the same step. A missing from (or a folder) is
// blob.ErrNotFound.
func (s *Store) Move(ctx context.Context, from, to string) error {
	src, err := s.Path(from)
	if err != nil {
		return fmt.Errorf("move blob: %w", err)
	}
	dst, err := s.Path(to)
	if err != nil {
		return fmt.Errorf("move blob: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("move blob %q: %w", from, err)
	}
	info, err := os.Stat(src)
	if isMissing(err) || err == nil && !info.Mode().IsRegular() {
		return fmt.Errorf("move blob %q: %w", from, blob.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("move blob %q: %w", from, err)
	}
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("move blob %q to %q: %w", from, to, err)
	}
	if err := os.Rename(src, dst); isMissing(err) {
		// Moved away by another caller meanwhile.
		return fmt.Errorf("move blob %q: %w", from, blob.ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("move blob %q to %q: %w", from, to, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
