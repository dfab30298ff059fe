package lambdafn_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/lambdafn/exporterfn"
	"github.com/batchgen/batchgen/internal/lambdafn/sweeperfn"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
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
		Exporter: pipeline.NewExporter(e.store, e.blobs, pipeline.ExporterConfig{Clock: e.clock, Logger: e.log, Metrics: counter}),
		Counter:  counter,
		Metrics:  metrics.New(e.logs, e.clock, nil),
		Logger:   e.log,
	}
}

func TestExporter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.generator(sim.New(sim.Config{}), nil)
	taskID := e.splitCSV(3, 2)
	h := e.exporter()

	var in exporterfn.ExportInput
	readJSON(t, "sfn-export-input.json", &in)
	in.TaskID = taskID

	// Not ready: one of two batches done.
	ds := e.drain()
	first := []queue.Delivery{ds[0]}
	if _, err := f.handler.Handle(t.Context(), sqsEvent(t, first)); err != nil {
		t.Fatal(err)
	}
	_, err := h.Handle(t.Context(), in)
	var notReady *exporterfn.NotReadyError
	if !errors.As(err, &notReady) || !errors.Is(err, pipeline.ErrNotReady) || lambdaErrorType(err) != "NotReadyError" {
		t.Fatalf("Handle before the last batch = %v (%s), want a NotReadyError", err, lambdaErrorType(err))
	}

	if _, err := f.handler.Handle(t.Context(), sqsEvent(t, ds[1:])); err != nil {
		t.Fatal(err)
	}
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
	if got := e.get(pipeline.ResultKey(taskID)); len(got) == 0 {
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

func TestSweeper(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.splitCSV(4, 2)
	// The messages were lost: the batches stay PENDING with nobody to
	// claim them.
	for _, d := range e.drain() {
		if err := e.queue.Delete(t.Context(), d.Receipt); err != nil {
			t.Fatal(err)
		}
	}
	counter := sweeperfn.NewCounter()
	h := &sweeperfn.Handler{
		Sweeper: pipeline.NewSweeper(e.store, e.queue, &pipeline.ExportSignal{}, pipeline.SweeperConfig{Clock: e.clock, Logger: e.log, Metrics: counter}),
		Counter: counter,
		Metrics: metrics.New(e.logs, e.clock, nil),
		Logger:  e.log,
	}
	var ev events.EventBridgeEvent
	readJSON(t, "eventbridge-scheduled.json", &ev)
	e.clock.Advance(6 * time.Minute)
	report, err := h.Handle(t.Context(), ev)
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if diff := cmp.Diff(pipeline.SweepReport{Requeued: 2}, report); diff != "" {
		t.Errorf("report mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{1, 2}, batchNos(t, e.drain())); diff != "" {
		t.Errorf("re-enqueued batches mismatch (-want +got):\n%s", diff)
	}
	var got map[string]any
	for _, l := range e.logs.lines(t) {
		if _, ok := l["_aws"]; ok {
			got = l
		}
	}
	delete(got, "_aws")
	want := map[string]any{"SweeperRequeued": 2.0, "SweeperLeasesReset": 0.0, "SweeperExportsStarted": 0.0, "LeasesExpired": 0.0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics mismatch (-want +got):\n%s", diff)
	}
}

// brokenOpenBatches fails the sweeper's query.
type brokenOpenBatches struct{ store.Store }

func (brokenOpenBatches) ListOpenBatches(context.Context, store.ListOpenBatchesParams) ([]store.Batch, error) {
	return nil, errors.New("index unavailable")
}

func TestSweeperReturnsErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := &sweeperfn.Handler{
		Sweeper: pipeline.NewSweeper(brokenOpenBatches{e.store}, e.queue, &pipeline.ExportSignal{}, pipeline.SweeperConfig{Clock: e.clock}),
		Metrics: metrics.New(e.logs, e.clock, nil),
	}
	_, err := h.Handle(t.Context(), events.EventBridgeEvent{})
	if err == nil || !strings.Contains(err.Error(), "index unavailable") {
		t.Fatalf("Handle = %v, want the sweep's error so the invocation counts as failed", err)
	}
}
