package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/samstack"
)

// stackFlags name the stack on the emulator; every subcommand takes them.
type stackFlags struct {
	prefix   string
	stateDir string
}

func (f *stackFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&f.prefix, "prefix", "local", "resource name prefix: the stack's tables, queues, bucket are PREFIX-<logical id>")
	dir := getenv("BATCHGEN_EMULATOR_DIR")
	if dir == "" {
		dir = ".emulator"
	}
	fs.StringVar(&f.stateDir, "state-dir", dir, "where the stack's names are recorded for --reuse, upload and download (BATCHGEN_EMULATOR_DIR)")
}

// statePath is the file recording the stack provisioned under the prefix.
func (f *stackFlags) statePath() string {
	return filepath.Join(f.stateDir, "localaws-"+f.prefix+".json")
}

// stackState is what a run records about the stack it provisioned, so a
// later run (--reuse) and the upload and download subcommands find it:
// Provision's names are not the only thing to know (which queue is the
// work queue, the exporter's ARN in the state machine).
type stackState struct {
	// Endpoint is the emulator the stack lives on; another endpoint's
	// state is ignored.
	Endpoint  string              `json:"endpoint"`
	Resources *samstack.Resources `json:"resources"`
}

// errNoState says no stack is recorded for the prefix and endpoint.
var errNoState = errors.New("no stack recorded")

func saveState(path string, st stackState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("record the stack: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("record the stack: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("record the stack: %w", err)
	}
	return nil
}

// loadState reads the stack recorded at path for endpoint; errNoState when
// there is none, or it was for another endpoint.
func loadState(path, endpoint string) (*samstack.Resources, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoState
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var st stackState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if st.Resources == nil || st.Endpoint != endpoint {
		return nil, errNoState
	}
	return st.Resources, nil
}

// stackExists reports whether every resource of res is still on the
// emulator: moto forgets everything when it restarts.
func stackExists(ctx context.Context, cfg aws.Config, res *samstack.Resources) error {
	if res.TableName == "" || res.QueueURL == "" || res.DLQURL == "" || res.BucketName == "" || res.StateMachineArn == "" {
		return errors.New("the recorded stack is incomplete")
	}
	if _, err := dynamodb.NewFromConfig(cfg).DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(res.TableName)}); err != nil {
		return fmt.Errorf("table %s: %w", res.TableName, err)
	}
	q := sqs.NewFromConfig(cfg)
	for _, u := range []string{res.QueueURL, res.DLQURL} {
		if _, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(u)}); err != nil {
			return fmt.Errorf("queue %s: %w", u, err)
		}
	}
	s3c := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })
	if _, err := s3c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(res.BucketName)}); err != nil {
		return fmt.Errorf("bucket %s: %w", res.BucketName, err)
	}
	if _, err := sfn.NewFromConfig(cfg).DescribeStateMachine(ctx, &sfn.DescribeStateMachineInput{StateMachineArn: aws.String(res.StateMachineArn)}); err != nil {
		return fmt.Errorf("state machine %s: %w", res.StateMachineArn, err)
	}
	return nil
}

// emulator returns the emulator's configuration and endpoint, or a usage
// error saying how to start it.
func emulator(ctx context.Context) (aws.Config, string, error) {
	cfg, err := samstack.Config(ctx)
	if errors.Is(err, samstack.ErrNoEndpoint) {
		return aws.Config{}, "", &report.ExitError{Code: report.Rejected, Err: errors.New(samstack.EndpointEnv +
			` is not set. Start the emulator and export its endpoint first:
  eval "$(infra/emulator/start.sh)"; export AWS_ENDPOINT_URL`)}
	}
	if err != nil {
		return aws.Config{}, "", &report.ExitError{Code: report.Rejected, Err: err}
	}
	return cfg, aws.ToString(cfg.BaseEndpoint), nil
}

// recorded returns the stack recorded for the prefix, checking that it
// still exists, for the upload and download subcommands.
func recorded(ctx context.Context, cfg aws.Config, endpoint string, f stackFlags) (*samstack.Resources, error) {
	res, err := loadState(f.statePath(), endpoint)
	if err == nil {
		err = stackExists(ctx, cfg, res)
	}
	if err != nil {
		return nil, &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("no stack %q on %s (%v); start it with: go run ./cmd/batchgen-localaws%s",
			f.prefix, endpoint, err, prefixArg(f.prefix))}
	}
	return res, nil
}

