// Package lambdalog is the logger of batchgen's Lambda functions: JSON lines
// in CloudWatch's JSON log format (the template's LoggingConfig LogFormat
// JSON), with "timestamp", "level", "message", the invocation's "requestId"
// and the task attributes the context carries (logging.With). It is apart
// from package logging so that the core never links aws-lambda-go.
package lambdalog

import (
	"context"
	"io"
	"log/slog"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/batchgen/batchgen/internal/logging"
)

// New returns a logger writing to w (os.Stdout in Lambda) at level.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	inner := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: lambdacontext.ReplaceAttr})
	return slog.New(logging.NewHandler(inner, RequestID))
}

// RequestID is a logging.Extractor for the request id of the invocation
// whose context lambda.Start passes to the handler.
func RequestID(ctx context.Context) []slog.Attr {
	if lc, ok := lambdacontext.FromContext(ctx); ok && lc.AwsRequestID != "" {
		return []slog.Attr{slog.String(logging.RequestID, lc.AwsRequestID)}
	}
	return nil
}
