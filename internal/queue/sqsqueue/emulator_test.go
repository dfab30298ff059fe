//go:build emulator

package sqsqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/queue/queuetest"
	"github.com/batchgen/batchgen/internal/queue/sqsqueue"
	"github.com/batchgen/batchgen/internal/samstack"
)

// templatePath is the deployment template the queues are provisioned from.
const templatePath = "../../../template.yaml"

// provision creates the template's resources on the emulator under a
// unique prefix and deletes them when the test ends.
func provision(t *testing.T) (*sqs.Client, *samstack.Resources) {
	t.Helper()
	cfg, err := samstack.Config(t.Context())
	if err != nil {
		t.Fatalf("emulator: %v", err)
	}
	res, err := samstack.Provision(t.Context(), cfg, templatePath, samstack.UniquePrefix("sqs"))
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		if err := res.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return sqs.NewFromConfig(cfg), res
}

// newQueue provisions the template's queues and adapts the work queue's
// visibility timeout and maxReceiveCount to what the subtest needs.
func newQueue(t *testing.T, cfg queuetest.Config) *sqsqueue.Queue {
	t.Helper()
	client, res := provision(t)
	policy, err := json.Marshal(map[string]string{
		"deadLetterTargetArn": res.DLQARN,
		"maxReceiveCount":     strconv.Itoa(cfg.MaxReceive),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.SetQueueAttributes(t.Context(), &sqs.SetQueueAttributesInput{
		QueueUrl: aws.String(res.QueueURL),
		Attributes: map[string]string{
			string(types.QueueAttributeNameVisibilityTimeout): strconv.Itoa(int(cfg.Visibility / time.Second)),
			string(types.QueueAttributeNameRedrivePolicy):     string(policy),
		},
	})
	if err != nil {
		t.Fatalf("set queue attributes: %v", err)
	}
	return sqsqueue.New(client, res.QueueURL, sqsqueue.Options{DLQURL: res.DLQURL})
}

func TestConformance(t *testing.T) {
	queuetest.RunWith(t, queuetest.Capabilities{DetectsStaleReceipts: false, AtLeastOnce: true}, func(t *testing.T, cfg queuetest.Config) queue.Queue {
		return newQueue(t, cfg)
	})
}

// TestSendChunks sends more messages than one SendMessageBatch takes, some
// large enough that the 256 KiB payload limit splits chunks too.
func TestSendChunks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// Received messages are hidden for 2 s only: a receive whose answer a
	// loaded emulator lost (the SDK then asks again) hides what it took,
	// and with 30 s a clean-clone run saw 13 of the 23 within the test's
	// 15 s. They are counted by body, so a message seen twice counts once,
	// and none is dead-lettered for being received again meanwhile.
	q := newQueue(t, queuetest.Config{Visibility: 2 * time.Second, MaxReceive: 100})
	var msgs []queue.Outgoing
	want := map[string]bool{}
	for i := range 23 {
		body := fmt.Sprintf("%02d:%s", i, strings.Repeat("x", 60<<10*(i%2)))
		msgs = append(msgs, queue.Outgoing{Body: []byte(body)})
		want[body[:2]] = true
	}
	if err := q.Send(ctx, msgs); err != nil {
		t.Fatalf("send: %v", err)
	}
	got := map[string]bool{}
	deadline := time.Now().Add(15 * time.Second)
	for len(got) < len(want) && time.Now().Before(deadline) {
		ds, err := q.Receive(ctx, 10)
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		for _, d := range ds {
			got[string(d.Body[:2])] = true
		}
	}
	if len(got) != len(want) {
		t.Errorf("received %d distinct messages, want %d", len(got), len(want))
	}
}

// TestDelayCapped checks that a delay beyond SQS's 15 minutes is capped
// rather than refused.
func TestDelayCapped(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queuetest.Config{Visibility: 30 * time.Second, MaxReceive: 5})
	if err := q.Send(t.Context(), []queue.Outgoing{{Body: []byte("much later"), Delay: time.Hour}}); err != nil {
		t.Fatalf("send with a 1 h delay: %v", err)
	}
	ds, err := q.Receive(t.Context(), 10)
	if err != nil || len(ds) != 0 {
		t.Errorf("receive during the delay: %d messages, error %v; want none", len(ds), err)
	}
}

func TestChangeVisibilityUnknownReceipt(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queuetest.Config{Visibility: 30 * time.Second, MaxReceive: 5})
	err := q.ChangeVisibility(t.Context(), "not-a-receipt", 0)
	if !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("ChangeVisibility of a bogus receipt: error = %v, want %v", err, queue.ErrNotFound)
	}
}

func TestDeadLettersNeedDLQ(t *testing.T) {
	t.Parallel()
	client, res := provision(t)
	q := sqsqueue.New(client, res.QueueURL, sqsqueue.Options{})
	if _, err := q.ListDead(t.Context(), 10); err == nil {
		t.Error("ListDead without a DLQ URL succeeded")
	}
	if _, err := q.Redrive(t.Context()); err == nil {
		t.Error("Redrive without a DLQ URL succeeded")
	}
}
