package exporterfn

import (
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// New builds the exporter function's handler.
func New(d *awswire.Deps) (*Handler, error) {
	if err := d.Env.Require("TABLE_NAME", "BUCKET_NAME"); err != nil {
		return nil, err
	}
	blobs := s3blob.FromConfig(d.AWS, d.Env.BucketName, s3blob.Options{})
	counter := metrics.NewCounter(metrics.TasksExported)
	return &Handler{
		Exporter: pipeline.NewExporter(d.Store(blobs), blobs, pipeline.ExporterConfig{Clock: d.Clock, Logger: d.Logger, Metrics: counter, TempDir: d.TempDir}),
		Counter:  counter,
		Metrics:  d.Metrics,
		Logger:   d.Logger,
	}, nil
}
