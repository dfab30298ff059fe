package localrun

import (
	"encoding/json"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/store"
)

// TestObjectCreated: the event carries the key as S3 encodes it, survives
// the JSON a Lambda receives, and names the task the splitter derives.
func TestObjectCreated(t *testing.T) {
	t.Parallel()
	spec := store.TaskSpec{Provider: "sim", Model: "sim-1", BatchSize: 25}
	tests := []struct {
		name    string
		obj     Object
		wantKey string
		// identity is what the splitter derives the task id from.
		identity string
	}{
		{
			name:    "unversioned, quoted ETag",
			obj:     Object{Key: "incoming/商品 list.xlsx", Size: 42, ETag: `"b21b84d6"`},
			wantKey: "incoming/%E5%95%86%E5%93%81+list.xlsx", identity: "incoming/商品 list.xlsx@b21b84d6",
		},
		{
			name:    "versioned bucket: the version wins",
			obj:     Object{Key: "incoming/a+b.csv", Size: 1, ETag: "e1", VersionID: "v7"},
			wantKey: "incoming/a%2Bb.csv", identity: "incoming/a+b.csv@v7",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := ObjectCreated("us-east-1", "bkt", tc.obj, 3)
			b, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			var got events.S3Event
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if len(got.Records) != 1 {
				t.Fatalf("records = %d, want 1", len(got.Records))
			}
			r := got.Records[0]
			gotFields := []string{r.EventName, r.EventSource, r.S3.Bucket.Name, r.S3.Bucket.Arn, r.S3.Object.Key, r.S3.Object.URLDecodedKey, r.S3.Object.VersionID}
			wantFields := []string{"ObjectCreated:Put", "aws:s3", "bkt", "arn:aws:s3:::bkt", tc.wantKey, tc.obj.Key, tc.obj.VersionID}
			if diff := cmp.Diff(wantFields, gotFields); diff != "" {
				t.Errorf("event fields mismatch (-want +got):\n%s", diff)
			}
			if r.S3.Object.Size != tc.obj.Size {
				t.Errorf("size = %d, want %d", r.S3.Object.Size, tc.obj.Size)
			}
			id, err := TaskID(got, spec)
			if err != nil {
				t.Fatal(err)
			}
			if want := pipeline.DeriveTaskID(tc.identity, spec); id != want {
				t.Errorf("TaskID = %s, want %s (from %q)", id, want, tc.identity)
			}
		})
	}
	if _, err := TaskID(events.S3Event{}, spec); err == nil {
		t.Error("TaskID of an event without records: no error")
	}
}

// TestSQSEvent: each message becomes a record of the mapping's event with
// its attributes, and the highest receive count is kept.
func TestSQSEvent(t *testing.T) {
	t.Parallel()
	s := &Stack{Resources: &samstack.Resources{QueueARN: "arn:aws:sqs:us-east-1:123456789012:work"}, region: "us-east-1"}
	msg := func(id, count string) sqstypes.Message {
		return sqstypes.Message{
			MessageId: aws.String(id), ReceiptHandle: aws.String("rh-" + id), Body: aws.String(`{"task_id":"t","batch_no":1}`),
			MD5OfBody: aws.String("md5"), Attributes: map[string]string{"ApproximateReceiveCount": count},
		}
	}
	ev, err := s.sqsEvent([]sqstypes.Message{msg("a", "1"), msg("b", "3")})
	if err != nil {
		t.Fatal(err)
	}
	want := events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "a", ReceiptHandle: "rh-a", Body: `{"task_id":"t","batch_no":1}`, Md5OfBody: "md5",
			Attributes: map[string]string{"ApproximateReceiveCount": "1"}, MessageAttributes: map[string]events.SQSMessageAttribute{},
			EventSourceARN: "arn:aws:sqs:us-east-1:123456789012:work", EventSource: "aws:sqs", AWSRegion: "us-east-1"},
		{MessageId: "b", ReceiptHandle: "rh-b", Body: `{"task_id":"t","batch_no":1}`, Md5OfBody: "md5",
			Attributes: map[string]string{"ApproximateReceiveCount": "3"}, MessageAttributes: map[string]events.SQSMessageAttribute{},
			EventSourceARN: "arn:aws:sqs:us-east-1:123456789012:work", EventSource: "aws:sqs", AWSRegion: "us-east-1"},
	}}
	if diff := cmp.Diff(want, ev); diff != "" {
		t.Errorf("event mismatch (-want +got):\n%s", diff)
	}
	if got := s.MaxReceiveCount(); got != 3 {
		t.Errorf("MaxReceiveCount = %d, want 3", got)
	}
	if _, err := s.sqsEvent([]sqstypes.Message{msg("c", "")}); err == nil {
		t.Error("a message without ApproximateReceiveCount: no error")
	}
}
