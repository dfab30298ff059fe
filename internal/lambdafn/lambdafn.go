// Package lambdafn holds the AWS Lambda entry points of batchgen, one type
// per function, each with a Handle method that takes the aws-lambda-go event
// type the function is invoked with:
//
//   - Splitter: S3 upload events under incoming/ -> validate and split.
//   - Generator: SQS batch messages -> pipeline.Generator, with partial
//     batch responses.
//   - Exporter: the export state machine's task -> pipeline.Exporter.
//   - Sweeper: the EventBridge schedule -> pipeline.Sweeper.
//   - HTTP: API Gateway HTTP API (payload format 2.0) -> an http.Handler
//     (internal/api).
//
// The handlers drive the same pipeline use cases, the same way, as the
// embedded runtime's LocalWorkers; they only translate events and outcomes.
// They depend on the ports, not on AWS, so their tests run on the embedded
// adapters. internal/awswire builds the AWS adapters for functions/*.
package lambdafn

import (
	"log/slog"
)

// discard returns l, or a logger that drops everything when l is nil.
func discard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
