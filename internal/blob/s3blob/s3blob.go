// Package s3blob implements blob.Store on an S3 bucket, for the AWS runtime:
// key "results/T.xlsx" is the object <Prefix>/results/T.xlsx.
//
// Put streams through the SDK's S3 transfer manager: objects up to one part
// (5 MiB) go up in one PutObject, larger ones as a multipart upload, and the
// reader is consumed a part at a time, so an export of unknown length never
// sits in memory whole. S3 makes an object visible only when its upload
// completes, which is what makes Put atomic: a reader that fails mid-way
// aborts the upload (the transfer manager aborts a multipart upload; a
// single part is never sent), and readers keep seeing the old object.
package s3blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/batchgen/batchgen/internal/blob"
)

var _ blob.Store = (*Store)(nil)

// ErrInvalidKey is returned for a key that is empty, absolute, has empty,
// "." or ".." elements, contains a backslash or NUL, or is longer than S3
// allows: the same keys fileblob refuses, so a key taken from user input
// behaves alike on both.
var ErrInvalidKey = errors.New("invalid blob key")

// maxKeyLen is S3's object key limit in bytes.
const maxKeyLen = 1024

// maxPresignTTL is the longest a SigV4 presigned URL may live.
const maxPresignTTL = 7 * 24 * time.Hour

const (
	// defaultPartSize is S3's minimum part size, which the transfer
	// manager does not default to (8 MiB): the smallest part keeps the
	// least of an export in memory.
	defaultPartSize = 5 << 20
	// abortTimeout bounds the abort of a failed multipart upload. The
	// abort runs on a fresh context, so that an upload failed by its
	// caller's cancellation is still aborted instead of leaving parts
	// behind until the bucket's lifecycle rule removes them.
	abortTimeout = 30 * time.Second
)

// Options tunes a Store. The zero value is ready to use.
type Options struct {
	// Prefix is prepended to every key, as a folder ("tenant-a" stores
	// "results/T.xlsx" at "tenant-a/results/T.xlsx"). Empty for none.
	Prefix string
	// PartSize is the upload part size in bytes, at least 5 MiB; an
	// object of at most one part is sent in one PutObject. Defaults to 5
	// MiB.
	PartSize int64
	// Concurrency is how many parts of one object upload at once.
	// Defaults to the transfer manager's (5).
	Concurrency int
}

// Store keeps objects in one bucket under an optional prefix. Its methods
// are safe for concurrent use.
type Store struct {
	client   *s3.Client
	bucket   string
	prefix   string
	uploader *transfermanager.Client
	presign  *s3.PresignClient
}

// FromConfig returns a Store on bucket with an S3 client built from cfg.
// Against a custom endpoint (cfg.BaseEndpoint, as AWS_ENDPOINT_URL sets
// for an emulator) the client uses path-style URLs, which emulators serve
// without wildcard DNS.
func FromConfig(cfg aws.Config, bucket string, opts Options) *Store {
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if cfg.BaseEndpoint != nil {
			o.UsePathStyle = true
		}
	})
	return New(client, bucket, opts)
}

// New returns a Store on bucket. An invalid Options.Prefix is a
// configuration error reported by every call.
func New(client *s3.Client, bucket string, opts Options) *Store {
	return &Store{
		client: client,
		bucket: bucket,
		prefix: strings.Trim(opts.Prefix, "/"),
		uploader: transfermanager.New(client, func(o *transfermanager.Options) {
			o.PartSizeBytes = defaultPartSize
			if opts.PartSize > 0 {
				o.PartSizeBytes = opts.PartSize
			}
			// Multipart from the second part on, as the upload
			// manager did: the transfer manager's own threshold (16
			// MiB) would buffer up to that much before sending.
			o.MultipartUploadThreshold = o.PartSizeBytes
			if opts.Concurrency > 0 {
				o.Concurrency = opts.Concurrency
			}
			o.FailTimeout = abortTimeout
		}),
		presign: s3.NewPresignClient(client),
	}
}

// Bucket returns the bucket name, for messages.
func (s *Store) Bucket() string { return s.bucket }

// validateKey returns ErrInvalidKey, wrapped with the key, unless key is a
// clean relative slash-separated path.
func validateKey(key string) error {
	if key == "" || key == "." || strings.ContainsAny(key, "\\\x00") || !fs.ValidPath(key) {
		return fmt.Errorf("%w %q: want a relative slash-separated path without \".\", \"..\", empty elements or backslashes", ErrInvalidKey, key)
	}
	return nil
}

// ObjectKey returns the S3 object key that holds key.
func (s *Store) ObjectKey(key string) (string, error) {
	if err := validateKey(key); err != nil {
		return "", err
	}
	if s.prefix != "" {
		if err := validateKey(s.prefix); err != nil {
			return "", fmt.Errorf("prefix: %w", err)
		}
		key = s.prefix + "/" + key
	}
	if len(key) > maxKeyLen {
		return "", fmt.Errorf("%w: object key of %d bytes, over S3's %d", ErrInvalidKey, len(key), maxKeyLen)
	}
	return key, nil
}

// Put uploads everything read from r under key, streaming (see the package
// comment). On any error, from r or from S3, the old object stays.
func (s *Store) Put(ctx context.Context, key string, r io.Reader) error {
	obj, err := s.ObjectKey(key)
	if err != nil {
		return fmt.Errorf("put blob: %w", err)
	}
	_, err = s.uploader.UploadObject(ctx, &transfermanager.UploadObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(obj),
		Body:   r,
	})
	if err != nil {
		return fmt.Errorf("put blob %q in s3://%s: %w", key, s.bucket, err)
	}
	return nil
}

