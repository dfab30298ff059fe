package pipeline_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// filterEvery refuses the prompts of every seventh product with the
// content filter and answers the rest through the simulator.
type filterEvery struct{ llm.Provider }

func (f filterEvery) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	for _, n := range []string{"商品7", "商品14", "商品21", "商品28", "商品35", "商品42", "商品49"} {
		if strings.HasSuffix(req.Prompt, n) {
			return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: 400, Message: "filtered " + n}
		}
	}
	return f.Provider.Generate(ctx, req)
}

// TestStatus: a task's status counts its rows by state, its failures by
// class with the last LastFailuresShown of them and the providers that
// answered; while nothing has run it has no rate and no ETA.
func TestStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filterEvery{sim.New(sim.Config{})}, pipeline.GeneratorConfig{})
	p := e.splitProducts("status", "copy for {{name}}", 50, 10)
	ctx := context.Background()

	before, err := pipeline.Status(ctx, e.store, p.TaskID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pipeline.StatusRows{Total: 50, Pending: 50}, before.Rows); diff != "" {
		t.Errorf("rows before running (-want +got):\n%s", diff)
	}
	if before.Rate != 0 || before.ETAKnown {
		t.Errorf("before running: rate %v, ETA known %v; want none", before.Rate, before.ETAKnown)
	}

	e.runToCompletion(ctx, p.TaskID)
	s, err := pipeline.Status(ctx, e.store, p.TaskID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pipeline.StatusRows{Total: 50, Succeeded: 43, Failed: 7}, s.Rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"content_filter": 7}, s.FailedByClass); diff != "" {
		t.Errorf("failures by class (-want +got):\n%s", diff)
	}
	var last []int
	for _, f := range s.LastFailures {
		last = append(last, f.No)
		if f.SheetRow != f.No+1 || !strings.Contains(f.Error, "filtered") {
			t.Errorf("failed row %+v: want sheet row %d and the provider's message", f, f.No+1)
		}
	}
	if diff := cmp.Diff([]int{21, 28, 35, 42, 49}, last); diff != "" {
		t.Errorf("last failures (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"sim": 43}, s.Providers); diff != "" {
		t.Errorf("providers (-want +got):\n%s", diff)
	}
	if s.Rate <= 0 || s.ETAKnown {
		t.Errorf("finished task: rate %v, ETA known %v; want a rate and no ETA", s.Rate, s.ETAKnown)
	}

	if _, err := pipeline.Status(ctx, e.store, "no-such-task", time.Now()); err == nil || !strings.Contains(err.Error(), "no-such-task") {
		t.Errorf("status of an unknown task: %v", err)
	}
}
