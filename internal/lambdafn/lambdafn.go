// Package lambdafn holds the tests of the AWS Lambda entry points of
// batchgen, whose handlers live one package per function, so that each
// function links only what it uses:
//
//   - splitterfn: S3 upload events under incoming/ -> validate and split.
//   - generatorfn: SQS batch messages -> pipeline.Generator, with partial
//     batch responses.
//   - exporterfn: the export state machine's task -> pipeline.Exporter.
//   - sweeperfn: the EventBridge schedule -> pipeline.Sweeper.
//   - apifn: API Gateway HTTP API (payload format 2.0) -> an http.Handler
//     (internal/api).
//
// The handlers drive the same pipeline use cases, the same way, as the
// embedded runtime's LocalWorkers; they only translate events and outcomes.
// They depend on the ports, not on AWS, so their tests here run on the
// embedded adapters. internal/awswire/<function>wire builds each
// function's AWS adapters for functions/<function>.
package lambdafn
