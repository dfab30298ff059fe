package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/batchgen/batchgen/internal/embedded"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/providers"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// runOptions are the flags of `batchgen run`.
type runOptions struct {
	in, out         string
	prompt, promptF string
	system          string
	// columns and schemaFile are --columns and --schema; cols is what
	// checkSpec read from either.
	columns, schemaFile string
	cols                schema.Columns
	rowsPerCall         int
	sheetName           string
	encoding            string
	dataDir             string
	batchSize           int
	maxRows             int
	concurrency         int
	rpm                 int
	tpm                 int
	noCache             bool
	cacheMode           string
	// cacheScope is serve's --cache-scope; run's one principal shares.
	cacheScope pipeline.CacheScope
	// cacheTTL is --cache-ttl, read by pipeline.ParseCacheTTL.
	cacheTTL string
	prices   string
	// maxCost is --max-cost: NaN when not given.
	maxCost float64
	// mode and deadline are --mode and --deadline ("" when not given),
	// parsedMode and parsedDeadline what they say.
	mode, deadline string
	parsedMode     store.Mode
	parsedDeadline time.Time
	// batchPoll is how often a provider batch is asked for its state.
	batchPoll        time.Duration
	quiet            bool
	logLevel         string
	progressInterval time.Duration
	sweepAfter       time.Duration
	provider         providerOptions
	retry            retryOptions
}

// retryOptions tune retries; mostly for tests and impatient operators.
type retryOptions struct {
	callsPerRound int
	rounds        int
	delays        string
	callTimeout   time.Duration
	lease         time.Duration
}

func (o *runOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.in, "in", "", "input spreadsheet (.xlsx or .csv); required")
	fs.StringVar(&o.out, "out", "", "result file: .xlsx (your workbook with the answers beside the rows) or .csv (the input's fields, then the answers); default <in>.result.xlsx beside the input")
	fs.StringVar(&o.sheetName, "sheet", "", "input sheet name; default the first visible sheet not named \"prompt\"")
	fs.StringVar(&o.encoding, "encoding", "", "text encoding of a CSV input: utf-8, windows-1252 (latin1), gb18030 (gbk), big5, shift_jis, ...; default: detected")
	fs.StringVar(&o.dataDir, "data", "", "state directory (SQLite database, result blobs); default .batchgen beside the input")
	o.registerSpec(fs)
	o.registerEngine(fs)
}

// registerSpec registers the flags of what a task runs and how its input
// is bounded: run's own, and serve's default for inputs that bring none.
func (o *runOptions) registerSpec(fs *pflag.FlagSet) {
	fs.StringVar(&o.prompt, "prompt", "", "prompt template with {{column}} placeholders")
	fs.StringVar(&o.promptF, "prompt-file", "", "file holding the prompt template")
	fs.StringVar(&o.system, "system", "", "system prompt")
	fs.StringVar(&o.columns, "columns", "", "answer as typed output columns instead of one text: 'name:type, ...' with types "+schema.TypeNames()+"; a trailing ! makes a column required (category:enum(a|b)!, score:number, summary)")
	fs.StringVar(&o.schemaFile, "schema", "", "JSON Schema file of an object whose properties, in order, are the output columns (descriptions are passed to the model); instead of --columns")
	fs.IntVar(&o.batchSize, "batch-size", pipeline.DefaultBatchSize, "rows per batch")
	fs.IntVar(&o.rowsPerCall, "rows-per-call", 1, "rows answered by one model call (1 to 100): many short rows a request when the request quota, not the token quota, is the wall; each answer is matched to its row by id, and a row the call did not answer is asked alone")
	fs.IntVar(&o.maxRows, "max-rows", 200_000, "reject inputs with more data rows than this")
}

