// Package splitterfn is the splitter Lambda: S3 upload events under
// incoming/ go to pipeline.Intake, which validates and splits them. The
// package is the whole function: its handler (splitterfn.go) depends on the
// ports and aws-lambda-go/events only (TestDependencyEdges holds it to
// that), and New (wire.go) builds it from the function's environment and
// AWS clients for functions/splitter.
package splitterfn

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// Handler handles S3 ObjectCreated events for the drop folder: each
// created object goes to pipeline.Intake, which decides what it is and
// splits or rejects it. A rejected input is not an error (retrying cannot
// fix a bad file); other failures return an error so that Lambda retries
// the event, and Intake is idempotent, so a retried or duplicated event
// continues one task.
type Handler struct {
	Intake *pipeline.Intake
	// Metrics, when non-nil, receives TasksSplit and TasksRejected.
	Metrics *metrics.Emitter
	Logger  *slog.Logger
}

// Handle processes every record of an S3 event. It returns an error only
// for failures a retry may fix; the records already split stay split.
func (h *Handler) Handle(ctx context.Context, ev events.S3Event) error {
	log := logger(h.Logger)
	var errs []error
	split, rejected := 0, 0
	for _, rec := range ev.Records {
		if !strings.HasPrefix(rec.EventName, "ObjectCreated:") {
			log.InfoContext(ctx, "ignoring event", "event", rec.EventName, "key", rec.S3.Object.Key)
			continue
		}
		// Keys arrive URL-encoded, with '+' for a space.
		key, err := url.QueryUnescape(rec.S3.Object.Key)
		if err != nil {
			log.ErrorContext(ctx, "ignoring object with an undecodable key", "key", rec.S3.Object.Key, "error", err)
			continue
		}
		res, err := h.Intake.Accept(ctx, key, ObjectVersion(rec.S3.Object))
		if err != nil {
			errs = append(errs, err)
		}
		switch res.Outcome {
		case pipeline.IntakeSplit:
			split++
		case pipeline.IntakeRejected:
			rejected++
		}
	}
	if h.Metrics != nil && split+rejected > 0 {
		err := h.Metrics.Emit([]metrics.Value{{Name: metrics.TasksSplit, Value: float64(split)}, {Name: metrics.TasksRejected, Value: float64(rejected)}}, nil)
		if err != nil {
			log.WarnContext(ctx, "write metrics failed", "error", err)
		}
	}
	return errors.Join(errs...)
}

// ObjectVersion is the version an S3 event names its object by: the
// version id on a versioned bucket, else the ETag.
func ObjectVersion(obj events.S3Object) string {
	if obj.VersionID != "" {
		return obj.VersionID
	}
	return obj.ETag
}

// logger returns l, or a logger that drops everything when l is nil.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
