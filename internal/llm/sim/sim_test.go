package sim

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
)

func ptr(f float64) *float64 { return &f }

func TestGenerateIsDeterministic(t *testing.T) {
	t.Parallel()
	p := New(Config{})
	req := llm.Request{Model: "m", System: "sys", Prompt: "为商品无线耳机写一段营销文案", Temperature: ptr(0.7)}
	first, err := p.Generate(context.Background(), req)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	for i := range 3 {
		got, err := New(Config{}).Generate(context.Background(), req)
		if err != nil {
			t.Fatalf("Generate #%d: %v", i, err)
		}
		if diff := cmp.Diff(first, got); diff != "" {
			t.Fatalf("Generate #%d differs (-first +got):\n%s", i, diff)
		}
	}
	if !strings.HasPrefix(first.Text, "【sim】") {
		t.Errorf("Text = %q, want the 【sim】 prefix", first.Text)
	}
	if !strings.Contains(first.Text, "为商品无线耳机写一段营销文案") {
		t.Errorf("Text = %q, want it to quote the short prompt whole", first.Text)
	}
	if first.Usage.InputTokens <= 0 || first.Usage.OutputTokens <= 0 {
		t.Errorf("tokens = %d in / %d out, want both > 0", first.Usage.InputTokens, first.Usage.OutputTokens)
	}
	if got := p.Calls(); got != 1 {
		t.Errorf("Calls() = %d, want 1", got)
	}
}

func TestTextDependsOnEveryOutputChangingField(t *testing.T) {
	t.Parallel()
	base := llm.Request{Model: "m", System: "s", Prompt: "p", Temperature: ptr(0.5), TopP: ptr(1), MaxTokens: 100}
	tests := []struct {
		name   string
		change func(r *llm.Request)
	}{
		{"model", func(r *llm.Request) { r.Model = "m2" }},
		{"system", func(r *llm.Request) { r.System = "s2" }},
		{"prompt", func(r *llm.Request) { r.Prompt = "p2" }},
		{"temperature", func(r *llm.Request) { r.Temperature = ptr(0.6) }},
		{"temperature unset", func(r *llm.Request) { r.Temperature = nil }},
		{"top_p", func(r *llm.Request) { r.TopP = ptr(0.9) }},
		{"max tokens", func(r *llm.Request) { r.MaxTokens = 101 }},
		{"field boundary", func(r *llm.Request) { r.Model, r.System = "ms", "" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			changed := base
			tc.change(&changed)
			if requestHash(changed) == requestHash(base) {
				t.Fatalf("hash unchanged after changing %s", tc.name)
			}
		})
	}
}

func TestTextVariesAcrossPrompts(t *testing.T) {
	t.Parallel()
	// The quoted prompt differs anyway; the phrasing around it should vary
	// too, or every row of a sheet would read the same.
	shapes := map[string]bool{}
	for i := range 50 {
		p := fmt.Sprintf("row %d", i)
		shapes[strings.Replace(Text(llm.Request{Prompt: p}), p, "X", 1)] = true
	}
	if len(shapes) < 5 {
		t.Errorf("50 prompts produced %d distinct phrasings, want at least 5", len(shapes))
	}
}

func TestQuote(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("商", 50)
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"short", "hello", "hello"},
		{"whitespace collapsed", "  a\n\tb   c  ", "a b c"},
		{"exactly 40 runes", strings.Repeat("x", 40), strings.Repeat("x", 40)},
		{"cut at 40 runes", long, strings.Repeat("商", 40) + "…"},
		{"invalid utf8", "a\xffb", "a\uFFFDb"},
		{"empty", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := quote(tc.in)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("quote(%q) (-want +got):\n%s", tc.in, diff)
			}
			if !utf8.ValidString(got) {
				t.Errorf("quote(%q) = %q is not valid UTF-8", tc.in, got)
			}
		})
	}
}

// advanceUntil advances clk in small steps until done is closed, failing
// the test after a real-time deadline.
func advanceUntil(t *testing.T, clk *clock.Fake, done <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("call did not return while the fake clock advanced")
		}
		clk.Advance(10 * time.Millisecond)
		runtime.Gosched()
	}
}