// checkSpec validates the flags registerSpec registers and reads
// --prompt-file into the prompt.
func (o *runOptions) checkSpec() error {
	reject := func(format string, a ...any) error {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf(format, a...)}
	}
	if o.prompt != "" && o.promptF != "" {
		return reject("--prompt and --prompt-file are both set; use one")
	}
	if o.promptF != "" {
		b, err := os.ReadFile(o.promptF)
		if err != nil {
			return reject("--prompt-file: %w", embedded.UnwrapPathError(err))
		}
		o.prompt = strings.TrimRight(string(b), "\r\n")
		if strings.TrimSpace(o.prompt) == "" {
			return reject("--prompt-file %s is empty", o.promptF)
		}
	}
	if o.columns != "" && o.schemaFile != "" {
		return reject("--columns and --schema are both set; use one")
	}
	if o.columns != "" {
		cols, err := schema.ParseShort(o.columns)
		if err != nil {
			return reject("--columns: %w", err)
		}
		o.cols = cols
	}
	if o.schemaFile != "" {
		b, err := os.ReadFile(o.schemaFile)
		if err != nil {
			return reject("--schema: %w", embedded.UnwrapPathError(err))
		}
		cols, err := schema.ParseJSONSchema(b)
		if err != nil {
			return reject("--schema %s: %w", o.schemaFile, err)
		}
		o.cols = cols
	}
	if o.batchSize < 1 || o.batchSize > 1000 {
		return reject("--batch-size %d: must be between 1 and 1000", o.batchSize)
	}
	if o.rowsPerCall < 1 || o.rowsPerCall > schema.MaxRowsPerCall {
		return reject("--rows-per-call %d: must be between 1 and %d", o.rowsPerCall, schema.MaxRowsPerCall)
	}
	if o.maxRows < 1 {
		return reject("--max-rows %d: must be at least 1", o.maxRows)
	}
	return nil
}

// taskSpec is the task spec the flags ask for.
func (j *runJob) taskSpec() store.TaskSpec {
	o := &j.opts
	return j.providers.Spec(store.TaskSpec{
		Prompt: o.prompt, System: o.system,
		Temperature: o.provider.temperaturePtr(), MaxTokens: o.provider.maxTokens, BatchSize: o.batchSize,
		Columns: o.cols, RowsPerCall: rowsPerCall(o.rowsPerCall),
	})
}

// rowsPerCall is a spec's RowsPerCall for --rows-per-call n: 0 for one row
// a call, so that a task asked as before keeps its id.
func rowsPerCall(n int) int {
	if n <= 1 {
		return 0
	}
	return n
}

// registerEngine registers the flags of everything that calls the model:
// run and retry.
func (o *runOptions) registerEngine(fs *pflag.FlagSet) {
	fs.IntVar(&o.concurrency, "concurrency", 8, "model calls in flight at once")
	fs.IntVar(&o.rpm, "rpm", 0, "provider quota in requests per minute across the job (0: learn it from the provider's rate-limit headers and 429s)")
	fs.IntVar(&o.tpm, "tpm", 0, "provider quota in tokens (prompt + completion) per minute across the job (0: learn it like --rpm)")
	fs.BoolVar(&o.noCache, "no-cache", false, "call the model even for prompts answered before (same as --cache off)")
	fs.StringVar(&o.cacheMode, "cache", "auto", "reuse outputs cached for identical calls: auto (unless --temperature > 0), always, or off")
	fs.StringVar(&o.cacheTTL, "cache-ttl", "30d", "how long a cached output is reused: whole days (30d) or a duration (12h)")
	fs.StringVar(&o.prices, "prices", "", "price table (YAML, models: {MODEL: {input_per_mtok, output_per_mtok, cached_input_per_mtok}}) overriding the built-in one, for the estimated cost")
	o.maxCost = math.NaN()
	fs.Var(optionalFloat{&o.maxCost}, "max-cost", "spending cap of the task in USD, at the price table's prices: no call starts that could pass it, and the rows left are marked not_started (retry with a higher --max-cost runs them); 0 removes a cap set before")
	fs.StringVar(&o.mode, "mode", "", "how the rows are called: online (the default; under the quota, at the online price), economy (the provider's batch API: half the price, answers within hours) or auto (economy until --deadline leaves just the time the rest needs online); a task keeps its mode from run to run")
	fs.StringVar(&o.deadline, "deadline", "", "with --mode auto: when the task must be done, a duration from now (6h) or an RFC 3339 time (2026-12-02T18:00:00Z)")
	fs.DurationVar(&o.batchPoll, "batch-poll", 30*time.Second, "how often a provider batch is asked for its state (economy and auto modes)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress output")
	fs.StringVar(&o.logLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	fs.DurationVar(&o.progressInterval, "progress-interval", 5*time.Second, "interval of plain progress lines when stderr is not a terminal")
	fs.IntVar(&o.retry.callsPerRound, "calls-per-round", 3, "model calls per row per attempt of its batch")
	fs.IntVar(&o.retry.rounds, "rounds", 4, "attempts of a batch before rows still failing retryably are marked failed")
	fs.StringVar(&o.retry.delays, "retry-delays", "10s,60s,300s", "graded delays before a released batch is tried again")
	fs.DurationVar(&o.retry.callTimeout, "call-timeout", 60*time.Second, "timeout of one model call")
	fs.DurationVar(&o.retry.lease, "lease", 2*time.Minute, "batch claim lease, renewed while the batch runs")
	fs.DurationVar(&o.sweepAfter, "sweep-after", 5*time.Minute, "re-enqueue batches left unclaimed this long (lost messages, stuck workers)")
	o.provider.register(fs)
}

func newRunCmd(stdout, stderr io.Writer) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run [--in] FILE [flags]",
		Short: "Run a job: one model call per row of FILE, the result workbook beside it",
		Long: `Run reads the sheet (.xlsx or .csv; the first row is the header), sends one model call
per row and writes the result workbook. Running the same command again continues the
same task: rows that already have a result are never sent to the model again.`,
		Example: `  batchgen run --in skus.xlsx --prompt '为商品{{商品名称}}写一段营销文案'
  batchgen run skus.csv --out copy.xlsx --prompt-file prompt.txt --provider openai --rpm 2000
  batchgen run export.csv --out export.result.csv --prompt-file prompt.txt`,
		Args: inputArg(&o.in),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, err := newRunJob(o, stderr)
			if err != nil {
				return err
			}
			defer job.close()
			return job.run(cmd.Context(), stdout)
		},
	}
	o.register(cmd.Flags())
	_ = cmd.MarkFlagFilename("in", "xlsx", "csv")
	_ = cmd.MarkFlagFilename("out", "xlsx", "csv")
	_ = cmd.MarkFlagFilename("prompt-file")
	_ = cmd.MarkFlagFilename("schema", "json")
	_ = cmd.MarkFlagDirname("data")
	return cmd
}

