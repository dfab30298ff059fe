package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/dropdir"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/web"
)

// ServeQueue is the embedded queue of the server: one for every task, as
// on AWS, where one queue feeds the generators of all tasks.
const ServeQueue = "serve"

// Bucket is a data directory seen as the stack's bucket: incoming/,
// results/, processed/ and uploads/ lie in it where they lie in the
// bucket. A server's engine writes its results there (EngineConfig.Results).
func (d *DataDir) Bucket() (*fileblob.Store, error) {
	b, err := fileblob.New(d.Dir)
	if err != nil {
		return nil, fmt.Errorf("open data directory %s: %w", d.Dir, err)
	}
	return b, nil
}

// ServeConfig is what `batchgen serve` runs: the API, the web page, the
// drop folder and the workers over one data directory.
type ServeConfig struct {
	// Engine works every task; it exports in process and writes results to
	// Bucket.
	Engine *Engine
	Bucket *fileblob.Store
	// Listener is where the API and the page are served.
	Listener net.Listener
	// PublicURL is the server's address as clients reach it, for the upload
	// URLs it hands out (api.Config.PublicURL); "" hands them out relative
	// to the API's address, which is the page's own origin whatever name
	// the user typed (localhost or 127.0.0.1).
	PublicURL string
	// Auth authenticates API callers; PageAuth, when set, the page's.
	Auth     api.Authenticator
	PageAuth func(*http.Request) error
	// Spec is the default of API requests; DropSpec that of drop-folder
	// inputs that bring no template of their own.
	Spec, DropSpec store.TaskSpec
	// Limits are the API's and the page's; MaxInlineBytes the largest sheet
	// the page sends inside one request.
	Limits         api.Limits
	MaxInlineBytes int64
	// DropOwner owns the drop folder's tasks; DropInterval is the time
	// between its looks.
	DropOwner    string
	DropInterval time.Duration
	// Workers and SweepAfter are the WorkConfig's; Grace is how long the
	// calls in flight may take to finish when ctx ends.
	Workers    int
	SweepAfter time.Duration
	Grace      time.Duration
	// Prices estimate the tasks' cost; Metrics are served at /metrics.
	Prices  *pricing.Table
	Metrics MetricsHandler
	// QuotePace is the pace the providers' quotas allow now, for the time
	// a task's quote gives (api.Config.QuotePace).
	QuotePace func() api.QuotePace
	Logger    *slog.Logger
	// LocalOnly guards a server without API tokens: it answers only its
	// loopback names, and refuses cross-origin changes (web.LocalOnly).
	LocalOnly bool
	// Ready, when set, is called once the drop folder and the API are set
	// up, just before requests are served (the command says where).
	Ready func()
}

// MetricsHandler records the engine's metrics and serves them
// (prom.Registry).
type MetricsHandler interface {
	Handler() http.Handler
}

