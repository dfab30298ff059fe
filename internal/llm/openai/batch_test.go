package openaillm_test

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
	"github.com/batchgen/batchgen/internal/schema"
)

// batchFixture is the adapter against the mock's Batch API on a fake
// clock.
func batchFixture(t *testing.T, cfg mockserver.Config) (*openaillm.Provider, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
	cfg.Clock, cfg.BatchDelay = clk, time.Hour
	srv := httptest.NewServer(mockserver.New(cfg))
	t.Cleanup(srv.Close)
	p, err := openaillm.New(openaillm.Config{BaseURL: srv.URL + "/v1", APIKey: "sk-batch", Model: "gpt-4o-mini"})
	if err != nil {
		t.Fatal(err)
	}
	return p, clk
}

// TestBatchRoundTrip: 30 lines go out as one batch, whose status follows
// the provider's; once done, every line's result comes back under its own
// id (answers in another order than sent), a filtered line as
// content_filter, a line of columns as an answer that fits them.
func TestBatchRoundTrip(t *testing.T) {
	t.Parallel()
	p, clk := batchFixture(t, mockserver.Config{})
	cols := schema.Columns{{Name: "category", Type: schema.Enum, Values: []string{"toys", "home"}, Required: true}}
	var lines []llm.BatchLine
	for i := 1; i <= 30; i++ {
		req := llm.Request{Prompt: fmt.Sprintf("product %d", i)}
		switch i {
		case 5:
			req.Prompt += " [[filter]]"
		case 9:
			req.Columns = cols
		}
		lines = append(lines, llm.BatchLine{ID: fmt.Sprintf("row-%d", i), Req: req})
	}
	ctx := t.Context()
	id, err := p.SubmitBatch(ctx, lines)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.BatchStatus(ctx, id); err != nil || st.State != llm.BatchRunning || st.Total != 30 {
		t.Fatalf("at once: %+v %v, want running with 30 lines", st, err)
	}
	if _, err := p.BatchResults(ctx, id); err == nil {
		t.Error("results of a running batch: want an error")
	}
	clk.Advance(time.Hour)
	st, err := p.BatchStatus(ctx, id)
	if err != nil || st.State != llm.BatchDone || st.Completed != 29 || st.Failed != 1 {
		t.Fatalf("after its delay: %+v %v", st, err)
	}
	results, err := p.BatchResults(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 30 {
		t.Fatalf("%d results, want 30", len(results))
	}
	inOrder := true
	for i, r := range results {
		var n int
		fmt.Sscanf(r.ID, "row-%d", &n)
		inOrder = inOrder && n == i+1
		switch {
		case n == 5:
			if r.Err == nil || r.Err.Class != llm.ClassContentFilter {
				t.Errorf("row 5: %+v, want content_filter", r)
			}
		case n == 9:
			if _, err := cols.Validate(r.Response.Text); r.Err != nil || err != nil {
				t.Errorf("row 9: %q (%v, %v), want an answer of its columns", r.Response.Text, r.Err, err)
			}
		case r.Err != nil || r.Response.Text != fmt.Sprintf("Copy for: product %d", n) || r.Response.Usage.OutputTokens == 0:
			t.Errorf("%s: %+v, want its own answer with its usage", r.ID, r)
		}
	}
	if inOrder {
		t.Error("results in the order sent: the mock shuffles them, so the test proves nothing about matching by id")
	}
}

// TestBatchCancelledAndExpired: a cancelled batch keeps its answers and
// gives its unfinished lines a retryable class; so does an expired one.
func TestBatchCancelledAndExpired(t *testing.T) {
	t.Parallel()
	lines := make([]llm.BatchLine, 10)
	for i := range lines {
		lines[i] = llm.BatchLine{ID: fmt.Sprintf("r%d", i), Req: llm.Request{Prompt: fmt.Sprintf("p%d", i)}}
	}
	for _, tc := range []struct {
		name  string
		cfg   mockserver.Config
		after time.Duration
		state llm.BatchState
	}{
		{"cancelled", mockserver.Config{}, 30 * time.Minute, llm.BatchCancelled},
		{"expired", mockserver.Config{BatchExpire: true}, time.Hour, llm.BatchExpired},
	} {
		p, clk := batchFixture(t, tc.cfg)
		ctx := t.Context()
		id, err := p.SubmitBatch(ctx, lines)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(tc.after)
		if tc.state == llm.BatchCancelled {
			if err := p.CancelBatch(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		st, err := p.BatchStatus(ctx, id)
		if err != nil || st.State != tc.state {
			t.Fatalf("%s: %+v %v", tc.name, st, err)
		}
		results, err := p.BatchResults(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		answered, unfinished := 0, 0
		for _, r := range results {
			switch {
			case r.Err == nil:
				answered++
			case r.Err.Class == llm.ClassBatchUnfinished && r.Err.Class.Retryable():
				unfinished++
			default:
				t.Errorf("%s: %s: %v", tc.name, r.ID, r.Err)
			}
		}
		if answered != 5 || unfinished != 5 {
			t.Errorf("%s: %d answered, %d unfinished; want 5 and 5", tc.name, answered, unfinished)
		}
	}
}

// TestSubmitBatchChecks: lines the Batch API would refuse are refused
// before anything is uploaded.
func TestSubmitBatchChecks(t *testing.T) {
	t.Parallel()
	p, _ := batchFixture(t, mockserver.Config{})
	two := []llm.BatchLine{{ID: "a", Req: llm.Request{Prompt: "x"}}, {ID: "a", Req: llm.Request{Prompt: "y"}}}
	if _, err := p.SubmitBatch(t.Context(), two); err == nil {
		t.Error("an id used twice: want an error")
	}
	if _, err := p.SubmitBatch(t.Context(), nil); err == nil {
		t.Error("no lines: want an error")
	}
}
