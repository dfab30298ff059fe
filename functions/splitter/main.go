// Command splitter is the splitter Lambda: S3 uploads under incoming/ are
// validated and split into batches (see splitterfn.Handler).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/splitterfn"
)

func main() {
	d, err := awswire.FromEnv(context.Background(), "splitter")
	if err != nil {
		awswire.Fatal("splitter", err)
	}
	h, err := splitterfn.New(d)
	if err != nil {
		awswire.Fatal("splitter", err)
	}
	lambda.Start(h.Handle)
}