// inputArg takes the input as the one argument or as --in, once: the
// argument, when given, is stored in in.
func inputArg(in *string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > 1 || (len(args) == 1 && *in != "") {
			return fmt.Errorf("unexpected arguments %q: give the input once, as --in FILE or FILE", args)
		}
		if len(args) == 1 {
			*in = args[0]
		}
		return nil
	}
}

// runJob is one `batchgen run`: the wiring of embedded adapters around the
// pipeline for one input.
type runJob struct {
	opts   runOptions
	stderr io.Writer
	logger *slog.Logger
	spec   store.TaskSpec
	delays []time.Duration
	// cacheTTL is --cache-ttl, given to the store.
	cacheTTL time.Duration
	data     *embedded.DataDir
	started  time.Time
	// prices estimate the task's cost in the summary.
	prices *pricing.Table
	// metrics receives the engine's metrics (serve's /metrics); nil
	// records nothing.
	metrics metrics.Recorder
	// providers are the routes of the job's model calls.
	providers *providerfile.File

	// The engine, built by openEngine, its providers and the counts of its
	// calls.
	engine *embedded.Engine
	set    *providers.Set
	stats  *embedded.Stats
}

func newRunJob(o runOptions, stderr io.Writer) (*runJob, error) {
	reject := func(format string, a ...any) error {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf(format, a...)}
	}
	if o.in == "" {
		return nil, reject("--in is required: the spreadsheet to process (.xlsx or .csv)")
	}
	if _, err := os.Stat(o.in); err != nil {
		return nil, reject("input %s: %w", o.in, embedded.UnwrapPathError(err))
	}
	if o.out == "" {
		base := strings.TrimSuffix(o.in, filepath.Ext(o.in))
		o.out = base + ".result.xlsx"
	}
	format, ok := resultFormatOf(o.out)
	if !ok {
		return nil, reject("--out %s: name the result .xlsx (a workbook: your own, for a workbook input) or .csv (a CSV file)", o.out)
	}
	if err := o.checkSpec(); err != nil {
		return nil, err
	}
	j, err := newEngineJob(o, stderr)
	if err != nil {
		return nil, err
	}
	j.spec = j.taskSpec()
	j.spec.ResultFormat = format
	return j, nil
}

// resultFormatOf is the result format --out asks for by its extension.
func resultFormatOf(out string) (store.ResultFormat, bool) {
	f, err := store.ParseResultFormat(strings.TrimPrefix(filepath.Ext(out), "."))
	return f, err == nil && filepath.Ext(out) != ""
}

