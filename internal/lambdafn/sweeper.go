package lambdafn

import (
	"context"
	"log/slog"

	"github.com/aws/aws-lambda-go/events"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// Sweeper runs one compensation pass per scheduled EventBridge event.
type Sweeper struct {
	Sweeper *pipeline.Sweeper
	// Metrics, when non-nil, receives SweeperRequeued,
	// SweeperLeasesReset and SweeperExportsStarted.
	Metrics *metrics.Emitter
	Logger  *slog.Logger
}

// Handle sweeps once. It reports what it did even when some items failed,
// and then returns the failures: the invocation counts as an error (the
// SweeperErrorsAlarm watches those), and the next scheduled run, like
// Lambda's retry, simply sweeps again.
func (h *Sweeper) Handle(ctx context.Context, _ events.EventBridgeEvent) (pipeline.SweepReport, error) {
	report, err := h.Sweeper.Sweep(ctx)
	log := discard(h.Logger)
	if h.Metrics != nil {
		merr := h.Metrics.Emit([]metrics.Value{
			{Name: metrics.SweeperRequeued, Value: float64(report.Requeued)},
			{Name: metrics.SweeperLeasesReset, Value: float64(report.LeasesReset)},
			{Name: metrics.SweeperExportsStarted, Value: float64(report.ExportsStarted)},
		}, nil)
		if merr != nil {
			log.Warn("write metrics failed", "error", merr)
		}
	}
	if err != nil {
		log.Error("sweep failed in part", "requeued", report.Requeued, "leases_reset", report.LeasesReset, "exports_started", report.ExportsStarted, "error", err)
		return report, err
	}
	if report != (pipeline.SweepReport{}) {
		log.Info("sweep", "requeued", report.Requeued, "leases_reset", report.LeasesReset, "exports_started", report.ExportsStarted,
			"batches_failed", report.BatchesFailed, "parked", report.Parked, "incomplete", report.Incomplete)
	}
	return report, nil
}
