// Command api is the HTTP API Lambda: the internal/api handler behind API
// Gateway's HTTP API, payload format 2.0 (see lambdafn.HTTP).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/lambdafn"
)

func main() {
	d, err := lambdafn.FromEnv(context.Background(), "api")
	if err != nil {
		lambdafn.Fatal("api", err)
	}
	h, err := d.HTTP()
	if err != nil {
		lambdafn.Fatal("api", err)
	}
	lambda.Start(h.Handle)
}
