//go:build emulator

package main

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/batchgen/batchgen/internal/samstack"
)

// deployedStack provisions template.yaml's resources on the emulator under a
// unique prefix, deletes them when the test ends, and sets the credentials
// and region the batchgen binary reads, so a test can run the ops commands
// against "the deployed stack" as an operator would.
func deployedStack(t *testing.T, prefix string) (aws.Config, *samstack.Resources) {
	t.Helper()
	ctx := context.Background()
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := samstack.Provision(ctx, cfg, "../../template.yaml", samstack.UniquePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Cleanup(context.Background()) })
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_REGION", samstack.Region)
	return cfg, res
}

// queueAttributes reads every attribute of the queue at url (its message
// counters among them), for a failure to say where the messages are.
func queueAttributes(ctx context.Context, client *sqs.Client, url string) (map[string]string, error) {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
	if err != nil {
		return nil, err
	}
	return out.Attributes, nil
}
