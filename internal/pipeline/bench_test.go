package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/quota"
	"github.com/batchgen/batchgen/internal/store"
)

// benchmarkJob runs one whole job (split, generate, export) per iteration
// on the embedded adapters and reports rows/s; with rpm > 0 it also reports
// quota_ratio = elapsed / (rows / quota rate), the whole-pipeline efficiency
// against the bound the quota sets (1.0 is perfect).
func benchmarkJob(b *testing.B, rows, rpm int, latency time.Duration) {
	var elapsed time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		cfg := pipeline.GeneratorConfig{Concurrency: 32}
		if rpm > 0 {
			cfg.Limiter = quota.NewLocal(quota.LocalConfig{RPM: rpm})
		}
		e := newEnv(b, sim.New(sim.Config{Latency: latency}), cfg)
		path := e.writeCSV("in.csv", []string{"id", "name"}, productRows(rows))
		spec := store.TaskSpec{Prompt: "{{id}} {{name}}", Provider: "sim", BatchSize: 100}
		id := pipeline.DeriveTaskID(fmt.Sprint("bench", i), spec)
		b.StartTimer()
		start := time.Now()
		if _, err := e.splitter.Split(context.Background(), pipeline.SplitParams{TaskID: id, Path: path, Source: "in.csv", Spec: spec}); err != nil {
			b.Fatal(err)
		}
		task := e.runToCompletion(context.Background(), id)
		elapsed += time.Since(start)
		if task.State != store.TaskSucceeded {
			b.Fatalf("state %s", task.State)
		}
	}
	perJob := elapsed / time.Duration(b.N)
	b.ReportMetric(float64(rows)/perJob.Seconds(), "rows/s")
	if rpm > 0 {
		bound := time.Duration(float64(rows) / (float64(rpm) / 60) * float64(time.Second))
		b.ReportMetric(perJob.Seconds()/bound.Seconds(), "quota_ratio")
	}
}

// BenchmarkPipelineOverhead measures the pipeline's own cost per row with an
// instant model: the ceiling on throughput.
func BenchmarkPipelineOverhead(b *testing.B) { benchmarkJob(b, 2000, 0, 0) }

// BenchmarkPipelineQuota measures how close a quota-bound job gets to the
// quota: 600 rows at 12,000 rpm (200/s), model latency 50 ms.
func BenchmarkPipelineQuota(b *testing.B) { benchmarkJob(b, 600, 12000, 50*time.Millisecond) }
