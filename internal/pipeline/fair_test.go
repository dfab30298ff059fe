package pipeline_test

import (
	"cmp"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// TestPrincipalsTakeTurns: one principal's 40-batch task is split first, a
// second principal's 4-batch task after it, into the one queue a server's
// workers share. The workers serve the two principals in turn, so the small
// task is done after about 8 batches, not after the large task's 40; and a
// batch message carries its task's principal as its group, also when the
// sweeper or a resume sends it again.
func TestPrincipalsTakeTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{Latency: 2 * time.Millisecond}), pipeline.GeneratorConfig{Concurrency: 1})
	split := func(label, owner string, rows int) string {
		t.Helper()
		spec := store.TaskSpec{Prompt: "{{id}} " + label, Provider: "sim", BatchSize: 1}
		p := pipeline.SplitParams{
			TaskID: pipeline.DeriveTaskID(label, spec), Source: label + ".csv", Spec: spec, Owner: owner,
			Path: e.writeCSV(label+".csv", []string{"id", "name"}, productRows(rows)),
		}
		if _, err := e.splitter.Split(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p.TaskID
	}
	big := split("big", "alice", 40)
	small := split("small", "bob", 4)

	// The groups of the messages as sent.
	ds, err := e.queue.Receive(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]string{}
	for _, d := range ds {
		m, err := pipeline.DecodeBatchMessage(d.Body)
		if err != nil {
			t.Fatal(err)
		}
		groups[m.TaskID] = d.Group
		if m.Owner != d.Group {
			t.Errorf("batch %s/%d: body names owner %q, sent in group %q", m.TaskID, m.BatchNo, m.Owner, d.Group)
		}
		if err := e.queue.ChangeVisibility(ctx, d.Receipt, 0); err != nil {
			t.Fatal(err)
		}
	}
	if groups[big] != "alice" || groups[small] != "bob" {
		t.Errorf("message groups %v, want the big task's alice and the small task's bob", groups)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	workers := pipeline.NewLocalWorkers(e.queue, e.gen, pipeline.LocalWorkersConfig{Workers: 1, PollInterval: 2 * time.Millisecond})
	var wg sync.WaitGroup
	wg.Go(func() { _ = workers.Run(wctx) })
	defer wg.Wait()
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case id := <-e.signal.C():
			done = id == small
		case <-timeout:
			t.Fatal("the small task did not finish within 30 s")
		}
	}
	stop()
	wg.Wait()
	b, err := e.store.GetTask(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	// In turn: the small task's 4 batches alternate with the big one's, so
	// about 4 of the big task's are done (5 with the one a worker holds).
	if b.BatchesDone > 6 {
		t.Errorf("the big task had %d of its 40 batches done when the small task of 4 finished; the principals were not served in turn", b.BatchesDone)
	}
}

// TestCacheIsPerPrincipal: bob's task asks the prompts alice's asked
// before. By default his rows are called, not answered from her cache (a
// hit would tell him she sent them); with CacheShared they are reused.
func TestCacheIsPerPrincipal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scope     pipeline.CacheScope
		wantCalls int
	}{
		{"", 2 * 5},
		{pipeline.CacheShared, 5},
	} {
		t.Run(string(cmp.Or(tc.scope, pipeline.CachePerPrincipal)), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			provider := newCounting(sim.New(sim.Config{}))
			e := newEnv(t, provider, pipeline.GeneratorConfig{CacheScope: tc.scope})
			for _, owner := range []string{"alice", "bob"} {
				spec := store.TaskSpec{Prompt: "{{id}} {{name}}", Provider: "sim", BatchSize: 5}
				p := pipeline.SplitParams{
					TaskID: pipeline.DeriveTaskID(owner, spec), Source: owner + ".csv", Spec: spec, Owner: owner,
					Path: e.writeCSV(owner+".csv", []string{"id", "name"}, productRows(5)),
				}
				if _, err := e.splitter.Split(ctx, p); err != nil {
					t.Fatal(err)
				}
				if done := e.runToCompletion(ctx, p.TaskID); done.State != store.TaskSucceeded {
					t.Fatalf("%s's task: %s", owner, done.State)
				}
			}
			calls := 0
			for _, n := range provider.snapshot() {
				calls += n
			}
			if calls != tc.wantCalls {
				t.Errorf("%d model calls for two principals' same 5 prompts, want %d", calls, tc.wantCalls)
			}
		})
	}
}