// newEngineJob checks the flags shared by the commands that call the model
// and sets up logging.
func newEngineJob(o runOptions, stderr io.Writer) (*runJob, error) {
	reject := func(format string, a ...any) error {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf(format, a...)}
	}
	if o.concurrency < 1 {
		return nil, reject("--concurrency %d: must be at least 1", o.concurrency)
	}
	if o.rpm < 0 {
		return nil, reject("--rpm %d: must be 0 (learn the quota) or more", o.rpm)
	}
	if o.tpm < 0 {
		return nil, reject("--tpm %d: must be 0 (learn the quota) or more", o.tpm)
	}
	if !math.IsNaN(o.maxCost) {
		if err := pipeline.CheckMaxCost("--max-cost", o.maxCost); err != nil {
			return nil, reject("%w", err)
		}
	}
	if o.sweepAfter < time.Second {
		return nil, reject("--sweep-after %s: must be at least 1s", o.sweepAfter)
	}
	if o.mode != "" || o.deadline != "" {
		m, deadline, err := pipeline.ParseModeDeadline(o.mode, o.deadline, time.Now())
		if err != nil {
			return nil, reject("--%w", err)
		}
		o.parsedMode, o.parsedDeadline = m, deadline
	}
	if o.batchPoll < time.Second {
		return nil, reject("--batch-poll %s: must be at least 1s", o.batchPoll)
	}
	if o.retry.callsPerRound < 1 || o.retry.rounds < 1 {
		return nil, reject("--calls-per-round and --rounds must be at least 1")
	}
	if o.retry.lease <= 0 || o.retry.callTimeout <= 0 {
		return nil, reject("--lease %s and --call-timeout %s: both must be positive", o.retry.lease, o.retry.callTimeout)
	}
	delays, err := pipeline.ParseRetryDelays(o.retry.delays)
	if err != nil {
		return nil, reject("--retry-delays: %w", err)
	}
	if err := o.provider.validate(); err != nil {
		return nil, reject("%w", err)
	}
	if _, err := pipeline.ParseCacheMode(o.cacheMode); err != nil {
		return nil, reject("--cache: %w", err)
	}
	if o.noCache && o.cacheMode != string(pipeline.CacheAuto) && o.cacheMode != string(pipeline.CacheOff) {
		return nil, reject("--no-cache contradicts --cache %s; give one", o.cacheMode)
	}
	cacheTTL, err := pipeline.ParseCacheTTL(o.cacheTTL)
	if err != nil {
		return nil, reject("--cache-ttl: %w", err)
	}
	providers, err := o.providers()
	if err != nil {
		return nil, reject("%w", err)
	}
	level := new(slog.LevelVar)
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, reject("--log-level %q: use debug, info, warn or error", o.logLevel)
	}
	prices, err := pricing.Load(o.prices)
	if err != nil {
		return nil, reject("--prices: %w", err)
	}
	return &runJob{
		opts:      o,
		prices:    prices.FromProviders(providers),
		stderr:    stderr,
		logger:    logging.NewText(stderr, level),
		delays:    delays,
		cacheTTL:  cacheTTL,
		providers: providers,
		started:   time.Now(),
	}, nil
}

func (j *runJob) close() {
	if j.data != nil {
		j.data.Close()
	}
}

func (j *runJob) run(ctx context.Context, stdout io.Writer) error {
	task, existed, err := j.start(ctx)
	if err != nil {
		return err
	}
	if existed && !task.State.Final() {
		if err := j.engine.Resume(ctx, task); err != nil {
			return err
		}
	}
	return j.complete(ctx, task, stdout)
}

