//go:build emulator

package bedrockllm_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	bedrockllm "github.com/batchgen/batchgen/internal/llm/bedrock"
	"github.com/batchgen/batchgen/internal/llm/llmtest"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/llm/mockserver/mocks3"
	"github.com/batchgen/batchgen/internal/samstack"
)

// bedrockBatch returns a Bedrock batch provider whose jobs run on the mock's
// double of the control plane, their files in a bucket of the emulator's
// S3, and the mock; srvCfg tunes the mock (its clock, its batches).
func bedrockBatch(t *testing.T, srvCfg mockserver.Config) (*bedrockllm.Batch, *mockserver.Server) {
	t.Helper()
	cfg, err := samstack.Config(t.Context())
	if errors.Is(err, samstack.ErrNoEndpoint) {
		t.Fatal("the emulator is not running: start it with infra/emulator/start.sh")
	}
	if err != nil {
		t.Fatal(err)
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })
	bucket := samstack.UniquePrefix("bedrock-batch")
	if _, err := client.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatal(err)
	}
	srvCfg.Objects = mocks3.Objects{Client: client}
	srv := mockserver.New(srvCfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	bcfg := bedrockllm.BatchConfig{
		Model: "anthropic.claude-3-5-haiku-20241022-v1:0", Bucket: bucket, Prefix: "provider-batches",
		RoleARN: "arn:aws:iam::123456789012:role/bedrock-batch", BaseURL: hs.URL,
	}
	b, err := bedrockllm.NewBatch(bedrockllm.NewControl(cfg, bcfg), s3blob.New(client, bucket, s3blob.Options{}), bcfg)
	if err != nil {
		t.Fatal(err)
	}
	return b, srv
}

// TestBatchContract runs the provider batch suite against the mock's
// double of Bedrock's batch inference, through the SDK's control-plane
// calls and the emulator's S3.
func TestBatchContract(t *testing.T) {
	llmtest.RunBatch(t, func(t *testing.T, expire bool) (llm.BatchProvider, *clock.Fake) {
		clk := clock.NewFake(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
		b, _ := bedrockBatch(t, mockserver.Config{Clock: clk, BatchDelay: time.Hour, BatchExpire: expire})
		return b, clk
	})
}

// TestBatchRefusesTooFewRecords: a job takes at least 100 records; fewer
// are refused before any file is written, as a bad request.
func TestBatchRefusesTooFewRecords(t *testing.T) {
	b, _ := bedrockBatch(t, mockserver.Config{})
	_, err := b.SubmitBatch(context.Background(), "few", []llm.BatchLine{{ID: "a", Req: llm.Request{Prompt: "x"}}})
	if e := llm.Classify(err); e.Class != llm.ClassBadRequest {
		t.Errorf("one record: %v, want a bad request naming the minimum", err)
	}
}