// prefixArg is the --prefix argument to repeat in printed commands.
func prefixArg(prefix string) string {
	if prefix == "local" {
		return ""
	}
	return " --prefix " + prefix
}

// lambdaVars are the function settings read from the environment, as the
// Lambda functions read them (template.yaml sets them there).
var lambdaVars = []string{
	"MODEL_PROVIDER", "MODEL_NAME", "MODEL_BASE_URL", "MODEL_API_KEY_PARAM", "QUOTA_RPM", "QUOTA_TPM", "MAX_CONCURRENCY",
	"GENERATOR_CONCURRENCY", "SIM_LATENCY", "BATCH_SIZE", "MAX_ROWS", "MAX_INPUT_BYTES", "LEASE_SECONDS",
	"DEFAULT_PROMPT",
}

// modelFlags are the flags that override those settings.
type modelFlags struct {
	provider, model, baseURL, simLatency, prompt string
	batchSize, quotaRPM, quotaTPM                int
}

func (m *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.provider, "provider", "sim", "model provider: sim or openai (MODEL_PROVIDER); --base-url implies openai")
	fs.StringVar(&m.model, "model", "mock-1", "model name for openai (MODEL_NAME)")
	fs.StringVar(&m.baseURL, "base-url", "", "OpenAI-compatible endpoint, e.g. http://127.0.0.1:8089/v1 for batchgen mock-llm (MODEL_BASE_URL)")
	fs.StringVar(&m.simLatency, "sim-latency", "50ms", "the simulator's call latency (SIM_LATENCY)")
	fs.StringVar(&m.prompt, "prompt", "", "prompt template for sheets without a prompt sheet (DEFAULT_PROMPT)")
	fs.IntVar(&m.batchSize, "batch-size", 25, "rows per batch (BATCH_SIZE)")
	fs.IntVar(&m.quotaRPM, "quota-rpm", 0, "provider requests per minute across generators, 0 for none (QUOTA_RPM)")
	fs.IntVar(&m.quotaTPM, "quota-tpm", 0, "provider tokens per minute across generators, 0 for none (QUOTA_TPM)")
}

// functionEnv builds the functions' configuration: the stack's resources;
// then the flags' defaults; then the Lambda variables set in the
// environment; then the flags given on the command line.
func functionEnv(res *samstack.Resources, fs *flag.FlagSet, m *modelFlags, getenv func(string) string) (awswire.Env, error) {
	vars := res.Env()
	fromFlag := map[string]string{
		"provider": "MODEL_PROVIDER", "model": "MODEL_NAME", "base-url": "MODEL_BASE_URL", "sim-latency": "SIM_LATENCY",
		"prompt": "DEFAULT_PROMPT", "batch-size": "BATCH_SIZE", "quota-rpm": "QUOTA_RPM", "quota-tpm": "QUOTA_TPM",
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) {
		if name, ok := fromFlag[f.Name]; ok && f.DefValue != "" {
			vars[name] = f.DefValue
		}
	})
	for _, name := range lambdaVars {
		if v := getenv(name); v != "" {
			vars[name] = v
		}
	}
	fs.Visit(func(f *flag.Flag) {
		if name, ok := fromFlag[f.Name]; ok {
			vars[name] = f.Value.String()
		}
	})
	if given["base-url"] && !given["provider"] {
		vars["MODEL_PROVIDER"] = "openai"
	}
	env, err := awswire.LoadEnv(func(k string) string { return vars[k] })
	if err != nil {
		return awswire.Env{}, &report.ExitError{Code: report.Rejected, Err: err}
	}
	if env.ModelProvider == "openai" && env.ModelBaseURL == "" && env.ModelAPIKeyParam == "" {
		return awswire.Env{}, &report.ExitError{Code: report.Rejected, Err: errors.New("--provider openai needs --base-url (batchgen mock-llm or another OpenAI-compatible server)")}
	}
	return env, nil
}

// describeModel says which model the generators call, for the banner.
func describeModel(env awswire.Env) string {
	if env.ModelProvider == "sim" {
		return fmt.Sprintf("sim (latency %v)", env.SimLatency)
	}
	return strings.TrimSpace(fmt.Sprintf("openai %s at %s", env.ModelName, env.ModelBaseURL))
}
