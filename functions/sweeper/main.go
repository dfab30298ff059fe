// Command sweeper is the sweeper Lambda: on a schedule it re-enqueues stuck
// batches and starts exports that never started (see lambdafn.Sweeper).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/lambdafn"
)

func main() {
	d, err := lambdafn.FromEnv(context.Background(), "sweeper")
	if err != nil {
		lambdafn.Fatal("sweeper", err)
	}
	h, err := d.Sweeper()
	if err != nil {
		lambdafn.Fatal("sweeper", err)
	}
	lambda.Start(h.Handle)
}
