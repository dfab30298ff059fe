// Command sweeper is the sweeper Lambda: on a schedule it re-enqueues stuck
// batches and starts exports that never started (see sweeperfn.Handler).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/sweeperfn"
)

func main() {
	d, err := awswire.FromEnv(context.Background(), "sweeper")
	if err != nil {
		awswire.Fatal("sweeper", err)
	}
	h, err := sweeperfn.New(d)
	if err != nil {
		awswire.Fatal("sweeper", err)
	}
	lambda.Start(h.Handle)
}
