package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

func fptr(v float64) *float64 { return &v }

// TestCacheKeyCoversEveryOutputSetting: every setting that changes a
// model's output changes the key, an unset setting differs from every
// explicit value, and identical calls share a key.
func TestCacheKeyCoversEveryOutputSetting(t *testing.T) {
	t.Parallel()
	base := llm.Request{Model: "gpt-4o-mini", System: "Be brief.", Prompt: "为积木写文案", Temperature: fptr(0.2), TopP: fptr(0.9), MaxTokens: 200}
	baseKey := pipeline.CacheKey("openai", base, 0)
	if again := pipeline.CacheKey("openai", base, 0); again != baseKey {
		t.Fatalf("the same call hashed to %s and %s", baseKey, again)
	}
	tests := []struct {
		name     string
		provider string
		change   func(r *llm.Request)
	}{
		{"provider family", "bedrock", func(*llm.Request) {}},
		{"model", "openai", func(r *llm.Request) { r.Model = "gpt-4o" }},
		{"system prompt", "openai", func(r *llm.Request) { r.System = "Be lyrical." }},
		{"no system prompt", "openai", func(r *llm.Request) { r.System = "" }},
		{"rendered prompt", "openai", func(r *llm.Request) { r.Prompt = "为拼图写文案" }},
		{"prompt whitespace", "openai", func(r *llm.Request) { r.Prompt += " " }},
		{"temperature", "openai", func(r *llm.Request) { r.Temperature = fptr(0.3) }},
		{"temperature unset", "openai", func(r *llm.Request) { r.Temperature = nil }},
		{"temperature zero", "openai", func(r *llm.Request) { r.Temperature = fptr(0) }},
		{"top_p", "openai", func(r *llm.Request) { r.TopP = fptr(0.5) }},
		{"top_p unset", "openai", func(r *llm.Request) { r.TopP = nil }},
		{"max tokens", "openai", func(r *llm.Request) { r.MaxTokens = 201 }},
		{"max tokens unset", "openai", func(r *llm.Request) { r.MaxTokens = 0 }},
		// Fields must not run into each other.
		{"prompt moved into system", "openai", func(r *llm.Request) { r.System, r.Prompt = r.System+r.Prompt, "" }},
	}
	seen := map[string]string{baseKey: "base"}
	for _, tc := range tests {
		r := base
		tc.change(&r)
		key := pipeline.CacheKey(tc.provider, r, 0)
		if prev, dup := seen[key]; dup {
			t.Errorf("%s: same key as %s", tc.name, prev)
		}
		seen[key] = tc.name
	}
}

func TestCacheModeReuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		mode pipeline.CacheMode
		temp *float64
		want bool
	}{
		{pipeline.CacheAuto, nil, true},
		{pipeline.CacheAuto, fptr(0), true},
		{pipeline.CacheAuto, fptr(0.7), false},
		{pipeline.CacheAlways, fptr(0.7), true},
		{pipeline.CacheAlways, nil, true},
		{pipeline.CacheOff, fptr(0), false},
		{pipeline.CacheOff, nil, false},
	}
	for _, tc := range tests {
		if got := tc.mode.Reuses(store.TaskSpec{Temperature: tc.temp}); got != tc.want {
			t.Errorf("%s with temperature %v: Reuses = %v, want %v", tc.mode, tc.temp, got, tc.want)
		}
	}
	for _, s := range []string{"auto", "always", "off"} {
		if m, err := pipeline.ParseCacheMode(s); err != nil || string(m) != s {
			t.Errorf("ParseCacheMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := pipeline.ParseCacheMode("sometimes"); err == nil {
		t.Error("ParseCacheMode(sometimes): no error")
	}
}

// TestCacheTemperatureRule runs the same sheet twice as two tasks (the
// second with another batch size, so another task id) and counts the
// model calls of the second: a task asking for variety (temperature > 0)
// gets fresh samples unless the cache mode is always.
func TestCacheTemperatureRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		mode       pipeline.CacheMode
		temp       *float64
		wantCalls  int // model calls of the second task
		wantCached bool
	}{
		{"auto, temperature unset: reused", pipeline.CacheAuto, nil, 0, true},
		{"auto, temperature 0: reused", pipeline.CacheAuto, fptr(0), 0, true},
		{"auto, temperature 0.8: fresh", pipeline.CacheAuto, fptr(0.8), 20, false},
		{"always, temperature 0.8: reused", pipeline.CacheAlways, fptr(0.8), 0, true},
		{"off: fresh", pipeline.CacheOff, fptr(0), 20, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			provider := newCounting(sim.New(sim.Config{Latency: time.Millisecond}))
			e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 4, CacheMode: tc.mode})
			path := e.writeCSV("skus.csv", []string{"sku", "名称"}, productRows(20))
			var second store.Task
			for i, batchSize := range []int{10, 7} {
				spec := store.TaskSpec{Prompt: "为{{名称}}写文案", Provider: "sim", Model: "sim-1", Temperature: tc.temp, BatchSize: batchSize}
				id := pipeline.DeriveTaskID(fmt.Sprint("cache-", i), spec)
				if _, err := e.splitter.Split(context.Background(), pipeline.SplitParams{TaskID: id, Path: path, Source: "skus.csv", Spec: spec}); err != nil {
					t.Fatal(err)
				}
				second = e.runToCompletion(context.Background(), id)
			}
			total := 0
			for _, n := range provider.snapshot() {
				total += n
			}
			if got := total - 20; got != tc.wantCalls {
				t.Errorf("second task made %d model calls, want %d", got, tc.wantCalls)
			}
			rows, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: second.ID})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				if r.State != store.RowSucceeded || r.Cached != tc.wantCached {
					t.Fatalf("row %d: %s cached=%v, want succeeded cached=%v", r.No, r.State, r.Cached, tc.wantCached)
				}
				// A cached row was not billed: no tokens, no provider.
				if diff := cmp.Diff(tc.wantCached, r.InputTokens == 0 && r.Provider == ""); diff != "" {
					t.Errorf("row %d: provider %q, %d input tokens (cached=%v)", r.No, r.Provider, r.InputTokens, r.Cached)
				}
			}
		})
	}
}

// TestParseCacheTTL: the one reader of --cache-ttl and CACHE_TTL takes
// whole days and Go durations, defaults to the store's TTL, and rejects
// the rest with the value in the message.
func TestParseCacheTTL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", store.DefaultCacheTTL},
		{"30d", 30 * 24 * time.Hour},
		{"1d", 24 * time.Hour},
		{"12h", 12 * time.Hour},
		{"90m", 90 * time.Minute},
	} {
		got, err := pipeline.ParseCacheTTL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseCacheTTL(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"0d", "0", "-1h", "-2d", "d", "1.5d", "30 days", "month", "999999d"} {
		if got, err := pipeline.ParseCacheTTL(in); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", in)) {
			t.Errorf("ParseCacheTTL(%q) = %v, %v; want an error naming the value", in, got, err)
		}
	}
}
