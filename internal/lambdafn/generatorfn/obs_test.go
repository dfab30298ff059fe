package generatorfn_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/lambdafn/generatorfn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/logging/lambdalog"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// cloudWatchUnits are the units CloudWatch accepts in EMF.
var cloudWatchUnits = []string{
	"Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
	"Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
	"Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
	"Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None",
}

// emfMetrics checks line against the EMF specification as CloudWatch reads
// it and returns its metrics' units and values.
func emfMetrics(t *testing.T, line map[string]any, stack string) (units map[string]string, values map[string]any) {
	t.Helper()
	aws, ok := line["_aws"].(map[string]any)
	if !ok {
		t.Fatalf("line without an _aws object: %v", line)
	}
	if ts, ok := aws["Timestamp"].(float64); !ok || ts <= 0 {
		t.Errorf("_aws.Timestamp = %v, want epoch milliseconds", aws["Timestamp"])
	}
	directives, ok := aws["CloudWatchMetrics"].([]any)
	if !ok || len(directives) != 1 {
		t.Fatalf("_aws.CloudWatchMetrics = %v, want one directive", aws["CloudWatchMetrics"])
	}
	d := directives[0].(map[string]any)
	if d["Namespace"] != metrics.Namespace {
		t.Errorf("Namespace = %v, want %s", d["Namespace"], metrics.Namespace)
	}
	if diff := cmp.Diff([]any{[]any{"Stack"}}, d["Dimensions"]); diff != "" {
		t.Errorf("Dimensions (-want +got):\n%s", diff)
	}
	if line["Stack"] != stack {
		t.Errorf("dimension Stack = %v, want %q (a dimension's value is a top-level string)", line["Stack"], stack)
	}
	units, values = map[string]string{}, map[string]any{}
	for _, m := range d["Metrics"].([]any) {
		def := m.(map[string]any)
		name, unit := def["Name"].(string), def["Unit"].(string)
		if !slices.Contains(cloudWatchUnits, unit) {
			t.Errorf("metric %s has unit %q, not a CloudWatch unit", name, unit)
		}
		if want, ok := metrics.Lookup(name); ok && string(cmpOr(want.Unit, metrics.Count)) != unit {
			t.Errorf("metric %s has unit %s, the catalog says %s", name, unit, want.Unit)
		}
		switch v := line[name].(type) {
		case float64:
		case []any:
			if len(v) == 0 || len(v) > metrics.MaxValues {
				t.Errorf("metric %s has %d values; EMF takes 1 to 100", name, len(v))
			}
		default:
			t.Errorf("metric %s has value %v (%T), want a number or an array of numbers", name, line[name], line[name])
		}
		units[name], values[name] = unit, line[name]
	}
	return units, values
}

func cmpOr(u, def metrics.Unit) metrics.Unit {
	if u == "" {
		return def
	}
	return u
}

// TestGeneratorEMFAndLogs: an invocation of the generator handler prints EMF
// lines CloudWatch can read (namespace batchgen, the Stack dimension, the
// catalog's units, the model-call latencies as values) and logs each batch
// outcome once, in CloudWatch's JSON log format, with the invocation's
// requestId, task_id and batch_no.
func TestGeneratorEMFAndLogs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	logs := &lambdatest.SyncBuffer{}
	f := e.generator(sim.New(sim.Config{}), nil)
	counter := generatorfn.NewCounter()
	gen := pipeline.NewGenerator(e.Store, sim.New(sim.Config{}), f.signal, pipeline.GeneratorConfig{
		Cache: e.Store, Clock: e.Clock, Logger: lambdalog.New(logs, slog.LevelInfo), Metrics: counter, Concurrency: 4,
	})
	emf := &lambdatest.SyncBuffer{}
	h := &generatorfn.Handler{
		Generator: gen, Queue: e.Queue, Counter: counter,
		Metrics: metrics.New(emf, e.Clock, map[string]string{"function": "generator", metrics.StackDimension: "prod-eu"}),
		Logger:  lambdalog.New(logs, slog.LevelInfo),
	}
	taskID := e.SplitCSV(6, 3)
	ds := e.Drain()
	ctx := lambdacontext.NewContext(context.Background(), &lambdacontext.LambdaContext{AwsRequestID: "req-42"})
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := h.Handle(ctx, lambdatest.SQSEvent(t, ds)); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	lines := emf.Lines(t)
	if len(lines) != 1 {
		t.Fatalf("%d EMF lines, want 1 per invocation", len(lines))
	}
	units, values := emfMetrics(t, lines[0], "prod-eu")
	wantUnits := map[string]string{
		"RowsSucceeded": "Count", "RowsFailed": "Count", "RowsCached": "Count", "ModelCalls": "Count", "RateLimited": "Count",
		"BatchesReleased": "Count", "MessagesFailed": "Count", "PoisonMessages": "Count",
		"InputTokens": "Count", "OutputTokens": "Count", "ModelCallLatency": "Milliseconds",
	}
	if diff := cmp.Diff(wantUnits, units); diff != "" {
		t.Errorf("EMF metrics and units (-want +got):\n%s", diff)
	}
	if lat, _ := values["ModelCallLatency"].([]any); len(lat) != 6 {
		t.Errorf("ModelCallLatency values %v, want one per call (6)", values["ModelCallLatency"])
	}
	if values["RowsSucceeded"] != 6.0 {
		t.Errorf("RowsSucceeded = %v, want 6", values["RowsSucceeded"])
	}

	done := map[float64]int{}
	for _, l := range logs.Lines(t) {
		if l["requestId"] != "req-42" || l[logging.TaskID] != taskID {
			t.Errorf("log line without the request id and task id: %v", l)
		}
		if _, ok := l["timestamp"]; !ok || l["message"] == nil {
			t.Errorf("log line not in CloudWatch's JSON log format (timestamp, message): %v", l)
		}
		if l["message"] == "batch done" {
			done[l[logging.BatchNo].(float64)]++
		}
	}
	if diff := cmp.Diff(map[float64]int{1: 1, 2: 1}, done); diff != "" {
		t.Errorf("batch done lines per batch (-want +got):\n%s", diff)
	}
}
