package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/store"
)

// packRecorder answers as the simulator does, records every request, and lets a test spoil packed answers.
type packRecorder struct {
	sim   *sim.Provider
	spoil func(req llm.Request, answer map[string]any)
	fail  func(req llm.Request) error
	mu    sync.Mutex
	reqs  []llm.Request
	usage llm.Usage
}

func (p *packRecorder) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	p.mu.Unlock()
	if p.fail != nil {
		if err := p.fail(req); err != nil {
			return llm.Response{}, err
		}
	}
	resp, err := p.sim.Generate(ctx, req)
	if err == nil && len(req.Pack) > 0 && p.spoil != nil {
		var answer map[string]any
		if err := json.Unmarshal([]byte(resp.Text), &answer); err != nil {
			return resp, err
		}
		p.spoil(req, answer)
		b, _ := json.Marshal(answer)
		resp.Text = string(b)
	}
	p.mu.Lock()
	p.usage.InputTokens += resp.Usage.InputTokens
	p.usage.OutputTokens += resp.Usage.OutputTokens
	p.mu.Unlock()
	return resp, err
}

func (p *packRecorder) calls() (packed, single int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.reqs {
		if len(r.Pack) > 0 {
			packed++
		} else {
			single++
		}
	}
	return packed, single
}

func (e *env) splitPacked(label string, n, perCall int, cols schema.Columns) pipeline.SplitParams {
	e.t.Helper()
	spec := store.TaskSpec{Prompt: "为{{name}}（{{id}}）归类", Provider: "sim", BatchSize: 10, Columns: cols, RowsPerCall: perCall}
	p := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID(label, spec), Source: "in.csv", Spec: spec,
		Path: e.writeCSV(label+".csv", []string{"id", "name"}, productRows(n))}
	if _, err := e.splitter.Split(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// TestPackedCallsAnswerEveryRow: with rows per call, a batch's rows go in packs (never across batches), every row
// gets its own answer (the simulator's answer to the row asked alone), and the task's tokens are what the provider
// billed, split over the rows.
func TestPackedCallsAnswerEveryRow(t *testing.T) {
	t.Parallel()
	for _, cols := range []schema.Columns{nil, productColumns} {
		p := &packRecorder{sim: sim.New(sim.Config{})}
		e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 3})
		sp := e.splitPacked("packed", 23, 5, cols)
		done := e.runToCompletion(context.Background(), sp.TaskID)
		if done.State != store.TaskSucceeded {
			t.Fatalf("state %s", done.State)
		}
		// Batches of 10, 10 and 3: packs of 5, 5, 5, 5 and 3.
		if packed, single := p.calls(); packed != 5 || single != 0 {
			t.Errorf("columns %v: %d packed and %d single calls, want 5 packed", cols.Names(), packed, single)
		}
		rows, _ := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: done.ID, FromNo: 1, Limit: 100})
		var sum store.Usage
		for _, r := range rows {
			alone := llm.Request{Prompt: "为" + r.Values[1] + "（" + r.Values[0] + "）归类", Columns: cols}
			want := sim.Text(alone)
			if len(cols) > 0 {
				want, _ = cols.Validate(want)
			}
			if r.State != store.RowSucceeded || r.Output != want || r.Attempts != 1 {
				t.Errorf("row %d: %s %q after %d calls, want its own answer %q", r.No, r.State, r.Output, r.Attempts, want)
			}
			sum = sum.Add(r.Usage)
		}
		if sum.InputTokens != int64(p.usage.InputTokens) || sum.OutputTokens != int64(p.usage.OutputTokens) || done.Usage != sum {
			t.Errorf("rows' tokens %+v, task %+v, provider billed %+v", sum, done.Usage, p.usage)
		}
	}
}

// TestPackedAnswersAreMatchedByID: an item left out, given twice, not fitting the columns, or under an id that
// was not asked never decides a row: each such row is asked alone, and the extra id is ignored; the other rows
// keep their packed answers, matched by id whatever the order.
func TestPackedAnswersAreMatchedByID(t *testing.T) {
	t.Parallel()
	p := &packRecorder{sim: sim.New(sim.Config{}), spoil: func(req llm.Request, answer map[string]any) {
		items := answer["answers"].([]any)
		// Reverse the order, then spoil the items of rows 2, 3 and 4 and add a stranger.
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
		var kept []any
		for _, it := range items {
			m := it.(map[string]any)
			switch m["id"] {
			case "2":
				continue // left out
			case "3":
				kept = append(kept, m) // given twice
			case "4":
				m["category"] = "玩具" // not one of the values
			}
			kept = append(kept, m)
		}
		answer["answers"] = append(kept, map[string]any{"id": "99", "category": "家居"})
	}}
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2})
	sp := e.splitPacked("by-id", 6, 6, productColumns)
	done := e.runToCompletion(context.Background(), sp.TaskID)
	if done.State != store.TaskSucceeded {
		t.Fatalf("state %s", done.State)
	}
	if packed, single := p.calls(); packed != 1 || single != 3 {
		t.Errorf("%d packed and %d single calls, want 1 and 3 (rows 2, 3 and 4 alone)", packed, single)
	}
	rows, _ := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: done.ID, FromNo: 1, Limit: 10})
	for _, r := range rows {
		want, _ := productColumns.Validate(sim.Text(llm.Request{Prompt: "为" + r.Values[1] + "（" + r.Values[0] + "）归类", Columns: productColumns}))
		wantCalls := 1
		if r.No >= 2 && r.No <= 4 {
			wantCalls = 2
		}
		if r.Output != want || r.Attempts != wantCalls {
			t.Errorf("row %d: %q after %d calls, want its own answer after %d", r.No, r.Output, r.Attempts, wantCalls)
		}
	}
}

