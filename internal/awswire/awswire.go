// Package awswire holds what every Lambda function's wiring shares: it reads
// the configuration from the environment, loads the AWS SDK configuration
// and builds the task store (DynamoDB, which every function uses). Each
// function is wired by its own package below (splitterwire, generatorwire,
// exporterwire, apiwire, sweeperwire), which builds only the AWS clients
// that function calls (S3, SQS, Step Functions, SSM, the model provider)
// and its handler from internal/lambdafn/<function>fn, so each function
// links only what it uses (TestDependencyEdges holds that).
package awswire

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/logging/lambdalog"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/dynamostore"
)

// Env is the functions' configuration, read from the environment variables
// template.yaml sets (and a few optional ones it does not).
type Env struct {
	// Resources.
	TableName       string // TABLE_NAME
	QueueURL        string // QUEUE_URL
	DLQURL          string // DLQ_URL
	BucketName      string // BUCKET_NAME
	StateMachineARN string // STATE_MACHINE_ARN: splitter, generator, api and sweeper only

	// Model.
	ModelProvider    string // MODEL_PROVIDER: a provider kind (providerfile.ParseKind)
	ModelName        string // MODEL_NAME
	ModelBaseURL     string // MODEL_BASE_URL: empty for the provider's public endpoint
	ModelAPIKeyParam string // MODEL_API_KEY_PARAM: SSM SecureString name; read by the generator only
	// BedrockBatchRoleARN is the service role Bedrock's batch inference
	// jobs assume to read and write the stack's bucket
	// (BEDROCK_BATCH_ROLE_ARN; the template sets it with bedrock).
	BedrockBatchRoleARN string
	// BedrockInferenceProfile (BEDROCK_INFERENCE_PROFILE) is the
	// cross-region inference profile a bedrock deployment calls instead of
	// ModelName; empty calls ModelName.
	BedrockInferenceProfile string
	// QuotaRPM is the provider's requests per minute across all generator
	// instances (QUOTA_RPM).
	QuotaRPM int
	// QuotaTPM is the provider's tokens per minute across all generator
	// instances (QUOTA_TPM); 0 means no token limit.
	QuotaTPM int
	// MaxConcurrency is the event source mapping's MaximumConcurrency
	// (MAX_CONCURRENCY, optional, defaults to 10 like the template's
	// parameter): where no shared limiter paces a provider, each instance
	// takes 1/MaxConcurrency of its quota (providers.Limiters).
	MaxConcurrency int
	// Concurrency bounds model calls in flight per generator instance
	// (GENERATOR_CONCURRENCY, optional). Defaults to 8.
	Concurrency int
	// SimLatency is the simulator's call latency (SIM_LATENCY, optional, a
	// Go duration). Defaults to 300ms.
	SimLatency time.Duration

	// CacheMode says when the generator reuses cached outputs (CACHE_MODE,
	// optional: auto, always or off; defaults to auto), as run's --cache.
	CacheMode pipeline.CacheMode
	// CacheScope says whose cached answers the generator reuses
	// (CACHE_SCOPE, optional: principal, the default, or deployment), as
	// serve's --cache-scope.
	CacheScope pipeline.CacheScope
	// CacheTTL is how long a cached output is reused (CACHE_TTL, optional:
	// whole days such as 30d or a Go duration; defaults to
	// store.DefaultCacheTTL), as run's --cache-ttl.
	CacheTTL time.Duration
	// ProvidersFile is the providers file's YAML content (PROVIDERS_FILE,
	// optional): several providers routed with failover instead of
	// MODEL_PROVIDER and its companions. The generator calls them; the
	// splitter and the api record them in the specs they build
	// (DefaultSpec), so all three get it.
	ProvidersFile string

	// ProviderAPIKeyParams (PROVIDER_API_KEY_PARAMS, comma-separated; the
	// template's ProviderApiKeyParams) and ProviderBedrockModels
	// (PROVIDER_BEDROCK_MODELS; ProviderBedrockModels) are what the
	// generator's role is granted for the providers file beyond the
	// single-provider parameters: read by the generator only, to refuse a
	// file that needs more (Grants).
	ProviderAPIKeyParams, ProviderBedrockModels []string

	// Jobs.
	BatchSize     int           // BATCH_SIZE: rows per batch
	MaxRows       int           // MAX_ROWS: largest accepted sheet
	MaxInputBytes int64         // MAX_INPUT_BYTES (optional): largest accepted file; defaults to 100 MiB
	Lease         time.Duration // LEASE_SECONDS: batch claim lease
	// ProviderBatchPoll is how long a batch of an economy or auto task
	// waits between two looks at its provider batches
	// (PROVIDER_BATCH_POLL, optional: a duration of 1s to 15m, SQS's
	// longest delay; defaults to 5m): the generator parks the batch for
	// it, the sweeper lets it wait that long.
	ProviderBatchPoll time.Duration
	// DefaultPrompt is the deployment's prompt template for inputs with
	// none of their own (DEFAULT_PROMPT, optional).
	DefaultPrompt string
	// DefaultColumns are the deployment's output columns for inputs that
	// declare none of their own (DEFAULT_COLUMNS, optional: the short form
	// or JSON, as the API's columns field takes them).
	DefaultColumns schema.Columns
	// DefaultRowsPerCall is how many rows one model call answers for
	// inputs that do not say (DEFAULT_ROWS_PER_CALL, optional; 0 or 1: one).
	DefaultRowsPerCall int
	// DropResultFormat is the result file of drop-folder inputs
	// (DROP_RESULT_FORMAT, optional: xlsx, the default, or csv); API
	// uploads name their own.
	DropResultFormat store.ResultFormat
	// AllowedModels is the API's allow-list of models a request may name
	// (ALLOWED_MODELS, optional, comma-separated); empty allows any.
	AllowedModels []string
	// MaxTokensLimit caps a request's max_tokens (MAX_TOKENS_LIMIT,
	// optional); 0 takes the API's default.
	MaxTokensLimit int
	// MaxActiveTasks and MaxRowsPerDay are the per-principal limits of the
	// api function (MAX_ACTIVE_TASKS, MAX_ROWS_PER_DAY; 0 or unset: none),
	// api.Limits's.
	MaxActiveTasks, MaxRowsPerDay int
	// MaxStreams caps one principal's open event streams, counted in the
	// table across the events function's instances (MAX_STREAMS; 0 or
	// unset: none).
	MaxStreams int
	// MaxBatchSize caps a request's batch_size (MAX_BATCH_SIZE, optional);
	// 0 takes the API's default.
	MaxBatchSize int
	// DropOwner is the principal sheets dropped into incoming/ belong to
	// (DROP_OWNER, optional). Defaults to pipeline.LocalOwner.
	DropOwner string
	// JWTIssuer and JWTAudience are what the events function's in-handler
	// JWT check requires of a token (JWT_ISSUER, JWT_AUDIENCE): the same
	// issuer and audience as the HTTP API's authorizer, since the Function
	// URL has none in front of it. Read by the events function only.
	JWTIssuer, JWTAudience string
	// EventsURL is the events function's Function URL (EVENTS_URL), where
	// the API's task links send clients for the event stream. Read by the
	// api function only.
	EventsURL string

	LogLevel slog.Level // LOG_LEVEL: debug, info, warn or error
	// StackName is the CloudFormation stack (STACK_NAME, optional): the
	// Stack dimension of the functions' metrics, which the template's
	// alarms query. Empty writes metrics without dimensions.
	StackName string
	// LogStream is the instance's log stream (AWS_LAMBDA_LOG_STREAM_NAME,
	// set by Lambda); it names the generator in batch claims.
	LogStream string
}

