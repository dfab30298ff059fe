package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/embedded"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/metrics/prom"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/web"
)

// serveOptions are the flags of `batchgen serve`: run's spec and engine
// flags (the spec is the default for inputs that bring none) and the
// server's own.
type serveOptions struct {
	runOptions
	addr      string
	tokenFile string
	dropOwner string
	// dropResultFormat is --drop-result-format: the result file of
	// drop-folder inputs.
	dropResultFormat string
	dropInterval     time.Duration
	grace            time.Duration
	// limits are the API's per-deployment limits (api.Limits).
	allowModels    []string
	maxTokensLimit int
	maxBatchSize   int
	// publicURL is --public-url: the server's address as clients reach it.
	publicURL string
	// cacheScope is --cache-scope, read into runOptions.cacheScope.
	cacheScope string
	// The per-principal limits (api.Limits).
	maxActiveTasks, maxRowsPerDay, maxStreams, maxUploads int
	maxFileBytes                                          int64
	// maxInlineBytes is web.Config.MaxInlineBytes: the largest sheet the
	// page sends inside one request.
	maxInlineBytes int64
}

func newServeCmd(stdout, stderr io.Writer) *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Serve the HTTP API, the web page and the drop folder, with workers, in one process",
		Long: `Serve runs the HTTP API, the web page and the drop folder DIR/incoming/ in one process, with
the workers that run every task. A sheet put into DIR/incoming/ is run with the template
from its "prompt" sheet, else its sidecar <name>.prompt.txt, else --prompt; its result
appears as DIR/results/<name>.result.xlsx (or DIR/results/<name>.<ext>.error.txt when it
is rejected) and the input moves to DIR/processed/. Ctrl-C stops the server; rows
answered so far are saved and a restart continues what was in flight.

API callers authenticate with bearer tokens from --token-file or BATCHGEN_API_TOKENS
(NAME:SECRET entries; NAME is the principal, and each principal sees only its own tasks;
drop-folder tasks belong to --drop-owner). Without tokens the server listens on the
loopback interface only, and every caller is --drop-owner.`,
		Example: `  batchgen serve --data ./batchgen-data --prompt '为商品{{商品名称}}写一段营销文案'
  batchgen serve --addr 127.0.0.1:8080 --data ./batchgen-data --provider openai --rpm 2000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return serve(cmd.Context(), o, stdout, stderr)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen address HOST:PORT (port 0 picks a free one)")
	fs.StringVar(&o.dataDir, "data", ".batchgen", "data directory: the database, incoming/ (the drop folder), results/ and processed/")
	fs.StringVar(&o.tokenFile, "token-file", "", "API bearer tokens, one NAME:SECRET a line, each NAME its own principal (or set BATCHGEN_API_TOKENS, comma-separated); without tokens the server listens on loopback only")
	// The same default as the AWS stack's DropFolderOwner and the tasks of
	// `batchgen run`: without tokens, the page shows all of them.
	fs.StringVar(&o.dropResultFormat, "drop-result-format", "xlsx", "the result file of drop-folder inputs: xlsx (the sender's own workbook; a new one for a CSV) or csv (the input's fields, then the answers); API uploads name their own")
	fs.StringVar(&o.dropOwner, "drop-owner", pipeline.LocalOwner, "the principal that owns tasks made from the drop folder, and every caller's when there are no tokens")
	fs.DurationVar(&o.grace, "shutdown-grace", 30*time.Second, "on Ctrl-C or SIGTERM, how long model calls in flight may take to finish and be saved before they are cut off")
	fs.DurationVar(&o.dropInterval, "drop-interval", time.Second, "time between looks at the drop folder; a file is taken once it is unchanged across two looks")
	fs.StringSliceVar(&o.allowModels, "allow-models", nil, "models an API request may name, comma-separated (the default --model is always allowed); empty allows the default only")
	fs.IntVar(&o.maxTokensLimit, "max-tokens-limit", 100_000, "largest max_tokens an API request may ask for")
	fs.IntVar(&o.maxBatchSize, "max-batch-size", 1000, "largest batch_size an API request may ask for")
	fs.StringVar(&o.publicURL, "public-url", "", "the server's address as its clients reach it (https://batchgen.example.com behind a proxy), for the upload URLs it hands out; default: relative to the API's address")
	fs.StringVar(&o.cacheScope, "cache-scope", string(pipeline.CachePerPrincipal), "whose cached answers a task reuses: principal (its own principal's), or deployment (every principal's: fewer calls, but a cache hit tells anyone that someone sent the same prompt)")
	fs.IntVar(&o.maxActiveTasks, "max-active-tasks", 20, "most unfinished tasks one principal may have; another is answered 429 (0: no limit)")
	fs.IntVar(&o.maxRowsPerDay, "max-rows-per-day", 1_000_000, "most rows of the tasks one principal creates in 24 hours; a sheet that would pass it is answered 429 (0: no limit)")
	fs.IntVar(&o.maxUploads, "max-uploads", 4, "most sheets one principal may be sending at once; another is answered 429 (0: no limit)")
	fs.IntVar(&o.maxStreams, "max-streams", 20, "most progress streams (the page's live view) one principal may have open; another is answered 429 (0: no limit)")
	fs.Int64Var(&o.maxFileBytes, "max-file-bytes", pipeline.DefaultMaxInputBytes, "largest sheet accepted, through the API or the drop folder, in bytes")
	fs.Int64Var(&o.maxInlineBytes, "max-inline-bytes", 0, "largest sheet the web page sends inside one request, in bytes; it uploads a larger one to its task's upload URL, as it must behind a proxy that bounds requests (0: any sheet up to --max-file-bytes)")
	o.RegisterSpec(fs)
	o.RegisterEngine(fs)
	// A server's log is its only record of what it did.
	o.LogLevel = "info"
	fs.Lookup("log-level").DefValue = "info"
	_ = cmd.MarkFlagDirname("data")
	_ = cmd.MarkFlagFilename("prompt-file")
	return cmd
}

// serve wires the embedded adapters into the API, the drop folder and the
// workers, and runs them until ctx ends.
func serve(ctx context.Context, o serveOptions, stdout, stderr io.Writer) error {
	tokens, err := embedded.LoadTokens(o.tokenFile, os.Getenv("BATCHGEN_API_TOKENS"))
	if err != nil {
		return &report.ExitError{Code: report.Rejected, Err: err}
	}
	if err := embedded.CheckListen(o.addr, tokens != nil); err != nil {
		return &report.ExitError{Code: report.Rejected, Err: err}
	}
	if o.dropOwner == "" {
		return &report.ExitError{Code: report.Rejected, Err: errors.New("--drop-owner must not be empty")}
	}
	dropFormat, err := store.ParseResultFormat(o.dropResultFormat)
	if err != nil {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--drop-result-format: %w", err)}
	}
	scope, err := pipeline.ParseCacheScope(o.cacheScope)
	if err != nil {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--cache-scope: %w", err)}
	}
	o.runOptions.CacheScope = scope
	if o.maxActiveTasks < 0 || o.maxRowsPerDay < 0 || o.maxStreams < 0 || o.maxUploads < 0 {
		return &report.ExitError{Code: report.Rejected, Err: errors.New("--max-active-tasks, --max-rows-per-day, --max-streams and --max-uploads must be 0 (no limit) or more")}
	}
	if o.maxTokensLimit < 1 || o.maxBatchSize < 1 || o.maxFileBytes < 1 {
		return &report.ExitError{Code: report.Rejected, Err: errors.New("--max-tokens-limit, --max-batch-size and --max-file-bytes must be at least 1")}
	}
	if o.maxInlineBytes < 0 {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--max-inline-bytes %d: must not be negative (0 sends any sheet inline)", o.maxInlineBytes)}
	}
	if o.grace < 0 {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--shutdown-grace %s: must not be negative", o.grace)}
	}
	if o.dropInterval <= 0 {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--drop-interval %s: must be positive", o.dropInterval)}
	}
	if err := o.CheckSpec(); err != nil {
		return err
	}
	if !math.IsNaN(o.MaxCost) || o.Mode != "" || o.Deadline != "" {
		return &report.ExitError{Code: report.Rejected, Err: errors.New("--max-cost, --mode and --deadline are a task's own on serve: set them in the API request, on the page, or in a drop-folder input's settings file (NAME.batchgen.json)")}
	}
	j, err := newEngineJob(o.runOptions, stderr)
	if err != nil {
		return err
	}
	// Without tokens the server listens on loopback only, and its one
	// caller is the drop folder's principal, so it sees those tasks.
	var auth api.Authenticator = api.Fixed(o.dropOwner)
	access := "no API tokens are set, so only this machine can connect"
	if tokens != nil {
		auth = tokens
		access = fmt.Sprintf("API tokens for %d principal(s): %s", len(tokens.Principals()), strings.Join(tokens.Principals(), ", "))
	}
	level := new(slog.LevelVar)
	level.Set(j.LogLevel)
	logger := logging.NewJSON(stderr, level)
	j.Logger = logger
	// The engine's metrics, served at /metrics beside the API.
	reg := prom.New(logger)
	j.Metrics = reg
	spec := j.opts.TaskSpec(j.Providers)

	if err := j.OpenData(o.dataDir, ""); err != nil {
		return err
	}
	defer j.Close()
	bucket, err := j.Data.Bucket()
	if err != nil {
		return err
	}
	if err := j.OpenEngine(embedded.EngineConfig{Queue: embedded.ServeQueue, Results: bucket, InProcessExports: true}); err != nil {
		return err
	}
	dropSpec := spec
	dropSpec.ResultFormat = dropFormat
	cfg := embedded.ServeConfig{
		Engine: j.Engine, Bucket: bucket, Auth: auth, Spec: spec, DropSpec: dropSpec,
		Limits: api.Limits{
			Models: o.allowModels, ModelFixed: j.Providers.FixedModels(), MaxTokens: o.maxTokensLimit, MaxBatchSize: o.maxBatchSize,
			MaxActiveTasks: o.maxActiveTasks, MaxRowsPerDay: o.maxRowsPerDay, MaxStreams: o.maxStreams, MaxUploads: o.maxUploads,
			MaxFileBytes: o.maxFileBytes, MaxRows: o.MaxRows,
		},
		MaxInlineBytes: o.maxInlineBytes, DropOwner: o.dropOwner, DropInterval: o.dropInterval,
		Workers: pipeline.BatchesInFlight(j.Providers.Concurrency(), o.BatchSize), SweepAfter: o.SweepAfter, Grace: o.grace,
		Prices: j.Prices, Metrics: reg, Logger: logger,
		QuotePace: func() api.QuotePace {
			return api.QuotePace{RequestsPerSecond: j.Set.QuotaPace(j.Providers), Concurrency: j.Providers.Concurrency()}
		},
	}
	if tokens != nil {
		cfg.PageAuth = web.Authenticate(tokens)
	} else {
		// Every caller is trusted: only this machine's loopback names,
		// and no cross-origin changes from a page the user visits.
		cfg.LocalOnly = true
	}
	if o.publicURL != "" {
		if u, err := url.Parse(o.publicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--public-url %q: want http(s)://host[:port], as clients reach the server", o.publicURL)}
		}
	}
	cfg.PublicURL = o.publicURL
	if cfg.Listener, err = net.Listen("tcp", o.addr); err != nil {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--addr %s: %w", o.addr, err)}
	}
	cfg.Ready = func() {
		fmt.Fprintf(stdout, "batchgen serve: listening on http://%s (data: %s; drop folder: %s)\n",
			cfg.Listener.Addr(), j.Data.Dir, filepath.Join(j.Data.Dir, "incoming"))
		fmt.Fprintf(stdout, "batchgen serve: %s\n", access)
	}
	return embedded.Serve(ctx, cfg)
}
