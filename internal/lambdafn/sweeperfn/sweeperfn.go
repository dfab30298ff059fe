// Package sweeperfn is the sweeper Lambda: on each scheduled EventBridge
// event it runs one pipeline.Sweeper pass. The package is the whole
// function: its handler (sweeperfn.go) depends on the ports and
// aws-lambda-go/events only (TestDependencyEdges holds it to that), and New
// (wire.go) builds it from the function's environment and AWS clients for
// functions/sweeper.
package sweeperfn

import (
	"context"
	"log/slog"

	"github.com/aws/aws-lambda-go/events"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// Handler runs one compensation pass per scheduled EventBridge event.
type Handler struct {
	Sweeper *pipeline.Sweeper
	// Counter, when non-nil, accumulates the sweep's metrics (give it to
	// the pipeline.Sweeper as its SweeperConfig.Metrics, so the core's one
	// set of names reaches CloudWatch: SweeperRequeued, SweeperLeasesReset,
	// SweeperExportsStarted, LeasesExpired); it is flushed to Metrics after
	// each invocation.
	Counter *metrics.Counter
	Metrics *metrics.Emitter
	Logger  *slog.Logger
}

// NewCounter returns the Counter a sweeper function records into: the
// sweeper's counts are always reported, 0 included, so the alarms and the
// dashboard read a quiet minute as 0 rather than as missing data.
func NewCounter() *metrics.Counter {
	return metrics.NewCounter(metrics.SweeperRequeued, metrics.SweeperLeasesReset, metrics.SweeperExportsStarted)
}

// Handle sweeps once. It reports what it did even when some items failed,
// and then returns the failures: the invocation counts as an error (the
// SweeperErrorsAlarm watches those), and the next scheduled run, like
// Lambda's retry, simply sweeps again.
func (h *Handler) Handle(ctx context.Context, _ events.EventBridgeEvent) (pipeline.SweepReport, error) {
	report, err := h.Sweeper.Sweep(ctx)
	log := logger(h.Logger)
	if h.Counter != nil && h.Metrics != nil {
		if merr := h.Counter.Flush(h.Metrics, nil); merr != nil {
			log.WarnContext(ctx, "write metrics failed", "error", merr)
		}
	}
	if err != nil {
		log.ErrorContext(ctx, "sweep failed in part", "requeued", report.Requeued, "leases_reset", report.LeasesReset, "exports_started", report.ExportsStarted, "error", err)
		return report, err
	}
	if report != (pipeline.SweepReport{}) {
		log.InfoContext(ctx, "sweep", "requeued", report.Requeued, "leases_reset", report.LeasesReset, "exports_started", report.ExportsStarted,
			"batches_failed", report.BatchesFailed, "parked", report.Parked, "incomplete", report.Incomplete)
	}
	return report, nil
}

// logger returns l, or a logger that drops everything when l is nil.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
