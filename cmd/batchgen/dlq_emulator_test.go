//go:build emulator

package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/batchgen/batchgen/internal/awsemu"
)

// TestDLQOnSQS: a poison message on the deployed work queue (provisioned
// from template.yaml on the emulator) is dead-lettered by the redrive
// policy, `batchgen dlq list --queue-url --dlq-url` shows it, and `batchgen
// dlq redrive` moves it back to the work queue.
func TestDLQOnSQS(t *testing.T) {
	ctx := context.Background()
	cfg, err := awsemu.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := awsemu.Provision(ctx, cfg, "../../template.yaml", awsemu.UniquePrefix("dlqcli"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Cleanup(context.Background())
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_REGION", awsemu.Region)

	client := sqs.NewFromConfig(cfg)
	// Dead-letter after one receive so the test need not wait five.
	policy, _ := json.Marshal(map[string]any{"deadLetterTargetArn": res.DLQARN, "maxReceiveCount": 1})
	if _, err := client.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(res.QueueURL), Attributes: map[string]string{
		string(types.QueueAttributeNameVisibilityTimeout): "1", string(types.QueueAttributeNameRedrivePolicy): string(policy),
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(res.QueueURL), MessageBody: aws.String("not json")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Receiving past the max receive count moves it to the DLQ.
		_, _ = client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(res.QueueURL), WaitTimeSeconds: 1})
		attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(res.DLQURL),
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
		if err != nil {
			t.Fatal(err)
		}
		if attrs.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)] == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the poison message never reached the dead-letter queue")
		}
	}

	flags := []string{"--queue-url", res.QueueURL, "--dlq-url", res.DLQURL}
	list := runBinary(t, ctx, append([]string{"dlq", "list"}, flags...)...)
	if list.code != 0 || !strings.Contains(list.stdout, "not json") {
		t.Fatalf("dlq list: exit %d\n%s\n%s", list.code, list.stdout, list.stderr)
	}
	redrive := runBinary(t, ctx, append([]string{"dlq", "redrive"}, flags...)...)
	if redrive.code != 0 || !strings.Contains(redrive.stdout, "1 message(s) moved back") {
		t.Fatalf("dlq redrive: exit %d\n%s\n%s", redrive.code, redrive.stdout, redrive.stderr)
	}
	got, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(res.QueueURL), WaitTimeSeconds: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Messages) != 1 || aws.ToString(got.Messages[0].Body) != "not json" {
		t.Errorf("after redrive the work queue holds %d messages, want the poison one back", len(got.Messages))
	}
}
