// Command generator is the generator Lambda: SQS batch messages are claimed
// and their rows generated under the provider quota (see
// generatorfn.Handler).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/generatorfn"
)

func main() {
	ctx := context.Background()
	d, err := awswire.FromEnv(ctx, "generator")
	if err != nil {
		awswire.Fatal("generator", err)
	}
	h, err := generatorfn.New(ctx, d)
	if err != nil {
		awswire.Fatal("generator", err)
	}
	lambda.Start(h.Handle)
}