func TestLatencyUsesClock(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start)
	p := New(Config{Latency: 290 * time.Millisecond, Clock: clk})
	done := make(chan struct{})
	var returnedAt time.Time
	var err error
	go func() {
		defer close(done)
		_, err = p.Generate(context.Background(), llm.Request{Prompt: "x"})
		returnedAt = clk.Now()
	}()
	advanceUntil(t, clk, done)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if elapsed := returnedAt.Sub(start); elapsed < 290*time.Millisecond {
		t.Errorf("Generate returned after %v of fake time, want >= 290ms", elapsed)
	}
}

func TestJitterStaysInRangeAndVaries(t *testing.T) {
	t.Parallel()
	p := New(Config{Latency: 100 * time.Millisecond, Jitter: 50 * time.Millisecond})
	seen := map[time.Duration]bool{}
	for i := range 200 {
		d := p.latency(requestHash(llm.Request{Prompt: fmt.Sprint(i)}))
		if d < 50*time.Millisecond || d > 150*time.Millisecond {
			t.Fatalf("latency %v outside [50ms, 150ms]", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Errorf("200 requests got %d distinct latencies, want jitter to spread them", len(seen))
	}
	clamped := New(Config{Latency: 10 * time.Millisecond, Jitter: time.Second})
	for i := range 200 {
		if d := clamped.latency(requestHash(llm.Request{Prompt: fmt.Sprint(i)})); d < 0 {
			t.Fatalf("latency %v < 0, want clamped at 0", d)
		}
	}
}

func TestContextEndsCall(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		ctx       func() (context.Context, context.CancelFunc)
		wantClass llm.ErrorClass
		wantIs    error
	}{
		{
			name: "deadline",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 20*time.Millisecond)
			},
			wantClass: llm.ClassTimeout,
			wantIs:    context.DeadlineExceeded,
		},
		{
			name: "cancel",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(20*time.Millisecond, cancel)
				return ctx, cancel
			},
			wantIs: context.Canceled,
		},
		{
			name: "already cancelled",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			wantIs: context.Canceled,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The fake clock never advances: only ctx can end the call.
			p := New(Config{Latency: time.Hour, Clock: clock.NewFake(time.Unix(0, 0))})
			ctx, cancel := tc.ctx()
			defer cancel()
			_, err := p.Generate(ctx, llm.Request{Prompt: "x"})
			if !errors.Is(err, tc.wantIs) {
				t.Fatalf("err = %v, want errors.Is %v", err, tc.wantIs)
			}
			var lerr *llm.Error
			if tc.wantClass != "" {
				if !errors.As(err, &lerr) || lerr.Class != tc.wantClass {
					t.Fatalf("err = %#v, want *llm.Error of class %s", err, tc.wantClass)
				}
			} else if errors.As(err, &lerr) {
				t.Fatalf("err = %v, want a plain cancellation, not a classified provider error", err)
			}
			if got := p.Calls(); got != 1 {
				t.Errorf("Calls() = %d, want 1", got)
			}
		})
	}
}

func TestFaultHook(t *testing.T) {
	t.Parallel()
	rateLimited := &llm.Error{Class: llm.ClassRateLimited, RetryAfter: time.Second}
	var gotCalls []int64
	p := New(Config{Fault: func(req llm.Request, call int64) error {
		gotCalls = append(gotCalls, call)
		if call == 1 {
			return rateLimited
		}
		return nil
	}})
	_, err := p.Generate(context.Background(), llm.Request{Prompt: "x"})
	if !errors.Is(err, rateLimited) {
		t.Fatalf("first call err = %v, want the scripted fault", err)
	}
	resp, err := p.Generate(context.Background(), llm.Request{Prompt: "x"})
	if err != nil {
		t.Fatalf("second call: %v", err)
	}
	if diff := cmp.Diff(Text(llm.Request{Prompt: "x"}), resp.Text); diff != "" {
		t.Errorf("second call text (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{1, 2}, gotCalls); diff != "" {
		t.Errorf("fault hook calls (-want +got):\n%s", diff)
	}
}

func BenchmarkGenerate(b *testing.B) {
	p := New(Config{})
	req := llm.Request{Model: "m", Prompt: strings.Repeat("prompt ", 30)}
	for b.Loop() {
		if _, err := p.Generate(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