// Open returns the object's content, or blob.ErrNotFound. The reader
// streams one version of the object, even while it is being replaced.
func (s *Store) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	obj, err := s.ObjectKey(key)
	if err != nil {
		return nil, fmt.Errorf("open blob: %w", err)
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(obj)})
	if isNotFound(err) {
		return nil, fmt.Errorf("open blob %q: %w", key, blob.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("open blob %q in s3://%s: %w", key, s.bucket, err)
	}
	return out.Body, nil
}

// Delete removes the object; S3 deletes of a missing key succeed, so this
// is idempotent.
func (s *Store) Delete(ctx context.Context, key string) error {
	obj, err := s.ObjectKey(key)
	if err != nil {
		return fmt.Errorf("delete blob: %w", err)
	}
	_, err = s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(obj)})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("delete blob %q in s3://%s: %w", key, s.bucket, err)
	}
	return nil
}

// Size returns the object's size in bytes (one HeadObject, no download),
// or blob.ErrNotFound; the splitter checks an upload's size with it before
// reading.
func (s *Store) Size(ctx context.Context, key string) (int64, error) {
	obj, err := s.ObjectKey(key)
	if err != nil {
		return 0, fmt.Errorf("size of blob: %w", err)
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(obj)})
	if isNotFound(err) {
		return 0, fmt.Errorf("size of blob %q: %w", key, blob.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("size of blob %q in s3://%s: %w", key, s.bucket, err)
	}
	return aws.ToInt64(out.ContentLength), nil
}

// PresignPut returns a URL through which anyone holding it may PUT the
// object under key for ttl (at most 7 days), so a browser uploads a sheet
// straight to S3 instead of through the API. size (bytes) and contentType
// are signed into the URL (X-Amz-SignedHeaders names content-length and
// content-type): S3 answers 403 to a PUT that sends another length or
// type, so the URL cannot carry a bigger file than the one announced.
func (s *Store) PresignPut(ctx context.Context, key string, ttl time.Duration, size int64, contentType string) (string, error) {
	obj, err := s.presignArgs(key, ttl)
	if err != nil {
		return "", fmt.Errorf("presign put: %w", err)
	}
	if size < 0 || contentType == "" {
		return "", fmt.Errorf("presign put %q: size %d and content type %q: both are required", key, size, contentType)
	}
	req, err := s.presign.PresignPutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(obj),
		ContentLength: aws.Int64(size), ContentType: aws.String(contentType),
	}, s3.WithPresignExpires(ttl))
	if err != nil {
		return "", fmt.Errorf("presign put %q: %w", key, err)
	}
	return req.URL, nil
}

// PresignGet returns a URL through which anyone holding it may GET the
// object under key for ttl (at most 7 days), for downloading a result.
func (s *Store) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	obj, err := s.presignArgs(key, ttl)
	if err != nil {
		return "", fmt.Errorf("presign get: %w", err)
	}
	req, err := s.presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(obj)},
		s3.WithPresignExpires(ttl))
	if err != nil {
		return "", fmt.Errorf("presign get %q: %w", key, err)
	}
	return req.URL, nil
}

// presignArgs validates a presign request and returns the object key.
func (s *Store) presignArgs(key string, ttl time.Duration) (string, error) {
	if ttl <= 0 || ttl > maxPresignTTL {
		return "", fmt.Errorf("ttl %v: want more than 0 and at most %v", ttl, maxPresignTTL)
	}
	return s.ObjectKey(key)
}

// isNotFound reports whether err says the object does not exist: NoSuchKey
// from GetObject, a bare 404 from HeadObject (which has no error body). A
// missing bucket is a configuration error, not a missing object.
func isNotFound(err error) bool {
	if err == nil {
		return false
	}
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsk) || errors.As(err, &nf) {
		return true
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return true
		case "NoSuchBucket":
			return false
		}
	}
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound
}

// Move copies the object at from to to (one CopyObject, server-side; S3
// copies objects up to 5 GiB that way, far above the input limit) and then
// deletes from. S3 has no rename: between the two calls the object is under
// both keys, and a failed delete leaves it so (the caller retries the Move,
// whose copy then just happens again). A missing from is blob.ErrNotFound
// (with s3:ListBucket; without it S3 answers 403).
func (s *Store) Move(ctx context.Context, from, to string) error {
	src, err := s.ObjectKey(from)
	if err != nil {
		return fmt.Errorf("move blob: %w", err)
	}
	dst, err := s.ObjectKey(to)
	if err != nil {
		return fmt.Errorf("move blob: %w", err)
	}
	_, err = s.client.CopyObject(ctx, &s3.CopyObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(dst),
		CopySource: aws.String(copySource(s.bucket, src)),
	})
	if isNotFound(err) {
		return fmt.Errorf("move blob %q: %w", from, blob.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("move blob %q to %q in s3://%s: copy: %w", from, to, s.bucket, err)
	}
	_, err = s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(src)})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("move blob %q to %q in s3://%s: delete the original: %w", from, to, s.bucket, err)
	}
	return nil
}

// copySource is CopyObject's x-amz-copy-source: bucket/key, URL-encoded
// (S3 decodes it), each path element escaped and '+' too, which S3 would
// otherwise decode as a space.
func copySource(bucket, key string) string {
	parts := strings.Split(bucket+"/"+key, "/")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(url.PathEscape(p), "+", "%2B")
	}
	return strings.Join(parts, "/")
}
