package sweeperfn_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/lambdafn/sweeperfn"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

func TestSweeper(t *testing.T) {
	t.Parallel()
	e := lambdatest.NewEnv(t)
	e.SplitCSV(4, 2)
	// The messages were lost: the batches stay PENDING with nobody to
	// claim them.
	for _, d := range e.Drain() {
		if err := e.Queue.Delete(t.Context(), d.Receipt); err != nil {
			t.Fatal(err)
		}
	}
	counter := sweeperfn.NewCounter()
	h := &sweeperfn.Handler{
		Sweeper: pipeline.NewSweeper(e.Store, e.Queue, &pipeline.ExportSignal{}, pipeline.SweeperConfig{Clock: e.Clock, Logger: e.Log, Metrics: counter}),
		Counter: counter,
		Metrics: metrics.New(e.Logs, e.Clock, nil),
		Logger:  e.Log,
	}
	var ev events.EventBridgeEvent
	lambdatest.ReadJSON(t, "eventbridge-scheduled.json", &ev)
	e.Clock.Advance(6 * time.Minute)
	report, err := h.Handle(t.Context(), ev)
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if diff := cmp.Diff(pipeline.SweepReport{Requeued: 2}, report); diff != "" {
		t.Errorf("report mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{1, 2}, lambdatest.BatchNos(t, e.Drain())); diff != "" {
		t.Errorf("re-enqueued batches mismatch (-want +got):\n%s", diff)
	}
	var got map[string]any
	for _, l := range e.Logs.Lines(t) {
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
	e := lambdatest.NewEnv(t)
	h := &sweeperfn.Handler{
		Sweeper: pipeline.NewSweeper(brokenOpenBatches{e.Store}, e.Queue, &pipeline.ExportSignal{}, pipeline.SweeperConfig{Clock: e.Clock}),
		Metrics: metrics.New(e.Logs, e.Clock, nil),
	}
	_, err := h.Handle(t.Context(), events.EventBridgeEvent{})
	if err == nil || !strings.Contains(err.Error(), "index unavailable") {
		t.Fatalf("Handle = %v, want the sweep's error so the invocation counts as failed", err)
	}
}
