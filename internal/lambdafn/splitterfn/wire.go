package splitterfn

import (
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue/sqsqueue"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/stepfn"
)

// New builds the splitter function's handler. Uploads made through the API
// are split with the spec recorded beside them (pipeline.BlobUploads reads those
// records).
func New(d *awswire.Deps) (*Handler, error) {
	if err := d.Env.Require("TABLE_NAME", "QUEUE_URL", "BUCKET_NAME", "STATE_MACHINE_ARN"); err != nil {
		return nil, err
	}
	// The spec's provider and model come from the providers config, as
	// the generator's routes do; a bad one fails the cold start.
	spec, err := d.Env.DropSpec()
	if err != nil {
		return nil, err
	}
	blobs := s3blob.FromConfig(d.AWS, d.Env.BucketName, s3blob.Options{})
	queue := sqsqueue.FromConfig(d.AWS, d.Env.QueueURL, sqsqueue.Options{DLQURL: d.Env.DLQURL, Clock: d.Clock})
	exports := d.Exports(stepfn.FromConfig(d.AWS, d.Env.StateMachineARN))
	intake := pipeline.NewIntake(
		pipeline.NewSplitter(d.Store(blobs), queue, pipeline.SplitterConfig{Clock: d.Clock, Logger: d.Logger, Inputs: blobs, Exports: exports,
			// Each economy batch is a provider batch of its own on the
			// stack (the generators park): make them large.
			EconomyBatchRows: pipeline.ParkedEconomyBatchRows}),
		blobs, exports,
		pipeline.IntakeConfig{
			DefaultSpec: spec,
			Limits:      sheet.Limits{MaxRows: d.Env.MaxRows, MaxFileBytes: d.Env.MaxInputBytes},
			Uploads:     pipeline.BlobUploads{Blobs: blobs},
			Owner:       d.Env.DropOwner,
			// The role may list the bucket, so a missing sidecar is a 404.
			Sidecars: true,
			// A sidecar may ask for economy or auto: the generator parks.
			BatchModes: true,
			// As the local drop folder does: taken inputs go to processed/.
			MoveTaken: true,
			TempDir:   d.TempDir,
			Clock:     d.Clock,
			Logger:    d.Logger,
		})
	return &Handler{Intake: intake, Metrics: d.Metrics, Logger: d.Logger}, nil
}
