package exporterfn_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/lambdafn/exporterfn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
)

// lambdaErrorType is the name the Lambda Go runtime reports an error by
// (and Step Functions matches in Retry and Catch): its type's name.
func lambdaErrorType(err error) string {
	t := reflect.TypeOf(err)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

func (e *env) exporter() *exporterfn.Handler {
	counter := metrics.NewCounter(metrics.TasksExported)
	return &exporterfn.Handler{
		Exporter: pipeline.NewExporter(e.Store, e.Blobs, pipeline.ExporterConfig{Clock: e.Clock, Logger: e.Log, Metrics: counter}),
		Counter:  counter,
		Metrics:  metrics.New(e.Logs, e.Clock, nil),
		Logger:   e.Log,
	}
}

func TestExporter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	taskID := e.SplitCSV(3, 2)
	// The batches are answered by the core's generator: what the
	// generator function does around it is its own package's test.
	gen := pipeline.NewGenerator(e.Store, sim.New(sim.Config{}), &pipeline.ExportSignal{}, pipeline.GeneratorConfig{Clock: e.Clock, Owner: "test"})
	generate := func(ds []queue.Delivery) {
		t.Helper()
		for _, d := range ds {
			if out := gen.Process(t.Context(), pipeline.Delivery{Body: d.Body, ReceiveCount: d.ReceiveCount}); out.Err != nil || !out.Ack {
				t.Fatalf("batch message %s: %+v", d.ID, out)
			}
		}
	}
	h := e.exporter()

	var in exporterfn.ExportInput
	lambdatest.ReadJSON(t, "sfn-export-input.json", &in)
	in.TaskID = taskID

	// Not ready: one of two batches done.
	ds := e.Drain()
	first := []queue.Delivery{ds[0]}
	generate(first)
	_, err := h.Handle(t.Context(), in)
	var notReady *exporterfn.NotReadyError
	if !errors.As(err, &notReady) || !errors.Is(err, pipeline.ErrNotReady) || lambdaErrorType(err) != "NotReadyError" {
		t.Fatalf("Handle before the last batch = %v (%s), want a NotReadyError", err, lambdaErrorType(err))
	}

	generate(ds[1:])
	for range 2 { // idempotent: a retried invocation returns the same
		out, err := h.Handle(t.Context(), in)
		if err != nil {
			t.Fatalf("Handle: %v", err)
		}
		want := exporterfn.ExportOutput{
			TaskID: taskID, State: "SUCCEEDED", ResultKey: "results/" + taskID + ".xlsx",
			RowsTotal: 3, RowsSucceeded: 3,
		}
		if diff := cmp.Diff(want, out); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
	}
	if got := e.Get(pipeline.ResultKey(taskID)); len(got) == 0 {
		t.Error("the result workbook is empty")
	}
}

func TestExporterErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, taskID, wantType string
	}{
		{"unknown task", "no-such-task", "ExportError"},
		{"invalid task id", "../x", "ExportError"},
		{"empty input", "", "ExportError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			_, err := e.exporter().Handle(t.Context(), exporterfn.ExportInput{TaskID: tc.taskID})
			if err == nil || lambdaErrorType(err) != tc.wantType {
				t.Fatalf("Handle = %v (%s), want a %s", err, lambdaErrorType(err), tc.wantType)
			}
		})
	}
}
