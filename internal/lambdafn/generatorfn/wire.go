package generatorfn

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/llm"
	bedrockllm "github.com/batchgen/batchgen/internal/llm/bedrock"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/providers"
	"github.com/batchgen/batchgen/internal/queue/sqsqueue"
	"github.com/batchgen/batchgen/internal/quota"
	"github.com/batchgen/batchgen/internal/quota/dynamoquota"
	"github.com/batchgen/batchgen/internal/stepfn"
	"github.com/batchgen/batchgen/internal/store"
)

// Providers builds f's providers for the generator: openai keys from SSM
// (api_key_param), Bedrock signed by the function's role, and for each
// provider with an rpm a limiter shared by every instance, leasing its
// quota from the table under the provider's name (the rest take an
// instance's share of theirs: providers.Limiters); metrics go to rec. ctx
// bounds the cold-start reads of the keys. The handler gives back the
// seconds the shared limiters leased ahead when an invocation ends
// (providers.Set.Release through Handler.Idle).
func Providers(ctx context.Context, d *awswire.Deps, f *providerfile.File, rec metrics.Recorder) (*providers.Set, error) {
	db := dynamodb.NewFromConfig(d.AWS)
	return providers.Build(f, providers.Config{
		Builder: providers.Builder{
			Clock:  d.Clock,
			Logger: d.Logger,
			Key: func(p providerfile.Provider) (string, error) {
				if p.APIKeyParam == "" {
					return strings.TrimSpace(os.Getenv(p.APIKeyEnv)), nil
				}
				return readKey(ctx, d, p.APIKeyParam)
			},
			Bedrock: func(p providerfile.Provider) (llm.Provider, error) {
				// Signed by the function's role: no key. The role may invoke
				// the models the template grants only; a task calling another
				// gets AccessDenied, which stops that provider's calls.
				cfg := bedrockllm.Config{Model: p.Model, Region: p.Region, BaseURL: p.BaseURL}
				return bedrockllm.New(bedrockllm.NewClient(d.AWS, cfg), cfg)
			},
			// Batch inference jobs read and write the stack's bucket as
			// the template's service role (BEDROCK_BATCH_ROLE_ARN).
			BedrockBatch: func(p providerfile.Provider) (llm.BatchProvider, error) { return providers.BedrockBatch(d.AWS, p) },
		},
		Limiters: providers.Limiters{
			Clock: d.Clock, Logger: d.Logger, Instances: d.Env.MaxConcurrency,
			Leases: func(p providerfile.Provider) quota.Leaser { return dynamoquota.New(db, d.Env.TableName, p.Name) },
		},
		Router: pipeline.RouterConfig{Logger: d.Logger, Metrics: rec},
	})
}

// readKey reads an API key from SSM Parameter Store (decrypted); the key is
// never logged.
func readKey(ctx context.Context, d *awswire.Deps, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := ssm.NewFromConfig(d.AWS).GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(name), WithDecryption: aws.Bool(true)})
	if err != nil {
		return "", fmt.Errorf("read the model API key from SSM parameter %s: %w", name, err)
	}
	if out.Parameter == nil || aws.ToString(out.Parameter.Value) == "" {
		return "", fmt.Errorf("SSM parameter %s is empty", name)
	}
	return aws.ToString(out.Parameter.Value), nil
}

// New builds the generator function's handler around one shared
// pipeline.Generator; ctx bounds the cold-start reads (the API keys).
func New(ctx context.Context, d *awswire.Deps) (*Handler, error) {
	if err := d.Env.Require("TABLE_NAME", "QUEUE_URL", "STATE_MACHINE_ARN"); err != nil {
		return nil, err
	}
	f, err := d.Env.Providers()
	if err != nil {
		return nil, err
	}
	// A key or model the role may not use would fail every row with
	// AccessDenied (or the cold start, for a key, without saying which
	// parameter grants it): refuse the file now, naming what to grant.
	if err := f.CheckGrants(d.Env.Grants(d.AWS.Region)); err != nil {
		return nil, fmt.Errorf("the providers need more than the generator's role is granted: %w", err)
	}
	counter := NewCounter()
	set, err := Providers(ctx, d, f, counter)
	if err != nil {
		return nil, err
	}
	router := set.Router
	// Rows over DynamoDB's item size keep their cells in the bucket.
	overflow := s3blob.FromConfig(d.AWS, d.Env.BucketName, s3blob.Options{})
	var st store.Store = d.Store(overflow)
	cfg := pipeline.GeneratorConfig{
		Cache:     d.Store(overflow),
		CacheMode: d.Env.CacheMode, CacheScope: d.Env.CacheScope,
		Metrics: counter,
		Owner:   instanceName(d.Env.LogStream),
		Clock:   d.Clock,
		Logger:  d.Logger,
		// Rows in flight: every provider's slots can be busy at once.
		Concurrency: f.Concurrency(),
		CallTimeout: router.MaxTimeout(),
		Lease:       d.Env.Lease,
		// Each instance takes its share of the token quota; a packed call
		// fits a quarter of the whole (the shared limiter spreads it).
		PackTokens: f.PackTokens(),
		// An invocation lasts minutes and a provider batch hours: an
		// economy batch is parked between looks, its provider batches
		// journaled in the table, where every instance finds them.
		Economy: pipeline.EconomyConfig{Journal: d.Store(overflow), Park: true, Poll: d.Env.ProviderBatchPoll},
		// A task's spending cap holds across the fleet: each instance
		// prices its calls as the API prices tasks (the providers file's
		// prices over the built-in table) and takes its allowances from
		// the task's ledger in the table.
		Prices:     pricing.Default().FromProviders(f),
		Allowances: d.Store(overflow),
	}
	if d.TuneGenerator != nil {
		st = d.TuneGenerator(st, &cfg)
	}
	gen := pipeline.NewGenerator(st, router, d.Exports(stepfn.FromConfig(d.AWS, d.Env.StateMachineARN)), cfg)
	queue := sqsqueue.FromConfig(d.AWS, d.Env.QueueURL, sqsqueue.Options{DLQURL: d.Env.DLQURL, Clock: d.Clock})
	idle := func(ctx context.Context) {
		if err := set.Release(ctx); err != nil {
			// The seconds stay leased and unused: the fleet loses a few
			// seconds of quota, nothing more.
			d.Logger.WarnContext(ctx, "shared quota: could not give back the seconds leased ahead", "error", err)
		}
	}
	return &Handler{Generator: gen, Queue: queue, Counter: counter, Metrics: d.Metrics, Logger: d.Logger, Idle: idle}, nil
}

// instanceName names this Lambda instance in batch claims, so an operator
// can find the log stream of the worker that holds a batch.
func instanceName(logStream string) string {
	if logStream != "" {
		return logStream
	}
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return "generator-" + hex.EncodeToString(b[:])
}
