// Package llmtest is the conformance suite of the llm.Provider port: every
// adapter (sim, openai, bedrock) runs it against a backend it scripts to
// answer, throttle, fail, refuse, filter or hang, and must give the
// pipeline the same answers: text with usage, and errors of the same class
// for the same kind of failure.
package llmtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/schema"
)

// Behavior is what the backend behind a provider does with every call.
type Behavior string

// Behaviors a fixture must script.
const (
	// Answer answers with some text and non-zero token counts; a request
	// with columns with a JSON object of their shape, built from the schema
	// the backend received.
	Answer Behavior = "answer"
	// Throttle refuses for now: too many requests (HTTP 429,
	// ThrottlingException).
	Throttle Behavior = "throttle"
	// Overload fails on the provider's side (HTTP 5xx, ServiceUnavailable).
	Overload Behavior = "overload"
	// Reject finds the request invalid (HTTP 400, ValidationException).
	Reject Behavior = "reject"
	// Deny refuses the caller (HTTP 401/403, AccessDeniedException).
	Deny Behavior = "deny"
	// Filter stops the answer by a content filter or guardrail.
	Filter Behavior = "filter"
	// Hang never answers (until the caller gives up).
	Hang Behavior = "hang"
)

// Fixture returns a provider whose backend behaves as b for every call.
// It must clean up after t.
type Fixture func(t *testing.T, b Behavior) llm.Provider

// Run runs the conformance suite against the providers newProvider makes.
func Run(t *testing.T, newProvider Fixture) {
	t.Helper()
	req := llm.Request{Model: "contract-model", System: "Be brief.", Prompt: "为积木写一句文案"}
	t.Run("Answer", func(t *testing.T) {
		t.Parallel()
		resp, err := newProvider(t, Answer).Generate(t.Context(), req)
		if err != nil {
			t.Fatalf("Generate: %v", err)
		}
		if resp.Text == "" {
			t.Error("empty text")
		}
		if resp.Usage.InputTokens <= 0 || resp.Usage.OutputTokens <= 0 {
			t.Errorf("usage %+v: want input and output tokens", resp.Usage)
		}
		if resp.Usage.CachedInputTokens > resp.Usage.InputTokens {
			t.Errorf("usage %+v: cached input tokens are part of the input tokens", resp.Usage)
		}
	})
	t.Run("Columns", func(t *testing.T) {
		// A request with columns is answered with an object of their
		// shape, which the pipeline's check accepts: the adapter asked for
		// it the way its API can (structured outputs, a forced tool), and
		// returned it as the answer's text.
		t.Parallel()
		cols := schema.Columns{
			{Name: "category", Type: schema.Enum, Values: []string{"家居", "数码"}, Required: true},
			{Name: "price", Type: schema.Number, Required: true}, {Name: "units", Type: schema.Integer},
			{Name: "giftable", Type: schema.Boolean, Required: true}, {Name: "launched", Type: schema.Date},
			{Name: "tags", Type: schema.List}, {Name: "summary", Type: schema.Text, Required: true},
		}
		r := req
		r.Columns = cols
		resp, err := newProvider(t, Answer).Generate(t.Context(), r)
		if err != nil {
			t.Fatalf("Generate: %v", err)
		}
		if _, err := cols.Validate(resp.Text); err != nil {
			t.Errorf("answer %s does not fit the columns: %v", resp.Text, err)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		p := newProvider(t, Answer)
		var wg sync.WaitGroup
		errs := make([]error, 16)
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = p.Generate(t.Context(), req)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Errorf("concurrent calls: %v", err)
		}
	})
	failures := []struct {
		b         Behavior
		class     llm.ErrorClass
		retryable bool
		fatal     bool
	}{
		{Throttle, llm.ClassRateLimited, true, false},
		{Overload, llm.ClassServer, true, false},
		{Reject, llm.ClassBadRequest, false, false},
		{Deny, llm.ClassAuth, false, true},
		{Filter, llm.ClassContentFilter, false, false},
	}
	for _, f := range failures {
		t.Run(string(f.b), func(t *testing.T) {
			t.Parallel()
			_, err := newProvider(t, f.b).Generate(t.Context(), req)
			var e *llm.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T): want an *llm.Error", err, err)
			}
			if e.Class != f.class || e.Class.Retryable() != f.retryable || e.Class.Fatal() != f.fatal {
				t.Errorf("class %s (retryable %v, fatal %v), want %s (retryable %v, fatal %v); error: %v",
					e.Class, e.Class.Retryable(), e.Class.Fatal(), f.class, f.retryable, f.fatal, e)
			}
			if e.Error() == "" {
				t.Error("empty error message")
			}
		})
	}
	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := newProvider(t, Hang).Generate(ctx, req)
		if e := llm.Classify(err); e == nil || e.Class != llm.ClassTimeout {
			t.Errorf("call past its deadline: %v, want class timeout", err)
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		p := newProvider(t, Hang)
		done := make(chan error, 1)
		go func() {
			_, err := p.Generate(ctx, req)
			done <- err
		}()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled call: %v, want context.Canceled (not a row failure)", err)
		}
	})
}
