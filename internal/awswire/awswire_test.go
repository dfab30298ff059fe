package awswire_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/awswire/generatorwire"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// templateEnv is what template.yaml's Globals set, plus STATE_MACHINE_ARN.
var templateEnv = map[string]string{
	"TABLE_NAME":          "batchgen-Table-1",
	"QUEUE_URL":           "https://sqs.us-east-1.amazonaws.com/123456789012/batchgen-WorkQueue",
	"DLQ_URL":             "https://sqs.us-east-1.amazonaws.com/123456789012/batchgen-DeadLetterQueue",
	"BUCKET_NAME":         "batchgen-123456789012-us-east-1",
	"STATE_MACHINE_ARN":   "arn:aws:states:us-east-1:123456789012:stateMachine:Export",
	"MODEL_PROVIDER":      "openai",
	"MODEL_NAME":          "gpt-4o-mini",
	"MODEL_BASE_URL":      "",
	"MODEL_API_KEY_PARAM": "/batchgen/openai-api-key",
	"QUOTA_RPM":           "2000",
	"BATCH_SIZE":          "100",
	"MAX_ROWS":            "100000",
	"LEASE_SECONDS":       "360",
	"LOG_LEVEL":           "warn",
	"STACK_NAME":          "batchgen",
}

func getenv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadEnv(t *testing.T) {
	t.Parallel()
	env, err := awswire.LoadEnv(getenv(templateEnv))
	if err != nil {
		t.Fatalf("LoadEnv: %v", err)
	}
	want := awswire.Env{
		TableName: "batchgen-Table-1", QueueURL: templateEnv["QUEUE_URL"], DLQURL: templateEnv["DLQ_URL"],
		BucketName: "batchgen-123456789012-us-east-1", StateMachineARN: templateEnv["STATE_MACHINE_ARN"],
		ModelProvider: "openai", ModelName: "gpt-4o-mini", ModelAPIKeyParam: "/batchgen/openai-api-key",
		QuotaRPM: 2000, MaxConcurrency: 10, Concurrency: 8, SimLatency: 300 * time.Millisecond,
		BatchSize: 100, MaxRows: 100000, MaxInputBytes: 100 << 20, Lease: 360 * time.Second,
		LogLevel: slog.LevelWarn, StackName: "batchgen",
	}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("env mismatch (-want +got):\n%s", diff)
	}
	if got := env.InstanceRPM(); got != 200 {
		t.Errorf("InstanceRPM = %d, want 2000/10", got)
	}
	wantSpec := store.TaskSpec{Provider: "openai", Model: "gpt-4o-mini", BatchSize: 100}
	if diff := cmp.Diff(wantSpec, env.DefaultSpec()); diff != "" {
		t.Errorf("DefaultSpec mismatch (-want +got):\n%s", diff)
	}
}

func TestLoadEnvDefaults(t *testing.T) {
	t.Parallel()
	env, err := awswire.LoadEnv(getenv(nil))
	if err != nil {
		t.Fatalf("LoadEnv: %v", err)
	}
	if env.ModelProvider != "sim" || env.BatchSize != 100 || env.Lease != 360*time.Second || env.InstanceRPM() != 0 {
		t.Errorf("defaults = provider %q, batch %d, lease %v, rpm %d", env.ModelProvider, env.BatchSize, env.Lease, env.InstanceRPM())
	}
	if spec := env.DefaultSpec(); spec.Model != "sim-1" {
		t.Errorf("sim model = %q, want sim-1", spec.Model)
	}
}

func TestLoadEnvRejects(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, key, value, want string }{
		{"provider", "MODEL_PROVIDER", "bedrock", "MODEL_PROVIDER"},
		{"quota", "QUOTA_RPM", "lots", "QUOTA_RPM"},
		{"batch size", "BATCH_SIZE", "0", "BATCH_SIZE"},
		{"lease", "LEASE_SECONDS", "-5", "LEASE_SECONDS"},
		{"log level", "LOG_LEVEL", "loud", "LOG_LEVEL"},
		{"key parameter", "MODEL_API_KEY_PARAM", "sk-live-123", "MODEL_API_KEY_PARAM"},
		{"sim latency", "SIM_LATENCY", "fast", "SIM_LATENCY"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := map[string]string{}
			for k, v := range templateEnv {
				m[k] = v
			}
			m[tc.key] = tc.value
			_, err := awswire.LoadEnv(getenv(m))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadEnv error = %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestBuildersCheckTheirResources builds every handler from the template's
// environment (no AWS call is made until an event arrives) and checks that
// a missing resource fails the cold start.
func TestBuildersCheckTheirResources(t *testing.T) {
	t.Parallel()
	env, err := awswire.LoadEnv(getenv(templateEnv))
	if err != nil {
		t.Fatal(err)
	}
	env.ModelProvider = "sim" // openai would read the key from SSM
	cfg := aws.Config{Region: "us-east-1"}
	builders := map[string]func(*awswire.Deps) error{
		"splitter":  func(d *awswire.Deps) error { _, err := d.Splitter(); return err },
		"generator": func(d *awswire.Deps) error { _, err := generatorwire.New(context.Background(), d); return err },
		"exporter":  func(d *awswire.Deps) error { _, err := d.Exporter(); return err },
		"sweeper":   func(d *awswire.Deps) error { _, err := d.Sweeper(); return err },
		"api":       func(d *awswire.Deps) error { _, err := d.HTTP(); return err },
	}
	for name, build := range builders {
		if err := build(awswire.NewDeps(env, cfg, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		missing := env
		missing.TableName = ""
		if err := build(awswire.NewDeps(missing, cfg, name)); err == nil || !strings.Contains(err.Error(), "TABLE_NAME") {
			t.Errorf("%s without TABLE_NAME: %v, want an error naming it", name, err)
		}
	}
}

// TestGeneratorQuotaIsShared: with QUOTA_RPM set, the generator paces with
// the table-backed shared limiter, so the quota holds across instances;
// a quota under one request a second falls back to a per-instance share.
func TestGeneratorQuotaIsShared(t *testing.T) {
	t.Parallel()
	env, err := awswire.LoadEnv(getenv(templateEnv))
	if err != nil {
		t.Fatal(err)
	}
	env.ModelProvider = "sim"
	cfg := aws.Config{Region: "us-east-1"}
	tests := []struct {
		rpm  int
		want string
	}{
		{2000, "*quota.Shared"},
		{30, "*quota.Local"},
		{0, "<nil>"},
	}
	for _, tc := range tests {
		env.QuotaRPM = tc.rpm
		d := awswire.NewDeps(env, cfg, "generator")
		var limiter pipeline.Limiter
		d.TuneGenerator = func(st store.Store, cfg *pipeline.GeneratorConfig) store.Store {
			limiter = cfg.Limiter
			return st
		}
		if _, err := generatorwire.New(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%T", limiter); got != tc.want {
			t.Errorf("QUOTA_RPM=%d: limiter %s, want %s", tc.rpm, got, tc.want)
		}
	}
}
