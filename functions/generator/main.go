// Command generator is the generator Lambda: SQS batch messages are claimed
// and their rows generated under the provider quota (see
// lambdafn.Generator).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/lambdafn"
)

func main() {
	ctx := context.Background()
	d, err := lambdafn.FromEnv(ctx, "generator")
	if err != nil {
		lambdafn.Fatal("generator", err)
	}
	h, err := d.Generator(ctx)
	if err != nil {
		lambdafn.Fatal("generator", err)
	}
	lambda.Start(h.Handle)
}
