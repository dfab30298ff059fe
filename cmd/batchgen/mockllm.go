package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// cmdMockLLM serves an OpenAI-compatible test server until ctx ends.
func cmdMockLLM(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("batchgen mock-llm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8089", "listen address HOST:PORT (port 0 picks a free one)")
	var cfg mockserver.Config
	fs.DurationVar(&cfg.Latency, "latency", 290*time.Millisecond, "latency of every request")
	fs.DurationVar(&cfg.Jitter, "jitter", 0, "random extra latency up to this much")
	fs.IntVar(&cfg.Quota, "quota", 0, "accepted requests per --quota-window; more get 429 with Retry-After (0: unlimited)")
	fs.DurationVar(&cfg.QuotaWindow, "quota-window", time.Minute, "sliding window of --quota")
	fs.Float64Var(&cfg.FailRate, "fail-rate", 0, "fraction of requests answered with a 5xx")
	fs.Int64Var(&cfg.Seed, "seed", 1, "seed of the fault injection")
	fs.StringVar(&cfg.FilterMarker, "filter-marker", "[[filter]]", "prompts containing this get a 400 content_filter")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &exitError{code: exitRejected}
	}
	if cfg.Quota < 0 || cfg.FailRate < 0 || cfg.FailRate > 1 || cfg.Latency < 0 {
		return &exitError{code: exitRejected, err: errors.New("--quota must be >= 0, --fail-rate within 0..1, --latency >= 0")}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("listen on %s: %w", *addr, err)}
	}
	fmt.Fprintf(stdout, "mock-llm listening on http://%s/v1 (stats: http://%s/stats)\n", ln.Addr(), ln.Addr())
	if err := mockserver.New(cfg).Serve(ctx, ln); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
