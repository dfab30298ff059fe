package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	bedrockllm "github.com/batchgen/batchgen/internal/llm/bedrock"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/providers"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/store"
)

// Stats counts what this process's engine did, for the progress line and
// the summary of `batchgen run` and `retry`. Row totals in the summary come
// from the store, which also knows rows finished by earlier, interrupted
// runs.
type Stats struct {
	// Calls counts model calls; RateLimited those answered 429, and
	// CallErrors the other failed ones (a rate limit is the provider pacing
	// us, not a failure).
	Calls, RateLimited, CallErrors atomic.Int64
	// RowsDone and RowsFailed count rows this process finished.
	RowsDone, RowsFailed atomic.Int64
	// Last429 and LastQuotaWait are when (Unix nanoseconds, 0 for never) a
	// call was last answered 429, and when a wait for the quota limiter
	// last took long enough to slow the job: what the progress line names
	// as holding the job back.
	Last429, LastQuotaWait atomic.Int64

	mu      sync.Mutex
	classes map[string]int
}

// NewStats returns empty counts.
func NewStats() *Stats { return &Stats{classes: map[string]int{}} }

// countCall counts a model call and its outcome.
func (s *Stats) countCall(err error) {
	s.Calls.Add(1)
	switch {
	case err == nil:
	case llm.Classify(err).Class == llm.ClassRateLimited:
		s.RateLimited.Add(1)
		s.Last429.Store(time.Now().UnixNano())
	default:
		s.CallErrors.Add(1)
	}
}

// quotaWaitWorthShowing is how long a wait for the quota limiter must take
// to count as the quota holding the job back.
const quotaWaitWorthShowing = 50 * time.Millisecond

// quotaWaited records a call's wait for its provider's quota
// (pipeline.RouterConfig.OnQuotaWait).
func (s *Stats) quotaWaited(_ string, waited time.Duration) {
	if waited >= quotaWaitWorthShowing {
		s.LastQuotaWait.Store(time.Now().UnixNano())
	}
}

// Observe counts a row event (pipeline.GeneratorConfig.Observer).
func (s *Stats) Observe(e pipeline.Event) {
	if !e.State.Final() {
		return
	}
	s.RowsDone.Add(1)
	if e.State == store.RowFailed {
		s.RowsFailed.Add(1)
		s.mu.Lock()
		s.classes[e.ErrorClass]++
		s.mu.Unlock()
	}
}

// Providers builds f's providers for the embedded runtime: keys from the
// environment, Bedrock signed from the default AWS credential chain, each
// provider paced in-process to the quota given, or learnt from its headers
// and 429s where none is given (or one too high); every call and every
// quota wait counted in stats. The stack builds its own in awswire.
func Providers(ctx context.Context, f *providerfile.File, stats *Stats, logger *slog.Logger, rec metrics.Recorder) (*providers.Set, error) {
	clk := clock.Real{}
	return providers.Build(f, providers.Config{
		Builder: providers.Builder{
			Clock:   clk,
			Bedrock: func(p providerfile.Provider) (llm.Provider, error) { return bedrockProvider(ctx, p) },
			BedrockBatch: func(p providerfile.Provider) (llm.BatchProvider, error) {
				awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
				if err != nil {
					return nil, fmt.Errorf("AWS configuration: %w", err)
				}
				return providers.BedrockBatch(awsCfg, p)
			},
			Logger: logger,
		},
		Limiters: providers.Limiters{Clock: clk, Logger: logger},
		Wrap:     func(_ providerfile.Provider, lp llm.Provider) llm.Provider { return countingProvider{lp, stats} },
		Router:   pipeline.RouterConfig{Logger: logger, Metrics: rec, OnQuotaWait: stats.quotaWaited},
	})
}

// bedrockProvider builds a Bedrock provider signed from the default
// credential chain: environment, profile, SSO, the instance or task role.
// Nothing to configure here, no key.
func bedrockProvider(ctx context.Context, p providerfile.Provider) (llm.Provider, error) {
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	cfg := bedrockllm.Config{Model: p.Model, Region: p.Region, BaseURL: p.BaseURL}
	if cfg.Region == "" && awsCfg.Region == "" {
		return nil, errors.New("no AWS region: give region (--region) or set AWS_REGION")
	}
	return bedrockllm.New(bedrockllm.NewClient(awsCfg, cfg), cfg)
}

// countingProvider counts calls and their outcomes in stats.
type countingProvider struct {
	llm.Provider
	stats *Stats
}

// Generate calls the wrapped provider and counts the call and its outcome.
func (c countingProvider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	resp, err := c.Provider.Generate(ctx, req)
	c.stats.countCall(err)
	return resp, err
}

// Summarize is what `batchgen run` prints at the end of task, whose result
// was written to out, with the number of rows left without a result
// (failed, or never run in a cancelled task).
func Summarize(ctx context.Context, st store.Store, task store.Task, stats *Stats, elapsed time.Duration, out string) (report.Summary, int, error) {
	// The core's one reading of the rows (pipeline.Status), so the run
	// summary and status agree; the cached rows are only known there.
	s, err := pipeline.Status(ctx, st, task.ID, time.Now())
	if err != nil {
		return report.Summary{}, 0, fmt.Errorf("count rows of task %s: %w", task.ID, err)
	}
	c := s.Rows
	stats.mu.Lock()
	classes := maps.Clone(stats.classes)
	stats.mu.Unlock()
	return report.Summary{
		Task: task,
		Rows: report.Rows{Total: c.Total, Succeeded: c.Succeeded, Failed: c.Failed, Skipped: c.Skipped},
		Counted: &report.Counted{
			Cached: c.Cached, Calls: stats.Calls.Load(), RateLimited: stats.RateLimited.Load(), Errors: stats.CallErrors.Load(),
			Classes: classes,
		},
		Elapsed: elapsed,
		Result:  out,
	}, c.Failed + c.Pending, nil
}

// ProgressCounts are the counts the progress line reads.
func (s *Stats) ProgressCounts() report.ProgressCounts {
	return report.ProgressCounts{Done: s.RowsDone.Load(), Failed: s.RowsFailed.Load(), Last429: s.Last429.Load(), LastQuotaWait: s.LastQuotaWait.Load()}
}