// start reads the input, opens the data directory and the engine, and
// splits the input into its task, or finds the task an earlier run made
// of it (existed), with the cap --max-cost asks for.
func (j *runJob) start(ctx context.Context) (task store.Task, existed bool, err error) {
	o := j.opts
	identity, err := embedded.FileIdentity(o.in)
	if err != nil {
		return task, false, &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("input %s: %w", o.in, err)}
	}
	identity += "|sheet=" + o.sheetName + "|max-rows=" + fmt.Sprint(o.maxRows)
	if o.encoding != "" {
		identity += "|encoding=" + strings.ToLower(o.encoding) // another reading of the same bytes is another task
	}
	taskID := pipeline.DeriveTaskID(identity, j.spec)

	params := pipeline.SplitParams{
		TaskID: taskID, Path: o.in, Source: filepath.Base(o.in), Owner: pipeline.LocalOwner, Spec: j.spec, Sheet: o.sheetName,
		Encoding: o.encoding, Limits: sheet.Limits{MaxRows: o.maxRows}, Spool: true,
	}
	params.Terms = j.terms(store.Terms{}) // a new task has its terms from its creation
	// Validate before touching the data directory: rejected input writes
	// nothing but the error. The rows it reads are spooled for the split,
	// which then does not decode the sheet again.
	validated, err := pipeline.Validate(params)
	var rejected *pipeline.RejectedError
	if errors.As(err, &rejected) {
		return task, false, &report.ExitError{Code: report.Rejected, Err: rejected}
	}
	if err != nil {
		return task, false, fmt.Errorf("read %s: %w", o.in, err)
	}
	defer validated.Close()
	params.Validated = &validated
	if !o.quiet {
		if validated.Rerun != nil {
			fmt.Fprintf(j.stderr, "batchgen: %s is a result sent back in: %s\n", filepath.Base(o.in), validated.Rerun)
		}
		for _, note := range validated.Notes {
			fmt.Fprintf(j.stderr, "batchgen: note: %s: %s\n", filepath.Base(o.in), note)
		}
	}

	j.data, err = embedded.Open(o.dataDir, o.in, j.cacheTTL)
	if err != nil {
		return task, false, err
	}
	if err := j.openEngine(taskID); err != nil {
		return task, false, err
	}

	if t, err := j.data.Store.GetTask(ctx, taskID); err == nil {
		existed = true
		j.logger.Info("continuing task", "task_id", taskID, "state", t.State)
	} else if !errors.Is(err, store.ErrNotFound) {
		return task, false, fmt.Errorf("read task %s: %w", taskID, err)
	}

	splitter := pipeline.NewSplitter(j.data.Store, j.engine.Queue, pipeline.SplitterConfig{Logger: j.logger, Inputs: j.data.Blobs, Exports: j.engine.Exports})
	task, err = splitter.Split(ctx, params)
	if errors.As(err, &rejected) {
		return task, existed, &report.ExitError{Code: report.Rejected, Err: rejected}
	}
	if err != nil {
		return task, existed, fmt.Errorf("split %s: %w", o.in, err)
	}
	if task, err = j.applyTerms(ctx, task); err != nil {
		return task, existed, err
	}
	if !o.quiet {
		verb := "started"
		if existed {
			verb = "continuing"
		}
		read := ""
		if task.Encoding != "" {
			read = ", read as " + task.Encoding
		}
		fmt.Fprintf(j.stderr, "batchgen: %s task %s: %d rows in %d batches%s (data: %s)\n", verb, task.ID, task.RowsTotal, task.BatchesTotal, read, j.data.Dir)
	}
	return task, existed, nil
}

// terms are cur with what --max-cost, --mode and --deadline ask for.
func (j *runJob) terms(cur store.Terms) store.Terms {
	o := j.opts
	if !math.IsNaN(o.maxCost) {
		cur.MaxCost = o.maxCost
	}
	if o.mode != "" || o.deadline != "" {
		cur.Mode, cur.Deadline = o.parsedMode, o.parsedDeadline
	}
	return cur
}

// applyTerms gives task the cap, mode and deadline the flags ask for, if
// they ask for others than the task's (a task keeps its terms from run to
// run).
func (j *runJob) applyTerms(ctx context.Context, task store.Task) (store.Task, error) {
	terms := j.terms(task.Terms)
	if terms == task.Terms {
		return task, nil
	}
	t, err := j.data.Store.SetTerms(ctx, task.ID, terms)
	if err != nil {
		return task, fmt.Errorf("set the terms of task %s: %w", task.ID, err)
	}
	return t, nil
}

// openEngine builds the engine of one task over the opened data
// directory: the task's own queue, and exports signalled to this command,
// which waits for them.
func (j *runJob) openEngine(taskID string) error {
	return j.openEngineOn(embedded.EngineConfig{Queue: embedded.TaskQueue(taskID)})
}

