// Command exporter is the exporter Lambda, the export state machine's task:
// it writes a finished task's result workbook (see exporterfn.Handler).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/exporterfn"
)

func main() {
	d, err := awswire.FromEnv(context.Background(), "exporter")
	if err != nil {
		awswire.Fatal("exporter", err)
	}
	h, err := exporterfn.New(d)
	if err != nil {
		awswire.Fatal("exporter", err)
	}
	lambda.Start(h.Handle)
}
