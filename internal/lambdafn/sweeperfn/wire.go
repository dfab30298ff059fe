package sweeperfn

import (
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue/sqsqueue"
	"github.com/batchgen/batchgen/internal/stepfn"
)

// New builds the sweeper function's handler.
func New(d *awswire.Deps) (*Handler, error) {
	if err := d.Env.Require("TABLE_NAME", "QUEUE_URL", "STATE_MACHINE_ARN"); err != nil {
		return nil, err
	}
	counter := NewCounter()
	// A batch parked on its provider batches waits a poll between looks.
	cfg := pipeline.SweeperConfig{Clock: d.Clock, Logger: d.Logger, Metrics: counter, ParkedPoll: d.Env.ProviderBatchPoll}
	if d.TuneSweeper != nil {
		d.TuneSweeper(&cfg)
	}
	queue := sqsqueue.FromConfig(d.AWS, d.Env.QueueURL, sqsqueue.Options{DLQURL: d.Env.DLQURL, Clock: d.Clock})
	return &Handler{
		Sweeper: pipeline.NewSweeper(d.Store(nil), queue, d.Exports(stepfn.FromConfig(d.AWS, d.Env.StateMachineARN)), cfg),
		Counter: counter,
		Metrics: d.Metrics,
		Logger:  d.Logger,
	}, nil
}