// openEngineOn builds the engine cfg asks for over the opened data
// directory, with the providers of the flags and the generator settings
// the flags ask for.
func (j *runJob) openEngineOn(cfg embedded.EngineConfig) error {
	o := j.opts
	j.stats = embedded.NewStats()
	set, err := embedded.Providers(context.Background(), j.providers, j.stats, j.logger, j.metrics)
	if err != nil {
		return &report.ExitError{Code: report.Rejected, Err: err}
	}
	j.set = set
	cfg.Logger, cfg.Metrics = j.logger, j.metrics
	cfg.Generator = pipeline.GeneratorConfig{
		Observer: j.stats.Observe,
		// Rows in flight: every provider's slots can be busy at once.
		Concurrency: j.providers.Concurrency(), Lease: o.retry.lease, CallTimeout: set.Router.MaxTimeout(),
		CallsPerRound: o.retry.callsPerRound, Rounds: o.retry.rounds, RetryDelays: j.delays,
		PackTokens: j.providers.PackTokens(), CacheScope: cmp.Or(o.cacheScope, pipeline.CacheShared),
		Prices:  j.prices,
		Economy: pipeline.EconomyConfig{Poll: o.batchPoll, OnlineRate: j.providers.OnlineRate()},
	}
	if mode := pipeline.CacheMode(o.cacheMode); !o.noCache && mode != pipeline.CacheOff {
		cfg.Generator.Cache, cfg.Generator.CacheMode = j.data.Store, mode
	}
	j.engine, err = embedded.NewEngine(j.data, set.Router, cfg)
	return err
}

// complete drives an unfinished task to the end, writes the result to
// --out, prints the summary and turns the outcome into the exit code.
func (j *runJob) complete(ctx context.Context, task store.Task, stdout io.Writer) error {
	if !task.State.Final() {
		if err := j.process(ctx, task); err != nil {
			return err
		}
	}
	task, err := j.engine.Finish(ctx, task.ID, j.opts.out)
	if err != nil {
		return err
	}
	summary, failed, err := embedded.Summarize(ctx, j.data.Store, task, j.stats, time.Since(j.started), j.opts.out)
	if err != nil {
		return err
	}
	summary.Prices = j.prices
	if s, ok := j.engine.Generator.EconomyStatus(task.ID); ok {
		if summary.Counted != nil {
			summary.Counted.BatchLines, summary.Counted.ProviderBatches = s.Lines, s.Sent
		}
		if s.Online {
			summary.Notes = append(summary.Notes, "auto: the rest went online at "+s.Why)
		}
	}
	for _, name := range j.set.JSONMode() {
		summary.Notes = append(summary.Notes, fmt.Sprintf("provider %s refused structured outputs: the columns were asked for in JSON mode, every answer checked", name))
	}
	fmt.Fprint(stdout, summary.String())
	return report.ForTask(task, failed)
}

// process works the task to its end (embedded.Engine.RunTask) with the
// progress line. Interrupted runs return exit code 130 and can be
// continued.
func (j *runJob) process(ctx context.Context, task store.Task) error {
	o := j.opts
	// A continued run's progress starts where the last one stopped.
	counts, err := pipeline.LiveCounts(ctx, j.data.Store, task)
	if err != nil {
		return err
	}
	pc := report.ProgressConfig{Total: task.RowsTotal, Done: counts.Counts().Done(), Quiet: o.quiet, Interval: o.progressInterval, RPM: j.providers.RPM(), Counts: j.stats.ProgressCounts}
	if task.Mode.Batched() {
		pc.Waiting = func() string {
			s, _ := j.engine.Generator.EconomyStatus(task.ID)
			return s.String()
		}
	}
	progress := report.NewProgress(j.stderr, pc)
	defer progress.Finish()
	err = j.engine.RunTask(ctx, task, embedded.TaskRun{
		Workers: pipeline.BatchesInFlight(j.providers.Concurrency(), task.Spec.BatchSize), SweepAfter: o.sweepAfter,
		Tick: progress.Update,
		Cancelled: func() {
			if !o.quiet {
				fmt.Fprintf(j.stderr, "batchgen: task %s was cancelled; finishing the rows in flight\n", task.ID)
			}
		},
	})
	if errors.Is(err, embedded.ErrInterrupted) {
		return &report.ExitError{Code: report.Interrupted, Err: fmt.Errorf("interrupted; finished rows are saved in %s: run the same command again to continue", j.data.Dir)}
	}
	if err == nil {
		progress.Complete()
	}
	return err
}
