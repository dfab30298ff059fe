package sqsqueue

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/queue"
)

func TestSeconds(t *testing.T) {
	tests := []struct {
		name  string
		d     time.Duration
		limit time.Duration
		want  int32
	}{
		{"zero", 0, MaxDelay, 0},
		{"negative", -time.Second, MaxDelay, 0},
		{"whole", 10 * time.Second, MaxDelay, 10},
		{"rounded up", 1500 * time.Millisecond, MaxDelay, 2},
		{"a nanosecond", time.Nanosecond, MaxDelay, 1},
		{"delay capped at 15 min", time.Hour, MaxDelay, 900},
		{"visibility capped at 12 h", 24 * time.Hour, MaxVisibility, 43200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := seconds(tt.d, tt.limit); got != tt.want {
				t.Errorf("seconds(%v, %v) = %d, want %d", tt.d, tt.limit, got, tt.want)
			}
		})
	}
}

// sized returns messages with the given body sizes.
func sized(sizes ...int) []queue.Outgoing {
	out := make([]queue.Outgoing, len(sizes))
	for i, n := range sizes {
		out[i] = queue.Outgoing{Body: make([]byte, n)}
	}
	return out
}

func TestChunks(t *testing.T) {
	many := make([]int, 25)
	for i := range many {
		many[i] = 30
	}
	tests := []struct {
		name string
		msgs []queue.Outgoing
		want [][2]int
	}{
		{"none", nil, nil},
		{"one", sized(10), [][2]int{{0, 1}}},
		{"ten per call", sized(many...), [][2]int{{0, 10}, {10, 20}, {20, 25}}},
		{"payload limit", sized(100<<10, 100<<10, 100<<10, 10), [][2]int{{0, 2}, {2, 4}}},
		{"exactly the payload limit", sized(128<<10, 128<<10, 1), [][2]int{{0, 2}, {2, 3}}},
		{"oversized message alone", sized(1, 300<<10, 1), [][2]int{{0, 1}, {1, 2}, {2, 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := cmp.Diff(tt.want, chunks(tt.msgs)); d != "" {
				t.Errorf("chunks (-want +got):\n%s", d)
			}
		})
	}
}

func TestBatchFailures(t *testing.T) {
	if err := batchFailures("message", nil); err != nil {
		t.Errorf("no failures: %v", err)
	}
	err := batchFailures("message", []types.BatchResultErrorEntry{
		{Id: aws.String("3"), Code: aws.String("InvalidMessageContents"), Message: aws.String("bad char")},
		{Id: aws.String("7"), Code: aws.String("InternalError"), Message: aws.String("retry")},
	})
	want := "2 failed: message 3: InvalidMessageContents (bad char); message 7: InternalError (retry)"
	if err == nil || err.Error() != want {
		t.Errorf("batchFailures = %v, want %q", err, want)
	}
}

// apiErr is a service error with a code and message.
func apiErr(code, msg string) error { return &smithy.GenericAPIError{Code: code, Message: msg} }

// httpErr wraps err in a response error with status.
func httpErr(status int, err error) error {
	return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: err}
}

func TestIsReceiptGone(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"modelled invalid receipt", fmt.Errorf("op: %w", &types.ReceiptHandleIsInvalid{}), true},
		{"modelled not in flight", &types.MessageNotInflight{}, true},
		{"invalid receipt code", apiErr("ReceiptHandleIsInvalid", "The input receipt handle is invalid."), true},
		{"legacy not in flight code", apiErr("AWS.SimpleQueueService.MessageNotInflight", ""), true},
		{"receipt of a deleted message", apiErr("InvalidParameterValue",
			"Value x for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available for visibility timeout change."), true},
		{"visibility too long", apiErr("InvalidParameterValue",
			"Value 43201 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message is beyond the limit"), false},
		{"throttled", apiErr("RequestThrottled", ""), false},
		{"network", errors.New("connection reset"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isReceiptGone(tt.err); got != tt.want {
				t.Errorf("isReceiptGone(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestIsUnsupported(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"moto's HTML 500", httpErr(500, &smithy.DeserializationError{Err: errors.New("invalid character '<'")}), true},
		{"501", httpErr(501, errors.New("not implemented")), true},
		{"unknown operation code", apiErr("UnknownOperationException", ""), true},
		{"AWS internal error with a JSON body", httpErr(500, apiErr("InternalFailure", "try again")), false},
		{"access denied", httpErr(403, apiErr("AccessDenied", "")), false},
		{"unsupported for this queue", httpErr(400, apiErr("UnsupportedOperation", "Unsupported operation.")), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isUnsupported(tt.err); got != tt.want {
				t.Errorf("isUnsupported(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestDelivery(t *testing.T) {
	got, err := delivery(types.Message{
		MessageId: aws.String("m1"), ReceiptHandle: aws.String("r1"), Body: aws.String(`{"task_id":"t"}`),
		Attributes: map[string]string{"ApproximateReceiveCount": "3"},
	})
	want := queue.Delivery{ID: "m1", Receipt: "r1", Body: []byte(`{"task_id":"t"}`), ReceiveCount: 3}
	if err != nil {
		t.Fatalf("delivery: %v", err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("delivery (-want +got):\n%s", d)
	}
	if _, err := delivery(types.Message{MessageId: aws.String("m2")}); err == nil {
		t.Error("delivery without a receive count succeeded, want an error")
	}
}

// TestMessageGroupID: a principal SQS takes as a MessageGroupId goes as it
// is; one it would refuse (other characters, over 128 of them) as a digest
// that still tells principals apart; no group, no MessageGroupId.
func TestMessageGroupID(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 129)
	tests := []struct{ group, want string }{
		{"", ""},
		{"alice", "alice"},
		{"token-0123abcd", "token-0123abcd"},
		{"auth0|5f1c2a!~", "auth0|5f1c2a!~"},
		{strings.Repeat("y", 128), strings.Repeat("y", 128)},
	}
	for _, tc := range tests {
		if got := aws.ToString(messageGroupID(tc.group)); got != tc.want {
			t.Errorf("messageGroupID(%q) = %q, want %q", tc.group, got, tc.want)
		}
	}
	seen := map[string]string{}
	for _, g := range []string{"张三", "李四", "bob smith", long, long + "z"} {
		id := aws.ToString(messageGroupID(g))
		if len(id) > maxGroupID || !strings.HasPrefix(id, "sha256-") {
			t.Errorf("messageGroupID(%q) = %q, want a digest of at most %d characters", g, id, maxGroupID)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%q and %q share the MessageGroupId %q", g, other, id)
		}
		seen[id] = g
	}
}