// LoadEnv reads and validates the configuration through getenv (os.Getenv
// in main). Which resources a function needs is checked by its builder.
func LoadEnv(getenv func(string) string) (Env, error) {
	e := Env{
		TableName:               getenv("TABLE_NAME"),
		QueueURL:                getenv("QUEUE_URL"),
		DLQURL:                  getenv("DLQ_URL"),
		BucketName:              getenv("BUCKET_NAME"),
		StateMachineARN:         getenv("STATE_MACHINE_ARN"),
		ModelProvider:           getenv("MODEL_PROVIDER"),
		ModelName:               getenv("MODEL_NAME"),
		ModelBaseURL:            getenv("MODEL_BASE_URL"),
		ModelAPIKeyParam:        getenv("MODEL_API_KEY_PARAM"),
		BedrockBatchRoleARN:     getenv("BEDROCK_BATCH_ROLE_ARN"),
		BedrockInferenceProfile: getenv("BEDROCK_INFERENCE_PROFILE"),
		DefaultPrompt:           getenv("DEFAULT_PROMPT"),
		DropOwner:               getenv("DROP_OWNER"),
		JWTIssuer:               getenv("JWT_ISSUER"),
		JWTAudience:             getenv("JWT_AUDIENCE"),
		EventsURL:               getenv("EVENTS_URL"),
		LogStream:               getenv("AWS_LAMBDA_LOG_STREAM_NAME"),
		StackName:               getenv("STACK_NAME"),
		ProvidersFile:           getenv("PROVIDERS_FILE"),
	}
	var errs []error
	intVar := func(name string, def, minimum int) int {
		v := getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < minimum {
			errs = append(errs, fmt.Errorf("%s=%q: want a whole number of at least %d", name, v, minimum))
		}
		return n
	}
	e.QuotaRPM = intVar("QUOTA_RPM", 0, 0)
	e.QuotaTPM = intVar("QUOTA_TPM", 0, 0)
	e.MaxConcurrency = intVar("MAX_CONCURRENCY", 10, 1)
	e.Concurrency = intVar("GENERATOR_CONCURRENCY", 8, 1)
	e.BatchSize = intVar("BATCH_SIZE", pipeline.DefaultBatchSize, 1)
	e.MaxRows = intVar("MAX_ROWS", 0, 0)
	if e.DefaultRowsPerCall = intVar("DEFAULT_ROWS_PER_CALL", 0, 0); e.DefaultRowsPerCall > schema.MaxRowsPerCall {
		errs = append(errs, fmt.Errorf("DEFAULT_ROWS_PER_CALL=%d: at most %d", e.DefaultRowsPerCall, schema.MaxRowsPerCall))
	}
	if e.DefaultRowsPerCall == 1 {
		e.DefaultRowsPerCall = 0
	}
	e.MaxTokensLimit = intVar("MAX_TOKENS_LIMIT", 0, 0)
	e.MaxActiveTasks = intVar("MAX_ACTIVE_TASKS", 0, 0)
	e.MaxRowsPerDay = intVar("MAX_ROWS_PER_DAY", 0, 0)
	e.MaxStreams = intVar("MAX_STREAMS", 0, 0)
	e.MaxBatchSize = intVar("MAX_BATCH_SIZE", 0, 0)
	e.AllowedModels = list(getenv("ALLOWED_MODELS"))
	e.ProviderAPIKeyParams = list(getenv("PROVIDER_API_KEY_PARAMS"))
	for _, p := range e.ProviderAPIKeyParams {
		if !strings.HasPrefix(p, "/") {
			errs = append(errs, fmt.Errorf("PROVIDER_API_KEY_PARAMS: %q: want SSM parameter names starting with /", p))
		}
	}
	e.ProviderBedrockModels = list(getenv("PROVIDER_BEDROCK_MODELS"))
	e.MaxInputBytes = int64(intVar("MAX_INPUT_BYTES", pipeline.DefaultMaxInputBytes, 1))
	e.Lease = time.Duration(intVar("LEASE_SECONDS", 360, 1)) * time.Second
	e.ProviderBatchPoll = 5 * time.Minute
	if v := getenv("PROVIDER_BATCH_POLL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > pipeline.MaxParkPoll {
			errs = append(errs, fmt.Errorf("PROVIDER_BATCH_POLL=%q: want a duration of 1s to 15m (SQS delays a message 15 minutes at most)", v))
		}
		e.ProviderBatchPoll = d
	}
	e.SimLatency = 300 * time.Millisecond
	if v := getenv("SIM_LATENCY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("SIM_LATENCY=%q: want a duration such as 300ms", v))
		}
		e.SimLatency = d
	}
	cols, err := schema.ParseText(getenv("DEFAULT_COLUMNS"))
	if err != nil {
		errs = append(errs, fmt.Errorf("DEFAULT_COLUMNS: %w", err))
	}
	e.DefaultColumns = cols
	format, err := store.ParseResultFormat(getenv("DROP_RESULT_FORMAT"))
	if err != nil {
		errs = append(errs, fmt.Errorf("DROP_RESULT_FORMAT: %w", err))
	}
	e.DropResultFormat = format
	// The same readers as run's --cache and --cache-ttl.
	var mode pipeline.CacheMode
	mode, err = pipeline.ParseCacheMode(cmp.Or(getenv("CACHE_MODE"), string(pipeline.CacheAuto)))
	if err != nil {
		errs = append(errs, fmt.Errorf("CACHE_MODE: %w", err))
	}
	e.CacheMode = mode
	if e.CacheScope, err = pipeline.ParseCacheScope(getenv("CACHE_SCOPE")); err != nil {
		errs = append(errs, fmt.Errorf("CACHE_SCOPE: %w", err))
	}
	if e.CacheTTL, err = pipeline.ParseCacheTTL(getenv("CACHE_TTL")); err != nil {
		errs = append(errs, fmt.Errorf("CACHE_TTL: %w", err))
	}
	if e.ModelProvider == "" {
		e.ModelProvider = "sim"
	}
	if p := e.ModelAPIKeyParam; p != "" && !strings.HasPrefix(p, "/") {
		errs = append(errs, fmt.Errorf("MODEL_API_KEY_PARAM=%q: want an SSM parameter name starting with /", p))
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		if err := e.LogLevel.UnmarshalText([]byte(v)); err != nil {
			errs = append(errs, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
	if e.ProvidersFile == "" {
		// The model parameters, checked at the cold start by the same rules
		// as run's provider flags.
		if _, err := e.Providers(); err != nil {
			errs = append(errs, err)
		}
	}
	return e, errors.Join(errs...)
}

// list splits a comma-separated variable, dropping empty items (the
// template's empty CommaDelimitedList joins to "").
func list(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Grants is what template.yaml grants the generator's role, from the same
// parameters it grants from: ModelApiKeyParam and ProviderApiKeyParams to
// read; with ModelProvider=bedrock, ModelName in region (the function's
// own), or BedrockInferenceProfileId in region and ModelName in every
// region the profile routes to; and each of ProviderBedrockModels as a
// foundation model or inference profile in every region. The generator
// checks its providers file against it (providerfile.File.CheckGrants);
// internal/samstack's TestTemplateProviderGrants holds it to the template.
func (e Env) Grants(region string) providerfile.Grants {
	g := providerfile.Grants{Region: region}
	if e.ModelAPIKeyParam != "" {
		g.APIKeyParams = append(g.APIKeyParams, e.ModelAPIKeyParam)
	}
	g.APIKeyParams = append(g.APIKeyParams, e.ProviderAPIKeyParams...)
	if providerfile.Kind(e.ModelProvider) == providerfile.KindBedrock {
		if e.BedrockInferenceProfile != "" {
			g.Bedrock = append(g.Bedrock,
				providerfile.BedrockGrant{Resource: "inference-profile/" + e.BedrockInferenceProfile, Region: region},
				providerfile.BedrockGrant{Resource: "foundation-model/" + e.ModelName})
		} else {
			g.Bedrock = append(g.Bedrock, providerfile.BedrockGrant{Resource: "foundation-model/" + e.ModelName, Region: region})
		}
		// Batch inference jobs of the same model (RunBatchInferenceJobs).
		g.Batch = providerfile.BatchGrant{Bucket: e.BucketName, RoleARN: e.BedrockBatchRoleARN, Models: slices.Clone(g.Bedrock)}
	}
	for _, m := range e.ProviderBedrockModels {
		g.Bedrock = append(g.Bedrock,
			providerfile.BedrockGrant{Resource: "foundation-model/" + m},
			providerfile.BedrockGrant{Resource: "inference-profile/" + m})
	}
	return g
}

// Require checks that the named variables are set.
func (e Env) Require(names ...string) error {
	values := map[string]string{
		"TABLE_NAME": e.TableName, "QUEUE_URL": e.QueueURL, "DLQ_URL": e.DLQURL,
		"BUCKET_NAME": e.BucketName, "STATE_MACHINE_ARN": e.StateMachineARN,
	}
	var missing []string
	for _, n := range names {
		if values[n] == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("environment: %s must be set", strings.Join(missing, ", "))
	}
	return nil
}

// DefaultSpec is the deployment's task spec: the default prompt and batch
// size, and what the providers config (Providers) says about the
// provider, by the same rule as batchgen run --providers
// (providerfile.File.Spec), so a routed deployment's tasks carry the
// routed label and model in their spec, their id and their cache keys. An
// error is a bad PROVIDERS_FILE or model parameters, for the cold start.
func (e Env) DefaultSpec() (store.TaskSpec, error) {
	f, err := e.Providers()
	if err != nil {
		return store.TaskSpec{}, err
	}
	return f.Spec(store.TaskSpec{Prompt: e.DefaultPrompt, BatchSize: e.BatchSize, Columns: e.DefaultColumns, RowsPerCall: e.DefaultRowsPerCall}), nil
}

// DropSpec is the spec of drop-folder inputs: DefaultSpec with the
// deployment's DropResultFormat. The splitter and whatever derives a
// dropped file's task id (DropTaskID) ask this, so the two agree.
func (e Env) DropSpec() (store.TaskSpec, error) {
	spec, err := e.DefaultSpec()
	spec.ResultFormat = e.DropResultFormat
	return spec, err
}

// Providers returns the deployment's providers file: PROVIDERS_FILE (the
// ProvidersFile parameter's YAML), or one entry built from MODEL_PROVIDER,
// MODEL_NAME (or BEDROCK_INFERENCE_PROFILE), MODEL_BASE_URL,
// MODEL_API_KEY_PARAM, QUOTA_RPM and QUOTA_TPM as run's single-provider
// flags build theirs, so both take one code path and pass providerfile's
// one Validate. A bad file is an error naming the key and its line.
func (e Env) Providers() (*providerfile.File, error) {
	if e.ProvidersFile != "" {
		return providerfile.Parse("PROVIDERS_FILE", []byte(e.ProvidersFile))
	}
	// An Env not read by LoadEnv has no provider; LoadEnv's default is sim.
	kind, err := providerfile.ParseKind(cmp.Or(e.ModelProvider, "sim"))
	if err != nil {
		return nil, fmt.Errorf("MODEL_PROVIDER=%w", err)
	}
	single := providerfile.Single{
		Kind: kind, Model: e.ModelName, BaseURL: e.ModelBaseURL, APIKeyParam: e.ModelAPIKeyParam,
		RPM: e.QuotaRPM, TPM: e.QuotaTPM, Concurrency: e.Concurrency,
		Latency: e.SimLatency, Jitter: e.SimLatency / 6,
		Names: providerfile.SettingNames{Kind: "MODEL_PROVIDER", Model: "MODEL_NAME (or BEDROCK_INFERENCE_PROFILE)", BaseURL: "MODEL_BASE_URL", Region: "the region"},
	}
	switch {
	case kind == providerfile.KindSim:
		// The template's ModelName is ignored by sim (its default names
		// an OpenAI model).
		single.Model = ""
	case kind == providerfile.KindBedrock && e.BedrockInferenceProfile != "":
		// Calls go through the profile (the role is granted it).
		single.Model = e.BedrockInferenceProfile
	}
	if kind == providerfile.KindBedrock {
		// Economy tasks run as batch inference jobs, their files in the
		// stack's bucket, read and written by the template's service role.
		single.BatchBucket, single.BatchRoleARN = e.BucketName, e.BedrockBatchRoleARN
	}
	f, err := single.File()
	if err != nil {
		return nil, fmt.Errorf("model parameters: %w", err)
	}
	return f, nil
}

// Deps are the AWS clients and shared pieces one function is built from.
type Deps struct {
	Env     Env
	AWS     aws.Config
	Logger  *slog.Logger
	Metrics *metrics.Emitter
	Clock   clock.Clock

	// ExportStarter, when non-nil, replaces the state machine starter:
	// the emulator harness (samstack/localrun) runs exports itself.
	ExportStarter pipeline.ExportStarter
	// TempDir receives the splitter's downloads and the exporter's copy of
	// the input workbook. Defaults to os.TempDir().
	TempDir string
	// TuneGenerator, when non-nil, adjusts the generator's store and
	// configuration before it is built (tests: faster retries, injected
	// faults). It returns the store to use.
	TuneGenerator func(st store.Store, cfg *pipeline.GeneratorConfig) store.Store
	// TuneSweeper, when non-nil, adjusts the sweeper's configuration
	// before it is built (tests: no waiting, fewer claims).
	TuneSweeper func(cfg *pipeline.SweeperConfig)
}

// FromEnv reads the environment and loads the AWS configuration (which
// honours AWS_ENDPOINT_URL, so the functions run against an emulator too).
// function names the function in logs and metrics.
func FromEnv(ctx context.Context, function string) (*Deps, error) {
	env, err := LoadEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	return NewDeps(env, cfg, function), nil
}

// NewDeps returns Deps for env and cfg, logging JSON to stdout, where
// Lambda collects it, with metrics lines beside the logs.
func NewDeps(env Env, cfg aws.Config, function string) *Deps {
	// CloudWatch's JSON log format (the template's LogFormat: JSON), with
	// the invocation's request id and the task's attributes from the context.
	logger := lambdalog.New(os.Stdout, env.LogLevel).With("function", function)
	return &Deps{
		Env:     env,
		AWS:     cfg,
		Logger:  logger,
		Metrics: metrics.New(os.Stdout, clock.Real{}, metricProps(env, function)),
		Clock:   clock.Real{},
	}
}

// metricProps are the properties of every metrics line of function: its
// name, and the stack as the metrics' dimension.
func metricProps(env Env, function string) map[string]string {
	props := map[string]string{"function": function}
	if env.StackName != "" {
		props[metrics.StackDimension] = env.StackName
	}
	return props
}

// Fatal logs a start-up error and exits: a function that cannot be wired
// must fail its cold start loudly rather than answer events wrongly.
func Fatal(function string, err error) {
	lambdalog.New(os.Stderr, slog.LevelInfo).Error("cannot start", "function", function, "error", err)
	os.Exit(1)
}

// Store returns the task store. overflow, when non-nil, keeps the cells of
// rows too large for one item (the bucket's overflow/ prefix); a function
// that never reads or writes such rows passes nil and links no S3 client.
func (d *Deps) Store(overflow blob.Store) *dynamostore.Store {
	return dynamostore.New(dynamodb.NewFromConfig(d.AWS), d.Env.TableName, dynamostore.Options{Overflow: overflow, Clock: d.Clock, CacheTTL: d.Env.CacheTTL})
}

// Exports returns the export starter: ExportStarter when set (the emulator
// harness), else stateMachine, the function's own state machine starter.
func (d *Deps) Exports(stateMachine pipeline.ExportStarter) pipeline.ExportStarter {
	if d.ExportStarter != nil {
		return d.ExportStarter
	}
	return stateMachine
}
