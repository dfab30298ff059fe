package providers

import (
	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/llm"
	bedrockllm "github.com/batchgen/batchgen/internal/llm/bedrock"
	"github.com/batchgen/batchgen/internal/providerfile"
)

// BedrockBatch builds the batch inference side of bedrock entry p
// (Builder.BedrockBatch) through awsCfg: jobs through Bedrock's control
// plane (p's region and endpoint), their files in p's batch bucket.
func BedrockBatch(awsCfg aws.Config, p providerfile.Provider) (llm.BatchProvider, error) {
	cfg := bedrockllm.BatchConfig{
		Model: p.Model, Bucket: p.BatchBucket, Prefix: p.BatchPrefix, RoleARN: p.BatchRoleARN,
		Region: p.Region, BaseURL: p.BaseURL,
	}
	return bedrockllm.NewBatch(bedrockllm.NewControl(awsCfg, cfg), s3blob.FromConfig(awsCfg, p.BatchBucket, s3blob.Options{}), cfg)
}
