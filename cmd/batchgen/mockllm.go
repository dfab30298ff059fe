package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/report"
)

// newMockLLMCmd serves a test model server, in OpenAI's and Anthropic's
// wire formats, until interrupted.
func newMockLLMCmd(stdout io.Writer) *cobra.Command {
	var addr, paidLog string
	var cfg mockserver.Config
	cmd := &cobra.Command{
		Use:   "mock-llm [flags]",
		Short: "Serve a test model server (OpenAI chat completions and Anthropic Messages) with latency, quotas and faults",
		Example: `  batchgen mock-llm --addr 127.0.0.1:8089 --quota 2000 --latency 290ms
  batchgen mock-llm --quota 600 --token-quota 40000 --no-ratelimit-headers`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if paidLog != "" {
				f, err := os.OpenFile(paidLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
				if err != nil {
					return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--paid-log: %w", err)}
				}
				defer f.Close()
				cfg.PaidLog = f
			}
			return serveMockLLM(cmd.Context(), addr, cfg, stdout)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&addr, "addr", "127.0.0.1:8089", "listen address HOST:PORT (port 0 picks a free one)")
	fs.DurationVar(&cfg.Latency, "latency", 290*time.Millisecond, "latency of every request")
	fs.DurationVar(&cfg.Jitter, "jitter", 0, "spread each request's latency by up to this much either way")
	fs.IntVar(&cfg.Quota, "quota", 0, "accepted requests per --quota-window; more get 429 with Retry-After (0: unlimited)")
	fs.IntVar(&cfg.TokenQuota, "token-quota", 0, "accepted tokens (prompt + max_tokens at admission, corrected to the usage) per --quota-window (0: unlimited)")
	fs.DurationVar(&cfg.QuotaWindow, "quota-window", time.Minute, "sliding window of --quota and --token-quota")
	fs.BoolVar(&cfg.NoRateLimitHeaders, "no-ratelimit-headers", false, "leave out the x-ratelimit-* and retry-after-ms headers (429s keep Retry-After), so clients must learn the quota from 429s")
	fs.Float64Var(&cfg.FailRate, "fail-rate", 0, "fraction of requests answered with a 5xx")
	fs.Float64Var(&cfg.InvalidRate, "invalid-rate", 0, "fraction of structured (JSON) answers broken on purpose, so that they fail the columns' check")
	fs.BoolVar(&cfg.NoStructuredOutputs, "no-structured-outputs", false, "refuse response_format json_schema with a 400, as servers without structured outputs do (json_object still works)")
	fs.Int64Var(&cfg.Seed, "seed", 1, "seed of the fault injection")
	fs.StringVar(&cfg.FilterMarker, "filter-marker", "[[filter]]", "prompts containing this get a 400 content_filter")
	fs.DurationVar(&cfg.BatchDelay, "batch-delay", mockserver.DefaultBatchDelay, "Batch API (/v1/files, /v1/batches): how long a batch takes to finish all its lines")
	fs.Float64Var(&cfg.BatchErrorRate, "batch-error-rate", 0, "Batch API: fraction of a batch's lines answered with an error (500) in its error file")
	fs.BoolVar(&cfg.BatchExpire, "batch-expire", false, "Batch API: a batch expires at --batch-delay with half its lines done, the rest in its error file")
	fs.IntVar(&cfg.BatchJobsLimit, "batch-jobs-limit", 0, "Batch APIs: the most batches (or Bedrock jobs) in progress at once; a create past it is refused for now, with a 429 (Bedrock: ServiceQuotaExceededException) (0: no limit)")
	fs.IntVar(&cfg.BatchQueueLimit, "batch-queue-limit", 0, "Batch API: the most lines the batches in flight may hold together (OpenAI's enqueued-token limit); a batch past it fails with token_limit_exceeded (0: no limit)")
	fs.IntVar(&cfg.BatchAnswersLost, "batch-answers-lost", 0, "Batch API: the first N batch creates create their batch and answer 502, as a create whose answer was lost (a client that sends it again pays twice)")
	fs.StringVar(&paidLog, "paid-log", "", "append one line per completion returned (the prompt, JSON-quoted) to this file, written before the answer so it survives a kill")
	return cmd
}

func serveMockLLM(ctx context.Context, addr string, cfg mockserver.Config, stdout io.Writer) error {
	if cfg.Quota < 0 || cfg.TokenQuota < 0 || cfg.FailRate < 0 || cfg.FailRate > 1 || cfg.InvalidRate < 0 || cfg.InvalidRate > 1 || cfg.Latency < 0 ||
		cfg.BatchErrorRate < 0 || cfg.BatchErrorRate > 1 || cfg.BatchDelay <= 0 {
		return &report.ExitError{Code: report.Rejected, Err: errors.New("--quota and --token-quota must be >= 0, --fail-rate, --invalid-rate and --batch-error-rate within 0..1, --latency >= 0, --batch-delay > 0")}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &report.ExitError{Code: report.Failure, Err: fmt.Errorf("listen on %s: %w", addr, err)}
	}
	fmt.Fprintf(stdout, "mock-llm listening on http://%s/v1 (Anthropic's root: http://%s; stats: http://%s/stats)\n", ln.Addr(), ln.Addr(), ln.Addr())
	if err := mockserver.New(cfg).Serve(ctx, ln); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
