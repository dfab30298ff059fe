// Command exporter is the exporter Lambda, the export state machine's task:
// it writes a finished task's result workbook (see lambdafn.Exporter).
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/batchgen/batchgen/internal/lambdafn"
)

func main() {
	d, err := lambdafn.FromEnv(context.Background(), "exporter")
	if err != nil {
		lambdafn.Fatal("exporter", err)
	}
	h, err := d.Exporter()
	if err != nil {
		lambdafn.Fatal("exporter", err)
	}
	lambda.Start(h.Handle)
}
