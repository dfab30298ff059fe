package llmtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/schema"
)

// FilterMarker is what a prompt carries for a batch backend to answer it
// with a content filter error (mockserver's default marker).
const FilterMarker = "[[filter]]"

// BatchFixture returns a batch provider whose backend finishes a batch's
// lines over an hour of the returned clock, in a
// shuffled order, answering "Copy for: <prompt>" (or JSON of the columns
// asked for) and filtering a prompt with FilterMarker; with expire, a batch
// expires at the hour with half its lines done. It must clean up after t.
type BatchFixture func(t *testing.T, expire bool) (p llm.BatchProvider, clk *clock.Fake)

// RunBatch runs the provider batch conformance suite: every adapter of a
// provider batch API must match answers to their ids, class failures as
// its online calls do, and keep a cancelled or expired batch's answers.
func RunBatch(t *testing.T, newProvider BatchFixture) {
	t.Helper()
	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		p, clk := newProvider(t, false)
		cols := schema.Columns{{Name: "category", Type: schema.Enum, Values: []string{"toys", "home"}, Required: true}}
		n := max(30, p.BatchLimits().MinLines)
		var lines []llm.BatchLine
		for i := 1; i <= n; i++ {
			req := llm.Request{Prompt: fmt.Sprintf("product %d", i)}
			switch i {
			case 5:
				req.Prompt += " " + FilterMarker
			case 9:
				req.Columns = cols
			}
			lines = append(lines, llm.BatchLine{ID: fmt.Sprintf("row-%d", i), Req: req})
		}
		ctx := t.Context()
		id, err := p.SubmitBatch(ctx, "round-trip", lines)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := p.BatchStatus(ctx, id); err != nil || st.State != llm.BatchRunning || st.Total != n {
			t.Fatalf("at once: %+v %v, want running with %d lines", st, err, n)
		}
		clk.Advance(time.Hour)
		st, err := p.BatchStatus(ctx, id)
		if err != nil || st.State != llm.BatchDone || st.Completed != n-1 || st.Failed != 1 {
			t.Fatalf("after its hour: %+v %v", st, err)
		}
		results, err := p.BatchResults(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(results) != n {
			t.Fatalf("%d results, want %d", len(results), n)
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
			t.Error("results in the order sent: the backend shuffles them, so the suite proves nothing about matching by id")
		}
	})
	p0, _ := newProvider(t, false)
	lines := make([]llm.BatchLine, max(10, p0.BatchLimits().MinLines))
	for i := range lines {
		lines[i] = llm.BatchLine{ID: fmt.Sprintf("r%d", i), Req: llm.Request{Prompt: fmt.Sprintf("p%d", i)}}
	}
	for _, tc := range []struct {
		name   string
		expire bool
		after  time.Duration
		state  llm.BatchState
	}{
		{"Cancelled", false, 30 * time.Minute, llm.BatchCancelled},
		{"Expired", true, time.Hour, llm.BatchExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, clk := newProvider(t, tc.expire)
			ctx := t.Context()
			id, err := p.SubmitBatch(ctx, tc.name, lines)
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(tc.after)
			if !tc.expire {
				if err := p.CancelBatch(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			st, err := p.BatchStatus(ctx, id)
			if err != nil || st.State != tc.state {
				t.Fatalf("%+v %v, want %s", st, err, tc.state)
			}
			results, err := p.BatchResults(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			// A line the batch did not run is one with an unfinished
			// result, or with none (Bedrock writes none).
			answered := 0
			for _, r := range results {
				switch {
				case r.Err == nil:
					answered++
				case r.Err.Class == llm.ClassBatchUnfinished && r.Err.Class.Retryable():
				default:
					t.Errorf("%s: %v", r.ID, r.Err)
				}
			}
			if half := len(lines) / 2; answered != half {
				t.Errorf("%d of %d lines answered; want %d (the answers kept, the rest to send again)", answered, len(lines), half)
			}
		})
	}
	t.Run("Checks", func(t *testing.T) {
		t.Parallel()
		p, _ := newProvider(t, false)
		two := append([]llm.BatchLine{{ID: "a", Req: llm.Request{Prompt: "x"}}}, lines...)
		two[len(two)-1].ID = "a"
		if _, err := p.SubmitBatch(t.Context(), "two", two); err == nil {
			t.Error("an id used twice: want an error")
		}
		if _, err := p.SubmitBatch(t.Context(), "none", nil); err == nil {
			t.Error("no lines: want an error")
		}
	})
	t.Run("Find", func(t *testing.T) {
		// A submit whose answer was lost: the batch is found again by
		// what the caller knows of it, and only that batch.
		t.Parallel()
		p, clk := newProvider(t, false)
		ctx := t.Context()
		since := clk.Now()
		clk.Advance(2 * time.Second)
		other := make([]llm.BatchLine, max(3, p.BatchLimits().MinLines))
		for i := range other {
			other[i] = llm.BatchLine{ID: fmt.Sprintf("o%d", i), Req: llm.Request{Prompt: fmt.Sprintf("o%d", i)}}
		}
		if _, err := p.SubmitBatch(ctx, "other", other); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Second)
		id, err := p.SubmitBatch(ctx, "lost", lines)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Minute)
		q := llm.BatchQuery{Key: "lost", Lines: len(lines), Since: since}
		if got, err := p.FindBatch(ctx, q); err != nil || got != id {
			t.Errorf("FindBatch(%+v) = %q, %v; want %s", q, got, err, id)
		}
		q.Taken = map[string]bool{id: true}
		if got, err := p.FindBatch(ctx, q); err != nil || got != "" {
			t.Errorf("FindBatch with %s taken = %q, %v; want none", id, got, err)
		}
		q = llm.BatchQuery{Key: "never-sent", Lines: 7, Since: since}
		if got, err := p.FindBatch(ctx, q); err != nil || got != "" {
			t.Errorf("FindBatch of a batch never sent = %q, %v; want none", got, err)
		}
		q = llm.BatchQuery{Key: "lost", Lines: len(lines), Since: since.Add(2 * llm.FindWindow)}
		if got, err := p.FindBatch(ctx, q); err != nil || got != "" {
			t.Errorf("FindBatch since after the batch's window = %q, %v; want none", got, err)
		}
	})
}
