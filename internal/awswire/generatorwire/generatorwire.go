// Package generatorwire builds the generator function: on top of
// awswire's adapters it needs the model provider (the OpenAI SDK, the API
// key from SSM) and the shared quota. It is its own package so that no
// other function links those.
package generatorwire

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn"
	"github.com/batchgen/batchgen/internal/llm"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/quota"
	"github.com/batchgen/batchgen/internal/quota/dynamoquota"
	"github.com/batchgen/batchgen/internal/store"
)

// Provider builds the model provider. For openai with MODEL_API_KEY_PARAM
// it reads the key from SSM Parameter Store (decrypted); the key is never
// logged.
func Provider(ctx context.Context, d *awswire.Deps) (llm.Provider, error) {
	switch d.Env.ModelProvider {
	case "openai":
		key := ""
		if name := d.Env.ModelAPIKeyParam; name != "" {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			out, err := ssm.NewFromConfig(d.AWS).GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(name), WithDecryption: aws.Bool(true)})
			if err != nil {
				return nil, fmt.Errorf("read the model API key from SSM parameter %s: %w", name, err)
			}
			if out.Parameter == nil || aws.ToString(out.Parameter.Value) == "" {
				return nil, fmt.Errorf("SSM parameter %s is empty", name)
			}
			key = aws.ToString(out.Parameter.Value)
		}
		p, err := openaillm.New(openaillm.Config{BaseURL: d.Env.ModelBaseURL, APIKey: key, Model: d.Env.ModelName})
		if err != nil {
			return nil, fmt.Errorf("model provider: %w", err)
		}
		return p, nil
	default:
		return sim.New(sim.Config{Latency: d.Env.SimLatency, Jitter: d.Env.SimLatency / 6, Clock: d.Clock}), nil
	}
}

// New builds the generator function's handler around one shared
// pipeline.Generator; ctx bounds the cold-start reads (the API key).
func New(ctx context.Context, d *awswire.Deps) (*lambdafn.Generator, error) {
	if err := d.Env.Require("TABLE_NAME", "QUEUE_URL", "STATE_MACHINE_ARN"); err != nil {
		return nil, err
	}
	provider, err := Provider(ctx, d)
	if err != nil {
		return nil, err
	}
	var st store.Store = d.Store()
	counter := lambdafn.NewGeneratorCounter()
	cfg := pipeline.GeneratorConfig{
		Cache:       d.Store(),
		Limiter:     limiter(d),
		Observer:    lambdafn.RowObserver(counter),
		Owner:       instanceName(d.Env.LogStream),
		Clock:       d.Clock,
		Logger:      d.Logger,
		Concurrency: d.Env.Concurrency,
		Lease:       d.Env.Lease,
	}
	if d.TuneGenerator != nil {
		st = d.TuneGenerator(st, &cfg)
	}
	gen := pipeline.NewGenerator(st, provider, d.Exports(), cfg)
	return &lambdafn.Generator{Generator: gen, Queue: d.Queue(), Counter: counter, Metrics: d.Metrics, Logger: d.Logger}, nil
}

// limiter paces the generator to QUOTA_RPM across every instance: a
// quota.Shared leasing per-second blocks from the table, so the sum over
// instances holds however many run. Quotas under one request a second fall
// back to a per-instance share. nil means unlimited.
func limiter(d *awswire.Deps) pipeline.Limiter {
	if d.Env.QuotaRPM <= 0 {
		return nil
	}
	name := d.Env.ModelProvider + ":" + d.Env.ModelName
	shared, err := quota.NewShared(dynamoquota.New(dynamodb.NewFromConfig(d.AWS), d.Env.TableName, name),
		quota.SharedConfig{RPM: d.Env.QuotaRPM, Clock: d.Clock})
	if err == nil {
		return shared
	}
	d.Logger.Warn("quota too small to share; each instance takes its share", "rpm", d.Env.QuotaRPM, "reason", err)
	return quota.NewLocal(quota.LocalConfig{RPM: d.Env.InstanceRPM(), Clock: d.Clock})
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
