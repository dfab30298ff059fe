// Package exporterfn is the exporter Lambda, the export state machine's
// task: it writes a finished task's result workbook through
// pipeline.Exporter. The package is the whole function: its handler
// (exporterfn.go) depends on the ports only (TestDependencyEdges holds it
// to that), and New (wire.go) builds it from the function's environment and
// AWS clients for functions/exporter.
package exporterfn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// ExportInput is the exporter's event: the state machine's input
// {"task_id": "..."}.
type ExportInput struct {
	TaskID string `json:"task_id"`
}

// ExportOutput is what the exporter returns to the state machine.
type ExportOutput struct {
	TaskID        string `json:"task_id"`
	State         string `json:"state"`
	ResultKey     string `json:"result_key,omitempty"`
	RowsTotal     int    `json:"rows_total"`
	RowsSucceeded int    `json:"rows_succeeded"`
	RowsFailed    int    `json:"rows_failed"`
}

// NotReadyError is returned for a task whose batches are not all done.
// The Lambda runtime reports an error by its type name, so Step Functions
// sees Error "NotReadyError" and a Retry can name it.
type NotReadyError struct {
	TaskID string
	Err    error
}

func (e *NotReadyError) Error() string { return e.Err.Error() }
func (e *NotReadyError) Unwrap() error { return e.Err }

// ExportError is any other failure to export (store, S3, a damaged task).
// Step Functions sees Error "ExportError".
type ExportError struct {
	TaskID string
	Err    error
}

func (e *ExportError) Error() string { return e.Err.Error() }
func (e *ExportError) Unwrap() error { return e.Err }

// Handler is the export state machine's task: it runs
// pipeline.Exporter.Export and returns its errors to the state machine,
// which retries or, in its Catch, marks the task FAILED.
type Handler struct {
	Exporter *pipeline.Exporter
	// Counter, when non-nil, accumulates the export's metrics (give it to
	// the pipeline.Exporter as its ExporterConfig.Metrics: TasksExported,
	// ExportDuration, TaskDuration); it is flushed to Metrics after each
	// invocation.
	Counter *metrics.Counter
	Metrics *metrics.Emitter
	Logger  *slog.Logger
}

// Handle exports one task. Export is idempotent, so a retried or repeated
// invocation rewrites the same result or returns the finished task.
func (h *Handler) Handle(ctx context.Context, in ExportInput) (ExportOutput, error) {
	if !pipeline.ValidTaskID(in.TaskID) {
		return ExportOutput{}, &ExportError{TaskID: in.TaskID, Err: fmt.Errorf("export: invalid task_id %q in the input", in.TaskID)}
	}
	task, err := h.Exporter.Export(ctx, in.TaskID)
	if h.Counter != nil && h.Metrics != nil {
		if err := h.Counter.Flush(h.Metrics, nil); err != nil {
			logger(h.Logger).WarnContext(ctx, "write metrics failed", "error", err)
		}
	}
	if errors.Is(err, pipeline.ErrNotReady) {
		return ExportOutput{}, &NotReadyError{TaskID: in.TaskID, Err: err}
	}
	if err != nil {
		logger(h.Logger).ErrorContext(ctx, "export failed", "task_id", in.TaskID, "error", err)
		return ExportOutput{}, &ExportError{TaskID: in.TaskID, Err: err}
	}
	return ExportOutput{
		TaskID: task.ID, State: string(task.State), ResultKey: task.ResultKey,
		RowsTotal: task.RowsTotal, RowsSucceeded: task.RowsSucceeded, RowsFailed: task.RowsFailed,
	}, nil
}

// logger returns l, or a logger that drops everything when l is nil.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
