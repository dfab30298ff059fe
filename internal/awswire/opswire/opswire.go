// Package opswire is the one wiring of a deployed stack as the operator
// commands reach it from outside (batchgen tasks, status, cancel and retry
// with --table; batchgen dlq with --queue-url and --dlq-url;
// batchgen-localaws): through the default AWS configuration (AWS_PROFILE,
// AWS_REGION, AWS_ENDPOINT_URL for an emulator), so that every command
// builds the stack's adapters alike. The functions have their own wiring
// (awswire.Deps), from their environment.
package opswire

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/batchgen/batchgen/internal/queue/sqsqueue"
	"github.com/batchgen/batchgen/internal/store/dynamostore"
)

// Stack is a deployed stack's adapters, built from one AWS configuration.
type Stack struct {
	// AWS is the configuration every adapter is built from.
	AWS aws.Config
}

// Open loads the default AWS configuration.
func Open(ctx context.Context) (*Stack, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	return &Stack{AWS: cfg}, nil
}

// Store is the stack's task store: its DynamoDB table (stack output
// TableName).
func (s *Stack) Store(table string) *dynamostore.Store {
	return dynamostore.New(dynamodb.NewFromConfig(s.AWS), table, dynamostore.Options{})
}

// Queue is the stack's work queue (stack output QueueUrl) with its
// dead-letter queue (DlqUrl); either may be empty where the caller uses
// only the other.
func (s *Stack) Queue(queueURL, dlqURL string) *sqsqueue.Queue {
	return sqsqueue.New(sqs.NewFromConfig(s.AWS), queueURL, sqsqueue.Options{DLQURL: dlqURL})
}
