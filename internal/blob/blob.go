// Package blob is the object storage port: input copies and result files.
// Adapters: fileblob (a directory) and s3blob (S3); both pass blobtest.
package blob

import (
	"context"
	"errors"
	"io"
)

// ErrNotFound is returned when no object has the key.
var ErrNotFound = errors.New("blob not found")

// Store stores objects by key. Keys are slash-separated relative paths such
// as "results/TASK.xlsx"; adapters reject keys that would escape their root.
type Store interface {
	// Put stores everything read from r under key, replacing any object
	// there. It is atomic: readers see the old object or the whole new one,
	// and a read error from r leaves the old object in place.
	Put(ctx context.Context, key string, r io.Reader) error
	// Open returns the object's content or ErrNotFound.
	Open(ctx context.Context, key string) (io.ReadCloser, error)
	// Delete removes an object; deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// Move puts the object at from under to, replacing any object there,
	// and then removes it from from (a drop folder's input goes from
	// incoming/ to processed/). A missing from is ErrNotFound and leaves
	// to as it was, so a repeated Move after a completed one tells the
	// caller there is nothing left to move. Readers of to see the old
	// object or the whole moved one; a Move that fails part-way may leave
	// the object under both keys, never under neither.
	Move(ctx context.Context, from, to string) error
}
