// Command events is the task event stream Lambda: GET
// /api/tasks/{id}/events (Server-Sent Events) through a Function URL with
// response streaming, which API Gateway cannot do (see eventsfn.Handler).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/eventsfn"
)

func main() {
	ctx := context.Background()
	d, err := awswire.FromEnv(ctx, "events")
	if err != nil {
		awswire.Fatal("events", err)
	}
	h, err := eventsfn.New(ctx, d, nil)
	if err != nil {
		awswire.Fatal("events", err)
	}
	// lambdaurl.Start is lambda.StartHandlerFunc of the same streaming
	// handler; eventsfn adds the JSON answer to a malformed event.
	lambda.StartHandlerFunc(h.Handle)
}