// Serve resumes what was in flight when the server last stopped, then
// serves the API and the page on cfg.Listener and runs the drop folder and
// the workers until ctx ends. Then it stops taking requests and work, lets
// the calls in flight finish for at most cfg.Grace, and returns.
func Serve(ctx context.Context, cfg ServeConfig) error {
	e, logger := cfg.Engine, cfg.Logger
	st := e.Data.Store
	defer cfg.Listener.Close() // closed by the server's Shutdown too; this covers the early returns
	// This process holds the data directory's lock, so every lease is
	// stale.
	resumed, err := pipeline.ResumeUnfinished(ctx, st, e.Queue, e.Exporter, time.Now())
	if err != nil {
		logger.Warn("some unfinished tasks could not be resumed; the sweeper will retry them", "error", err)
	}
	if resumed != (pipeline.ResumeReport{}) {
		logger.Info("resumed unfinished tasks", "tasks", resumed.Tasks, "batches", resumed.Batches, "exports", resumed.Exports)
	}
	tmp := filepath.Join(e.Data.Dir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return fmt.Errorf("data directory %s: %w", e.Data.Dir, UnwrapPathError(err))
	}
	intake := pipeline.NewIntake(
		pipeline.NewSplitter(st, e.Queue, pipeline.SplitterConfig{Logger: logger, Inputs: cfg.Bucket, Exports: e.Exporter}),
		cfg.Bucket, e.Exporter,
		pipeline.IntakeConfig{
			DefaultSpec: cfg.DropSpec,
			Limits:      sheet.Limits{MaxRows: cfg.Limits.MaxRows, MaxFileBytes: cfg.Limits.MaxFileBytes},
			Uploads:     pipeline.BlobUploads{Blobs: cfg.Bucket},
			Owner:       cfg.DropOwner,
			Sidecars:    true,
			BatchModes:  true,
			TempDir:     tmp,
			Logger:      logger,
		})
	folder, err := dropdir.New(dropdir.Config{Root: e.Data.Dir, Intake: intake, Interval: cfg.DropInterval, Logger: logger})
	if err != nil {
		return err
	}
	// The engine's generator prices every call (GeneratorConfig.Prices),
	// so this runtime holds a task to its spending cap.
	limits := cfg.Limits
	limits.CostCaps = true
	// Its workers run economy and auto tasks beside the online ones
	// (LocalWorkers works their batches detached).
	limits.BatchModes = true
	// It holds a task for its quote (Starter) while its workers answer the
	// sample.
	limits.Quotes = true
	handler := api.New(api.Config{
		Auth:  cfg.Auth,
		Store: st, Blobs: cfg.Bucket, Intake: intake, TempDir: tmp, Logger: logger, DefaultSpec: cfg.Spec,
		Limits:    limits,
		PublicURL: strings.TrimSuffix(cfg.PublicURL, "/"),
		Exports:   e.Exporter, Retrier: pipeline.Retrier{Store: st, Queue: e.Queue},
		Starter:   pipeline.Starter{Store: st, Queue: e.Queue, Exports: e.Exporter},
		QuotePace: cfg.QuotePace,
		Prices:    cfg.Prices,
		WaitingOn: func(id string) string {
			s, _ := e.Generator.EconomyStatus(id)
			return s.String()
		},
	})
	page := web.Config{Limits: limits, MaxInlineBytes: cfg.MaxInlineBytes, TempDir: tmp, Logger: logger, Authenticate: cfg.PageAuth}
	// Long-lived requests (event streams) end when the server stops.
	reqCtx, endRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer endRequests()
	site := web.Site(handler, cfg.Metrics.Handler(), page)
	if cfg.LocalOnly {
		_, port, err := net.SplitHostPort(cfg.Listener.Addr().String())
		if err != nil {
			return fmt.Errorf("serve: the listener's address %s: %w", cfg.Listener.Addr(), err)
		}
		site = web.LocalOnly(site, port)
	}
	srv := &http.Server{
		Handler:           site,
		ReadHeaderTimeout: 10 * time.Second,
		// No ReadTimeout: a server-wide one would also end the event
		// streams (the connection's background read fails at it, and the
		// request's context ends). The API gives each request that carries
		// a sheet a read deadline by its size instead (api.Config.UploadRate).
		// A kept-alive connection that sends nothing is closed: a client
		// cannot hold the server's sockets for ever.
		IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return reqCtx },
		ErrorLog:    slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	if cfg.Ready != nil {
		cfg.Ready()
	}
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	serveErr := make(chan error, 1)
	wg.Go(func() {
		if err := srv.Serve(cfg.Listener); !errors.Is(err, http.ErrServerClosed) {
			serveErr <- err
		}
	})
	work := Start(workCtx, st, e.Queue, e.Generator, WorkConfig{
		Workers: cfg.Workers, SweepAfter: cfg.SweepAfter, Exports: e.Exporter, Logger: logger, Metrics: e.metrics,
	})
	wg.Go(func() { _ = folder.Run(workCtx) })

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("stopping: finishing requests; rows answered so far are saved, the rest continue at the next start")
	case runErr = <-serveErr:
		runErr = fmt.Errorf("serve %s: %w", cfg.Listener.Addr(), runErr)
	}
	endRequests()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Warn("HTTP shutdown did not finish", "error", err)
	}
	// No new row starts; the calls in flight finish and are saved, for at
	// most the grace.
	work.Drain()
	if !work.Wait(cfg.Grace) {
		logger.Warn("model calls still in flight after the shutdown grace; cutting them off (their rows run again at the next start)", "grace", cfg.Grace)
	}
	work.Stop()
	stopWork()
	wg.Wait()
	return runErr
}

// CheckListen refuses to listen beyond this machine without API tokens:
// anyone who can reach the port could run jobs on the provider's account.
func CheckListen(addr string, tokens bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: want HOST:PORT, e.g. 127.0.0.1:8080", addr)
	}
	if tokens || isLoopback(host) {
		return nil
	}
	return fmt.Errorf("--addr %s listens beyond this machine, but no API tokens are set: "+
		"without tokens anyone who reaches the port could run jobs on your provider account; "+
		"listen on 127.0.0.1 or set API tokens", addr)
}

// LoadTokens reads the API tokens from the token file and the
// environment's list; nil when there are none.
func LoadTokens(file, env string) (*api.Tokens, error) {
	var list []string
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", UnwrapPathError(err))
		}
		list = append(list, string(b))
	}
	if strings.TrimSpace(env) != "" {
		list = append(list, env)
	}
	if len(list) == 0 {
		return nil, nil
	}
	tokens, err := api.ParseTokens(strings.Join(list, "\n"))
	if err != nil {
		return nil, fmt.Errorf("API tokens (--token-file, BATCHGEN_API_TOKENS): %w", err)
	}
	return tokens, nil
}

// isLoopback reports whether host names only the loopback interface.
// "localhost" counts; an empty host (all interfaces) does not.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
