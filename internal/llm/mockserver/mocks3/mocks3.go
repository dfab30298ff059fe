// Package mocks3 gives the mock model server (mockserver) the S3 that
// Bedrock's batch inference jobs read their input from and write their
// output to: the emulator's S3 in tests. It is a package of its own so that
// the mock server, which most provider and pipeline tests link, does not
// link the S3 SDK; only the Bedrock batch tests do.
package mocks3

import (
	"bytes"
	"context"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// Objects is mockserver.Objects through an S3 client.
type Objects struct{ Client *s3.Client }

var _ mockserver.Objects = Objects{}

// GetObject implements mockserver.Objects.
func (o Objects) GetObject(ctx context.Context, bucket, key string) ([]byte, error) {
	out, err := o.Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return nil, err
	}
	defer out.Body.Close()
	return io.ReadAll(out.Body)
}

// PutObject implements mockserver.Objects.
func (o Objects) PutObject(ctx context.Context, bucket, key string, data []byte) error {
	_, err := o.Client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(data)})
	return err
}
