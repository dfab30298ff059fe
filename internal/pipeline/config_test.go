package pipeline_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// TestConstructorsRejectBadWiring: a use case built with a missing port or
// an invalid configuration fails at start-up, naming what is wrong, instead
// of on the first message (the nil clock behind the cancel panic).
func TestConstructorsRejectBadWiring(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	tests := []struct {
		name  string
		build func()
		want  string
	}{
		{"generator without store", func() { pipeline.NewGenerator(nil, sim.New(sim.Config{}), e.signal, pipeline.GeneratorConfig{}) }, "Store is nil"},
		{"generator with a typed nil exporter", func() {
			pipeline.NewGenerator(e.store, sim.New(sim.Config{}), (*pipeline.ExportSignal)(nil), pipeline.GeneratorConfig{})
		}, "ExportStarter is nil"},
		{"generator with negative lease", func() {
			pipeline.NewGenerator(e.store, sim.New(sim.Config{}), e.signal, pipeline.GeneratorConfig{Lease: -time.Second})
		}, "Lease -1s: must be positive"},
		{"generator with negative retry delay", func() {
			pipeline.NewGenerator(e.store, sim.New(sim.Config{}), e.signal, pipeline.GeneratorConfig{RetryDelays: []time.Duration{time.Second, -1}})
		}, "RetryDelays[1]"},
		{"splitter without queue", func() { pipeline.NewSplitter(e.store, nil, pipeline.SplitterConfig{}) }, "Queue is nil"},
		{"exporter without blobs", func() { pipeline.NewExporter(e.store, nil, pipeline.ExporterConfig{}) }, "Blobs is nil"},
		{"sweeper with negative limit", func() { pipeline.NewSweeper(e.store, e.queue, e.signal, pipeline.SweeperConfig{Limit: -1}) }, "Limit -1"},
		{"workers without generator", func() { pipeline.NewLocalWorkers(e.queue, nil, pipeline.LocalWorkersConfig{}) }, "Generator is nil"},
		{"workers with negative poll interval", func() {
			pipeline.NewLocalWorkers(e.queue, e.gen, pipeline.LocalWorkersConfig{PollInterval: -time.Millisecond})
		}, "PollInterval -1ms"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := func() (msg string) {
				defer func() { msg = fmt.Sprint(recover()) }()
				tc.build()
				return ""
			}()
			if !strings.Contains(got, tc.want) {
				t.Errorf("panic = %q, want one naming %q", got, tc.want)
			}
		})
	}
}

// TestConstructorsApplyDefaults: zero configurations are usable as they
// are: the defaults come from the constructor, not from each call site.
func TestConstructorsApplyDefaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	g := pipeline.NewGenerator(e.store, sim.New(sim.Config{}), e.signal, pipeline.GeneratorConfig{})
	if got := g.Settle(pipeline.Outcome{Err: fmt.Errorf("transient")}).Delay; got != pipeline.DefaultErrorDelay {
		t.Errorf("default error delay = %v, want %v", got, pipeline.DefaultErrorDelay)
	}
	// A sweep with a zero config has a clock: it must not panic.
	if _, err := pipeline.NewSweeper(e.store, e.queue, e.signal, pipeline.SweeperConfig{}).Sweep(t.Context()); err != nil {
		t.Errorf("sweep with defaults: %v", err)
	}
	e.splitProducts("defaults", "{{id}}", 3, 3)
}
