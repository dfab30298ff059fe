// Command api is the HTTP API Lambda: the internal/api handler behind API
// Gateway's HTTP API, payload format 2.0 (see apifn.Handler).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
)

func main() {
	d, err := awswire.FromEnv(context.Background(), "api")
	if err != nil {
		awswire.Fatal("api", err)
	}
	h, err := apifn.New(d)
	if err != nil {
		awswire.Fatal("api", err)
	}
	lambda.Start(h.Handle)
}
