package lambdalog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/logging"
)

func TestLambdaFormat(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := New(&buf, slog.LevelInfo)
	ctx := lambdacontext.NewContext(context.Background(), &lambdacontext.LambdaContext{AwsRequestID: "c6af9ac6-7b61-11e6-9a41-93e812345678"})
	ctx = logging.With(ctx, logging.TaskID, "t1")
	log.WarnContext(ctx, "batch released", "pending_rows", 4)

	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("line %q is not one JSON object: %v", buf.String(), err)
	}
	if _, ok := got["timestamp"]; !ok {
		t.Errorf("no timestamp key in %v", got)
	}
	delete(got, "timestamp")
	want := map[string]any{"level": "WARN", "message": "batch released", "pending_rows": 4.0, logging.TaskID: "t1", logging.RequestID: "c6af9ac6-7b61-11e6-9a41-93e812345678"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lambda line (-want +got):\n%s", diff)
	}
}