// TestPackRefusedAsksEachRowAlone: a packed call refused for good (one row's content filtered, say) does not fail
// its rows: each is asked alone, and only the row the filter was about fails.
func TestPackRefusedAsksEachRowAlone(t *testing.T) {
	t.Parallel()
	p := &packRecorder{sim: sim.New(sim.Config{}), fail: func(req llm.Request) error {
		if strings.Contains(req.Prompt, "商品3") {
			return &llm.Error{Class: llm.ClassContentFilter, Message: "filtered"}
		}
		return nil
	}}
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2})
	sp := e.splitPacked("refused", 5, 5, nil)
	done := e.runToCompletion(context.Background(), sp.TaskID)
	rows, _ := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: done.ID, FromNo: 1, Limit: 10})
	for _, r := range rows {
		if (r.No == 3) != (r.State == store.RowFailed) || (r.No == 3 && r.ErrorClass != string(llm.ClassContentFilter)) {
			t.Errorf("row %d: %s %s", r.No, r.State, r.ErrorClass)
		}
	}
	if packed, single := p.calls(); packed != 1 || single != 5 {
		t.Errorf("%d packed and %d single calls, want 1 and 5", packed, single)
	}
}

// TestPackedAnswersAreCachedPerRow: the cache stays per row: the same rows packed the same way again are answered
// by the cache, with no call.
func TestPackedAnswersAreCachedPerRow(t *testing.T) {
	t.Parallel()
	p := &packRecorder{sim: sim.New(sim.Config{})}
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2})
	e.runToCompletion(context.Background(), e.splitPacked("cache-a", 8, 4, nil).TaskID)
	before, _ := p.calls()
	again := e.runToCompletion(context.Background(), e.splitPacked("cache-b", 8, 4, nil).TaskID)
	if after, single := p.calls(); after != before || single != 0 {
		t.Errorf("%d more packed calls, %d single, want none: the cache answers", after-before, single)
	}
	if again.State != store.TaskSucceeded {
		t.Errorf("state %s", again.State)
	}
}

// TestRowsPerCallBounds: rows per call over 100, or below 0, is refused before anything is written.
func TestRowsPerCallBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, pipeline.GeneratorConfig{})
	for _, n := range []int{-1, 101} {
		spec := store.TaskSpec{Prompt: "{{id}}", Provider: "sim", BatchSize: 10, RowsPerCall: n}
		_, err := e.splitter.Split(context.Background(), pipeline.SplitParams{TaskID: "bounds", Source: "in.csv", Spec: spec,
			Path: e.writeCSV("in.csv", []string{"id"}, [][]string{{"1"}})})
		var rejected *pipeline.RejectedError
		if !errors.As(err, &rejected) || !strings.Contains(err.Error(), "must be between 1 and 100") {
			t.Errorf("rows per call %d: %v", n, err)
		}
	}
}

// TestPacksFitTheTokenBudget: rows are packed up to RowsPerCall or until the next would take the pack's prompt
// past the budget (a quarter of the token quota), whichever comes first.
func TestPacksFitTheTokenBudget(t *testing.T) {
	t.Parallel()
	p := &packRecorder{sim: sim.New(sim.Config{})}
	e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2, PackTokens: 40})
	e.runToCompletion(context.Background(), e.splitPacked("budget", 10, 10, nil).TaskID)
	p.mu.Lock()
	defer p.mu.Unlock()
	rows := 0
	for _, r := range p.reqs {
		n := max(len(r.Pack), 1)
		rows += n
		tokens := 0
		for _, it := range r.Pack {
			tokens += llm.EstimateTokens(it.Prompt)
		}
		if n > 1 && tokens > 40 {
			t.Errorf("a pack of %d rows carries %d prompt tokens, over the budget of 40", n, tokens)
		}
	}
	if rows != 10 || len(p.reqs) < 3 || len(p.reqs) > 8 {
		t.Errorf("%d calls for %d rows; want the 10 rows in a few packs under the budget", len(p.reqs), rows)
	}
}
