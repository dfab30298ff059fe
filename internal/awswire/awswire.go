// Package awswire builds the AWS side of the Lambda functions from their
// environment: it reads the configuration, loads the AWS SDK configuration,
// builds the DynamoDB, SQS, S3 and Step Functions adapters and wires them
// into the handlers of internal/lambdafn, which know nothing of AWS. The
// generator's extra pieces (model provider, SSM, shared quota) live in
// generatorwire, so only the generator function links them.
package awswire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/lambdafn"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue/sqsqueue"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/stepfn"
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
	ModelProvider    string // MODEL_PROVIDER: sim or openai
	ModelName        string // MODEL_NAME
	ModelBaseURL     string // MODEL_BASE_URL: empty for the provider's public endpoint
	ModelAPIKeyParam string // MODEL_API_KEY_PARAM: SSM SecureString name; read by the generator only
	// QuotaRPM is the provider's requests per minute across all generator
	// instances (QUOTA_RPM).
	QuotaRPM int
	// MaxConcurrency is the event source mapping's MaximumConcurrency
	// (MAX_CONCURRENCY, optional, defaults to 10 like the template's
	// parameter): each instance takes QuotaRPM/MaxConcurrency.
	MaxConcurrency int
	// Concurrency bounds model calls in flight per generator instance
	// (GENERATOR_CONCURRENCY, optional). Defaults to 8.
	Concurrency int
	// SimLatency is the simulator's call latency (SIM_LATENCY, optional, a
	// Go duration). Defaults to 300ms.
	SimLatency time.Duration

	// Jobs.
	BatchSize     int           // BATCH_SIZE: rows per batch
	MaxRows       int           // MAX_ROWS: largest accepted sheet
	MaxInputBytes int64         // MAX_INPUT_BYTES (optional): largest accepted file; defaults to 100 MiB
	Lease         time.Duration // LEASE_SECONDS: batch claim lease
	// DefaultPrompt is the deployment's prompt template for inputs with
	// none of their own (DEFAULT_PROMPT, optional).
	DefaultPrompt string

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
		TableName:        getenv("TABLE_NAME"),
		QueueURL:         getenv("QUEUE_URL"),
		DLQURL:           getenv("DLQ_URL"),
		BucketName:       getenv("BUCKET_NAME"),
		StateMachineARN:  getenv("STATE_MACHINE_ARN"),
		ModelProvider:    getenv("MODEL_PROVIDER"),
		ModelName:        getenv("MODEL_NAME"),
		ModelBaseURL:     getenv("MODEL_BASE_URL"),
		ModelAPIKeyParam: getenv("MODEL_API_KEY_PARAM"),
		DefaultPrompt:    getenv("DEFAULT_PROMPT"),
		LogStream:        getenv("AWS_LAMBDA_LOG_STREAM_NAME"),
		StackName:        getenv("STACK_NAME"),
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
	e.MaxConcurrency = intVar("MAX_CONCURRENCY", 10, 1)
	e.Concurrency = intVar("GENERATOR_CONCURRENCY", 8, 1)
	e.BatchSize = intVar("BATCH_SIZE", pipeline.DefaultBatchSize, 1)
	e.MaxRows = intVar("MAX_ROWS", 0, 0)
	e.MaxInputBytes = int64(intVar("MAX_INPUT_BYTES", pipeline.DefaultMaxInputBytes, 1))
	e.Lease = time.Duration(intVar("LEASE_SECONDS", 360, 1)) * time.Second
	e.SimLatency = 300 * time.Millisecond
	if v := getenv("SIM_LATENCY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("SIM_LATENCY=%q: want a duration such as 300ms", v))
		}
		e.SimLatency = d
	}
	if e.ModelProvider == "" {
		e.ModelProvider = "sim"
	}
	switch e.ModelProvider {
	case "sim", "openai":
	default:
		errs = append(errs, fmt.Errorf("MODEL_PROVIDER=%q: want sim or openai", e.ModelProvider))
	}
	if p := e.ModelAPIKeyParam; p != "" && !strings.HasPrefix(p, "/") {
		errs = append(errs, fmt.Errorf("MODEL_API_KEY_PARAM=%q: want an SSM parameter name starting with /", p))
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		if err := e.LogLevel.UnmarshalText([]byte(v)); err != nil {
			errs = append(errs, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
	return e, errors.Join(errs...)
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

// DefaultSpec is the deployment's task spec.
func (e Env) DefaultSpec() store.TaskSpec {
	model := e.ModelName
	if e.ModelProvider == "sim" {
		model = "sim-1"
	}
	return store.TaskSpec{Prompt: e.DefaultPrompt, Provider: e.ModelProvider, Model: model, BatchSize: e.BatchSize}
}

// InstanceRPM is one generator instance's share of the provider quota when
// the quota is too small for the shared limiter (under 60 RPM): an
// in-process limiter per instance, dividing QuotaRPM by the most instances
// the event source mapping runs, keeps the sum under the quota. 0 means
// unlimited.
func (e Env) InstanceRPM() int {
	if e.QuotaRPM <= 0 {
		return 0
	}
	return max(1, e.QuotaRPM/max(1, e.MaxConcurrency))
}

// Deps are the AWS clients and shared pieces one function is built from.
type Deps struct {
	Env     Env
	AWS     aws.Config
	Logger  *slog.Logger
	Metrics *metrics.Emitter
	Clock   clock.Clock

	// ExportStarter, when non-nil, replaces the state machine starter:
	// the emulator harness (awsemu/localrun) runs exports itself.
	ExportStarter pipeline.ExportStarter
	// TempDir receives the splitter's downloads. Defaults to os.TempDir().
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
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: env.LogLevel})).With("function", function)
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
	slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("cannot start", "function", function, "error", err)
	os.Exit(1)
}

