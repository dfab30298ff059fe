//go:build emulator

package s3blob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/blob/blobtest"
	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/samstack"
)

// bucket provisions the template's resources once for a test and returns
// an S3 client and the bucket; subtests get their own prefix in it.
func bucket(t *testing.T) (*s3.Client, string) {
	t.Helper()
	cfg, err := samstack.Config(t.Context())
	if err != nil {
		t.Fatalf("emulator: %v", err)
	}
	res, err := samstack.Provision(t.Context(), cfg, "../../../template.yaml", samstack.UniquePrefix("s3"))
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		if err := res.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	// Path-style URLs: the emulator has no wildcard DNS for bucket hosts.
	return s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true }), res.BucketName
}

var prefixSeq atomic.Int64

// newPrefix returns a prefix no other subtest uses.
func newPrefix(name string) string {
	return fmt.Sprintf("t/%s-%d", strings.ReplaceAll(name, "/", "_"), prefixSeq.Add(1))
}

func TestConformance(t *testing.T) {
	client, name := bucket(t)
	blobtest.Run(t, func(t *testing.T) blob.Store {
		return s3blob.New(client, name, s3blob.Options{Prefix: newPrefix(t.Name())})
	})
}

// TestMultipart puts an object of several parts and one whose reader fails
// after the first parts were uploaded: the upload is aborted and the old
// object stays.
func TestMultipart(t *testing.T) {
	ctx := t.Context()
	client, name := bucket(t)
	s := s3blob.New(client, name, s3blob.Options{Prefix: "multipart"})
	big := bytes.Repeat([]byte("0123456789abcdef"), (12<<20)/16) // 12 MiB: three 5 MiB parts
	if err := s.Put(ctx, "results/big.xlsx", io.MultiReader(bytes.NewReader(big))); err != nil {
		t.Fatalf("put: %v", err)
	}
	if n, err := s.Size(ctx, "results/big.xlsx"); err != nil || n != int64(len(big)) {
		t.Fatalf("size = %d, %v; want %d", n, err, len(big))
	}
	broken := io.MultiReader(bytes.NewReader(big[:11<<20]), &failing{})
	if err := s.Put(ctx, "results/big.xlsx", broken); err == nil {
		t.Fatal("put from a reader failing after two parts succeeded")
	}
	rc, err := s.Open(ctx, "results/big.xlsx")
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, big) {
		t.Errorf("after the failed put: %d bytes (error %v), want the old %d bytes", len(got), err, len(big))
	}
	uploads, err := client.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(name)})
	if err != nil {
		t.Fatalf("list multipart uploads: %v", err)
	}
	if len(uploads.Uploads) != 0 {
		t.Errorf("%d multipart uploads left behind, want the failed one aborted", len(uploads.Uploads))
	}
}

// failing is a reader that always fails.
type failing struct{}

func (*failing) Read([]byte) (int, error) { return 0, errors.New("source broke") }

func TestSize(t *testing.T) {
	ctx := t.Context()
	client, name := bucket(t)
	s := s3blob.New(client, name, s3blob.Options{})
	if err := s.Put(ctx, "incoming/a.csv", strings.NewReader("a,b\n1,2\n")); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Size(ctx, "incoming/a.csv"); err != nil || n != 8 {
		t.Errorf("Size = %d, %v; want 8", n, err)
	}
	if _, err := s.Size(ctx, "incoming/missing.csv"); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Size of a missing key: error = %v, want %v", err, blob.ErrNotFound)
	}
	if _, err := s.Size(ctx, "../x"); !errors.Is(err, s3blob.ErrInvalidKey) {
		t.Errorf("Size of an invalid key: error = %v, want %v", err, s3blob.ErrInvalidKey)
	}
}

// TestPresign uploads through a presigned PUT URL and downloads through a
// presigned GET URL with a plain HTTP client, as a browser would.
func TestPresign(t *testing.T) {
	ctx := t.Context()
	client, name := bucket(t)
	s := s3blob.New(client, name, s3blob.Options{Prefix: "presigned"})
	body := []byte("sheet bytes")
	const xlsxType = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
	put, err := s.PresignPut(ctx, "incoming/商品 list.xlsx", 5*time.Minute, int64(len(body)), xlsxType)
	if err != nil {
		t.Fatalf("presign put: %v", err)
	}
	// The length and the type are signed into the URL, so S3 answers 403
	// to a PUT that sends any other. moto does not check the signatures of
	// presigned URLs (a PUT of a longer body or another type through this
	// URL gets 200 from moto 5.2.5), so the test asserts what S3 enforces
	// instead: the URL's signed headers include both.
	u, err := url.Parse(put)
	if err != nil {
		t.Fatal(err)
	}
	signed := strings.Split(u.Query().Get("X-Amz-SignedHeaders"), ";")
	for _, h := range []string{"content-length", "content-type", "host"} {
		if !slices.Contains(signed, h) {
			t.Errorf("X-Amz-SignedHeaders = %v, want it to include %s", signed, h)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, put, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", xlsxType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT presigned: %v", err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT presigned: %s: %s", resp.Status, msg)
	}

	get, err := s.PresignGet(ctx, "incoming/商品 list.xlsx", time.Minute)
	if err != nil {
		t.Fatalf("presign get: %v", err)
	}
	req, err = http.NewRequestWithContext(ctx, http.MethodGet, get, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET presigned: %v", err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, body) {
		t.Errorf("GET presigned: %s %q, want 200 %q", resp.Status, got, body)
	}

	for _, ttl := range []time.Duration{0, -time.Second, 8 * 24 * time.Hour} {
		if _, err := s.PresignGet(ctx, "x", ttl); err == nil {
			t.Errorf("PresignGet with ttl %v succeeded, want an error", ttl)
		}
	}
	if _, err := s.PresignPut(ctx, "../x", time.Minute, 1, xlsxType); !errors.Is(err, s3blob.ErrInvalidKey) {
		t.Errorf("PresignPut of an invalid key: error = %v, want %v", err, s3blob.ErrInvalidKey)
	}
}