// Blobs returns the bucket as a blob store. Against an emulator endpoint
// the client uses path-style URLs, which emulators serve without wildcard
// DNS.
func (d *Deps) Blobs() *s3blob.Store {
	client := s3.NewFromConfig(d.AWS, func(o *s3.Options) {
		if d.AWS.BaseEndpoint != nil {
			o.UsePathStyle = true
		}
	})
	return s3blob.New(client, d.Env.BucketName, s3blob.Options{})
}

// Store returns the task store, keeping oversized rows' cells in the
// bucket.
func (d *Deps) Store() *dynamostore.Store {
	return dynamostore.New(dynamodb.NewFromConfig(d.AWS), d.Env.TableName, dynamostore.Options{Overflow: d.Blobs(), Clock: d.Clock})
}

// Queue returns the work queue.
func (d *Deps) Queue() *sqsqueue.Queue {
	return sqsqueue.New(sqs.NewFromConfig(d.AWS), d.Env.QueueURL, sqsqueue.Options{DLQURL: d.Env.DLQURL, Clock: d.Clock})
}

// Exports returns the export state machine starter.
func (d *Deps) Exports() pipeline.ExportStarter {
	if d.ExportStarter != nil {
		return d.ExportStarter
	}
	return stepfn.Starter{Client: sfn.NewFromConfig(d.AWS), StateMachineARN: d.Env.StateMachineARN}
}

// Splitter builds the splitter function's handler.
func (d *Deps) Splitter() (*lambdafn.Splitter, error) {
	if err := d.Env.Require("TABLE_NAME", "QUEUE_URL", "BUCKET_NAME", "STATE_MACHINE_ARN"); err != nil {
		return nil, err
	}
	blobs := d.Blobs()
	intake := pipeline.NewIntake(
		pipeline.NewSplitter(d.Store(), d.Queue(), pipeline.SplitterConfig{Clock: d.Clock, Logger: d.Logger}),
		blobs, d.Exports(),
		pipeline.IntakeConfig{
			DefaultSpec: d.Env.DefaultSpec(),
			Limits:      sheet.Limits{MaxRows: d.Env.MaxRows, MaxFileBytes: d.Env.MaxInputBytes},
			Uploads:     api.Uploads{Blobs: blobs},
			TempDir:     d.TempDir,
			Clock:       d.Clock,
			Logger:      d.Logger,
		})
	return &lambdafn.Splitter{Intake: intake, Metrics: d.Metrics, Logger: d.Logger}, nil
}

// Exporter builds the exporter function's handler.
func (d *Deps) Exporter() (*lambdafn.Exporter, error) {
	if err := d.Env.Require("TABLE_NAME", "BUCKET_NAME"); err != nil {
		return nil, err
	}
	return &lambdafn.Exporter{
		Exporter: pipeline.NewExporter(d.Store(), d.Blobs(), pipeline.ExporterConfig{Clock: d.Clock, Logger: d.Logger}),
		Metrics:  d.Metrics,
		Logger:   d.Logger,
	}, nil
}

// Sweeper builds the sweeper function's handler.
func (d *Deps) Sweeper() (*lambdafn.Sweeper, error) {
	if err := d.Env.Require("TABLE_NAME", "QUEUE_URL", "STATE_MACHINE_ARN"); err != nil {
		return nil, err
	}
	cfg := pipeline.SweeperConfig{Clock: d.Clock, Logger: d.Logger}
	if d.TuneSweeper != nil {
		d.TuneSweeper(&cfg)
	}
	return &lambdafn.Sweeper{
		Sweeper: pipeline.NewSweeper(d.Store(), d.Queue(), d.Exports(), cfg),
		Metrics: d.Metrics,
		Logger:  d.Logger,
	}, nil
}

// HTTP builds the api function's handler.
func (d *Deps) HTTP() (*lambdafn.HTTP, error) {
	if err := d.Env.Require("TABLE_NAME", "BUCKET_NAME"); err != nil {
		return nil, err
	}
	blobs := d.Blobs()
	return &lambdafn.HTTP{
		Handler: api.New(api.Config{
			Store: d.Store(), Blobs: blobs, Presigner: blobs, Clock: d.Clock, Logger: d.Logger,
			DefaultSpec: d.Env.DefaultSpec(), Exports: d.Exports(), MaxInputBytes: d.Env.MaxInputBytes,
			Retrier: pipeline.Retrier{Reopener: d.Store(), Queue: d.Queue()},
		}),
		Logger: d.Logger,
	}, nil
}
