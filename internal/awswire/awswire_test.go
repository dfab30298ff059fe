package awswire_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
	"github.com/batchgen/batchgen/internal/lambdafn/exporterfn"
	"github.com/batchgen/batchgen/internal/lambdafn/generatorfn"
	"github.com/batchgen/batchgen/internal/lambdafn/splitterfn"
	"github.com/batchgen/batchgen/internal/lambdafn/sweeperfn"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/quota"
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
	"QUOTA_TPM":           "0",
	"BATCH_SIZE":          "100",
	"MAX_ROWS":            "100000",
	"LEASE_SECONDS":       "360",
	"PROVIDER_BATCH_POLL": "300s",
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
		BatchSize: 100, MaxRows: 100000, MaxInputBytes: 100 << 20, Lease: 360 * time.Second, ProviderBatchPoll: 5 * time.Minute,
		LogLevel: slog.LevelWarn, StackName: "batchgen",
		CacheMode: pipeline.CacheAuto, CacheScope: pipeline.CachePerPrincipal, CacheTTL: store.DefaultCacheTTL,
	}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("env mismatch (-want +got):\n%s", diff)
	}
	wantSpec := store.TaskSpec{Provider: "openai", Model: "gpt-4o-mini", BatchSize: 100}
	gotSpec, err := env.DefaultSpec()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantSpec, gotSpec); diff != "" {
		t.Errorf("DefaultSpec mismatch (-want +got):\n%s", diff)
	}
}

func TestLoadEnvDefaults(t *testing.T) {
	t.Parallel()
	env, err := awswire.LoadEnv(getenv(nil))
	if err != nil {
		t.Fatalf("LoadEnv: %v", err)
	}
	if env.ModelProvider != "sim" || env.BatchSize != 100 || env.Lease != 360*time.Second || env.QuotaRPM != 0 || env.MaxConcurrency != 10 {
		t.Errorf("defaults = provider %q, batch %d, lease %v, rpm %d, instances %d", env.ModelProvider, env.BatchSize, env.Lease, env.QuotaRPM, env.MaxConcurrency)
	}
	if spec, err := env.DefaultSpec(); err != nil || spec.Model != "sim-1" {
		t.Errorf("sim model = %q (%v), want sim-1", spec.Model, err)
	}
}

// TestBedrockEnv: a bedrock deployment calls its inference profile when
// it has one, else the model; it needs one of the two.
func TestBedrockEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, model, profile, wantModel, wantErr string
	}{
		{name: "model", model: "amazon.nova-lite-v1:0", wantModel: "amazon.nova-lite-v1:0"},
		{name: "profile", model: "amazon.nova-lite-v1:0", profile: "us.amazon.nova-lite-v1:0", wantModel: "us.amazon.nova-lite-v1:0"},
		{name: "neither", wantErr: "MODEL_PROVIDER bedrock needs MODEL_NAME"},
	}
	for _, tc := range tests {
		m := map[string]string{}
		for k, v := range templateEnv {
			m[k] = v
		}
		m["MODEL_PROVIDER"], m["MODEL_NAME"], m["BEDROCK_INFERENCE_PROFILE"] = "bedrock", tc.model, tc.profile
		env, err := awswire.LoadEnv(getenv(m))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: LoadEnv error = %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, err := env.DefaultSpec(); err != nil || got.Provider != "bedrock" || got.Model != tc.wantModel {
			t.Errorf("%s: DefaultSpec provider %q model %q (%v), want bedrock %q", tc.name, got.Provider, got.Model, err, tc.wantModel)
		}
	}
}

func TestLoadEnvRejects(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, key, value, want string }{
		{"provider", "MODEL_PROVIDER", "vertex", "MODEL_PROVIDER"},
		{"quota", "QUOTA_RPM", "lots", "QUOTA_RPM"},
		{"batch size", "BATCH_SIZE", "0", "BATCH_SIZE"},
		{"lease", "LEASE_SECONDS", "-5", "LEASE_SECONDS"},
		{"log level", "LOG_LEVEL", "loud", "LOG_LEVEL"},
		{"key parameter", "MODEL_API_KEY_PARAM", "sk-live-123", "MODEL_API_KEY_PARAM"},
		{"sim latency", "SIM_LATENCY", "fast", "SIM_LATENCY"},
		{"cache mode", "CACHE_MODE", "sometimes", "CACHE_MODE"},
		{"cache ttl", "CACHE_TTL", "0d", "CACHE_TTL"},
		{"cache ttl unit", "CACHE_TTL", "30", "CACHE_TTL"},
		{"drop result format", "DROP_RESULT_FORMAT", "ods", "DROP_RESULT_FORMAT"},
		{"provider batch poll past SQS's delay", "PROVIDER_BATCH_POLL", "20m", "PROVIDER_BATCH_POLL"},
		{"provider batch poll", "PROVIDER_BATCH_POLL", "soon", "PROVIDER_BATCH_POLL"},
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
		"splitter":  func(d *awswire.Deps) error { _, err := splitterfn.New(d); return err },
		"generator": func(d *awswire.Deps) error { _, err := generatorfn.New(context.Background(), d); return err },
		"exporter":  func(d *awswire.Deps) error { _, err := exporterfn.New(d); return err },
		"sweeper":   func(d *awswire.Deps) error { _, err := sweeperfn.New(d); return err },
		"api":       func(d *awswire.Deps) error { _, err := apifn.New(d); return err },
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
// a quota under one request a second, or none, falls back to a
// per-instance limiter (learning the quota from 429s when none is given).
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
		// perMinute is an instance's own quota, for a per-instance limiter:
		// its share of the fleet's (MAX_CONCURRENCY 10).
		perMinute float64
	}{
		{2000, "*quota.Shared", 0},
		{30, "*quota.Local", 3},
		{0, "*quota.Local", 0},
	}
	for _, tc := range tests {
		env.QuotaRPM = tc.rpm
		f, err := env.Providers()
		if err != nil {
			t.Fatal(err)
		}
		d := awswire.NewDeps(env, cfg, "generator")
		set, err := generatorfn.Providers(context.Background(), d, f, nil)
		if err != nil {
			t.Fatal(err)
		}
		l := set.Limiter(f.Providers[0].Name)
		if got := fmt.Sprintf("%T", l); got != tc.want {
			t.Errorf("QUOTA_RPM=%d: limiter %s, want %s", tc.rpm, got, tc.want)
		}
		if local, ok := l.(*quota.Local); ok && tc.perMinute > 0 && (local.Rate()*60 > tc.perMinute || local.Rate()*60 < 0.9*tc.perMinute) {
			t.Errorf("QUOTA_RPM=%d over 10 instances: an instance paces at %.2f/min, want %v (a little under is its margin)", tc.rpm, local.Rate()*60, tc.perMinute)
		}
		if _, err := generatorfn.New(context.Background(), d); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGeneratorProvidersFromParameters: without PROVIDERS_FILE the model
// parameters build the one-entry file run's flags would, with the key's
// SSM parameter for openai.
func TestGeneratorProvidersFromParameters(t *testing.T) {
	t.Parallel()
	env, err := awswire.LoadEnv(getenv(templateEnv))
	if err != nil {
		t.Fatal(err)
	}
	f, err := env.Providers()
	if err != nil {
		t.Fatal(err)
	}
	weight := 1
	want := []providerfile.Provider{{
		Name: "openai/gpt-4o-mini", Kind: providerfile.KindOpenAI, Model: "gpt-4o-mini", APIKeyParam: "/batchgen/openai-api-key",
		RPM: 2000, Concurrency: 8, Timeout: providerfile.DefaultTimeout, Weight: &weight,
	}}
	if diff := cmp.Diff(want, f.Providers, cmpopts.IgnoreUnexported(providerfile.Provider{})); diff != "" {
		t.Errorf("providers from the parameters (-want +got):\n%s", diff)
	}
}

// TestGeneratorProvidersFile: PROVIDERS_FILE routes the generator over
// its entries, each with its own shared limiter keyed by its name; a bad
// file fails the cold start naming the key and its line.
func TestGeneratorProvidersFile(t *testing.T) {
	t.Parallel()
	env, err := awswire.LoadEnv(getenv(templateEnv))
	if err != nil {
		t.Fatal(err)
	}
	env.ProvidersFile = `routing: weighted
providers:
  - {name: east, kind: mock, base_url: "http://127.0.0.1:1/v1", rpm: 600, tpm: 90000, concurrency: 3}
  - {name: west, kind: sim, rpm: 30, concurrency: 5, timeout: 90s}
  - {name: nova, kind: bedrock, model: amazon.nova-lite-v1:0, region: us-west-2, concurrency: 2, weight: 0}
`
	// The role may invoke the entry's model (ProviderBedrockModels).
	env.ProviderBedrockModels = []string{"amazon.nova-lite-v1:0"}
	f, err := env.Providers()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"east", "west", "nova"}, f.Names()); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	d := awswire.NewDeps(env, aws.Config{Region: "us-east-1"}, "generator")
	set, err := generatorfn.Providers(context.Background(), d, f, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, want string }{{"east", "*quota.Shared"}, {"west", "*quota.Local"}, {"nova", "*quota.Local"}} {
		if got := fmt.Sprintf("%T", set.Limiter(tc.name)); got != tc.want {
			t.Errorf("%s: limiter %s, want %s", tc.name, got, tc.want)
		}
	}
	if !set.Shared() {
		t.Error("no shared limiter in the set; the seconds east leases ahead would never be given back")
	}
	router := set.Router
	// The Bedrock entry is built with the function's AWS configuration
	// (signed by its role), in the entry's region.
	if diff := cmp.Diff([]string{"east", "west", "nova"}, router.Routes()); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
	var got pipeline.GeneratorConfig
	d.TuneGenerator = func(st store.Store, cfg *pipeline.GeneratorConfig) store.Store {
		got = *cfg
		return st
	}
	if _, err := generatorfn.New(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if got.Concurrency != 10 || got.CallTimeout != 90*time.Second {
		t.Errorf("generator concurrency %d, call timeout %v; want 3+5+2 and the longest timeout, 90s", got.Concurrency, got.CallTimeout)
	}

	env.ProvidersFile = "providers:\n  - name: east\n    kind: mock\n    rmp: 600\n"
	_, err = generatorfn.New(context.Background(), awswire.NewDeps(env, aws.Config{Region: "us-east-1"}, "generator"))
	if err == nil || !strings.Contains(err.Error(), "PROVIDERS_FILE:4") || !strings.Contains(err.Error(), `"rmp"`) {
		t.Errorf("bad file: %v; want an error naming PROVIDERS_FILE, line 4 and the key", err)
	}
}

// TestGeneratorCacheSettings: CACHE_MODE and CACHE_TTL (the template's
// CacheMode and CacheTtlDays) reach the generator's configuration and its
// store, read by the same functions as run's --cache and --cache-ttl.
func TestGeneratorCacheSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		mode, ttl string
		wantMode  pipeline.CacheMode
		wantTTL   time.Duration
	}{
		{"", "", pipeline.CacheAuto, store.DefaultCacheTTL},
		{"always", "7d", pipeline.CacheAlways, 7 * 24 * time.Hour},
		{"off", "12h", pipeline.CacheOff, 12 * time.Hour},
	}
	for _, tc := range tests {
		m := map[string]string{"CACHE_MODE": tc.mode, "CACHE_TTL": tc.ttl}
		for k, v := range templateEnv {
			m[k] = v
		}
		env, err := awswire.LoadEnv(getenv(m))
		if err != nil {
			t.Fatal(err)
		}
		if env.CacheTTL != tc.wantTTL {
			t.Errorf("CACHE_TTL=%q: CacheTTL %v, want %v", tc.ttl, env.CacheTTL, tc.wantTTL)
		}
		env.ModelProvider = "sim"
		d := awswire.NewDeps(env, aws.Config{Region: "us-east-1"}, "generator")
		var got pipeline.GeneratorConfig
		d.TuneGenerator = func(st store.Store, cfg *pipeline.GeneratorConfig) store.Store {
			got = *cfg
			return st
		}
		if _, err := generatorfn.New(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		if got.CacheMode != tc.wantMode || got.Cache == nil {
			t.Errorf("CACHE_MODE=%q: generator cache mode %q (cache %v), want %q with a cache", tc.mode, got.CacheMode, got.Cache != nil, tc.wantMode)
		}
		if ttl := got.Cache.(interface{ CacheTTL() time.Duration }).CacheTTL(); ttl != tc.wantTTL {
			t.Errorf("CACHE_TTL=%q: the generator's cache keeps entries %v, want %v", tc.ttl, ttl, tc.wantTTL)
		}
	}
}

// TestDefaultSpecFollowsProviders: the spec the splitter and the api build
// (DefaultSpec) says about its providers what batchgen run --providers
// says for the same file (providerfile.File.Spec): a routed deployment's
// tasks carry the routed label and the first entry's model, so their ids
// and cache keys are those of the local run. A bad file fails the cold
// start of every function that builds specs, naming PROVIDERS_FILE.
func TestDefaultSpecFollowsProviders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, file      string
		provider, model string
		wantErr         string
		single          map[string]string // model parameters instead of a file
	}{
		{
			name:     "routed",
			file:     "routing: ordered\nproviders:\n  - {name: openai, kind: openai, api_key_param: /batchgen/openai-key}\n  - {name: nova, kind: bedrock, model: us.amazon.nova-lite-v1:0}\n",
			provider: "routed:openai,nova", model: "gpt-4o-mini",
		},
		{
			name:     "routed, bedrock first",
			file:     "providers:\n  - {name: nova, kind: bedrock, model: amazon.nova-lite-v1:0, region: us-west-2}\n  - {name: local, kind: mock, base_url: \"http://127.0.0.1:9/v1\", model: qwen}\n",
			provider: "routed:nova,local", model: "amazon.nova-lite-v1:0",
		},
		{
			// One entry is labelled by its kind, as run's single-provider
			// flags are, so the file and the flags make the same task.
			name: "one entry", file: "providers:\n  - {name: mine, kind: openai, model: gpt-4.1-mini}\n",
			provider: "openai", model: "gpt-4.1-mini",
		},
		{
			name: "no file: the model parameters", single: map[string]string{"MODEL_PROVIDER": "bedrock", "MODEL_NAME": "amazon.nova-lite-v1:0", "BEDROCK_INFERENCE_PROFILE": "us.amazon.nova-lite-v1:0"},
			provider: "bedrock", model: "us.amazon.nova-lite-v1:0",
		},
		{
			// The template's ModelName is empty by default: the kind's
			// default model.
			name: "no file: anthropic, its default model", single: map[string]string{"MODEL_PROVIDER": "anthropic", "MODEL_NAME": "", "MODEL_API_KEY_PARAM": "/batchgen/anthropic-key"},
			provider: "anthropic", model: "claude-haiku-4-5",
		},
		{
			name: "bad file", file: "providers:\n  - name: east\n    kind: mock\n    rmp: 600\n",
			wantErr: "PROVIDERS_FILE:4",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := map[string]string{"DEFAULT_PROMPT": "写{{名称}}", "PROVIDERS_FILE": tc.file}
			for k, v := range templateEnv {
				m[k] = v
			}
			for k, v := range tc.single {
				m[k] = v
			}
			env, err := awswire.LoadEnv(getenv(m))
			if err != nil {
				t.Fatal(err)
			}
			spec, err := env.DefaultSpec()
			d := awswire.NewDeps(env, aws.Config{Region: "us-east-1"}, "test")
			_, splitErr := splitterfn.New(d)
			_, apiErr := apifn.New(d)
			if tc.wantErr != "" {
				for fn, err := range map[string]error{"DefaultSpec": err, "splitter": splitErr, "api": apiErr} {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), `"rmp"`) {
						t.Errorf("%s: error %v, want one naming %s and the key", fn, err, tc.wantErr)
					}
				}
				return
			}
			if err != nil || splitErr != nil || apiErr != nil {
				t.Fatalf("DefaultSpec: %v; splitter: %v; api: %v", err, splitErr, apiErr)
			}
			want := store.TaskSpec{Prompt: "写{{名称}}", Provider: tc.provider, Model: tc.model, BatchSize: 100}
			if diff := cmp.Diff(want, spec); diff != "" {
				t.Errorf("DefaultSpec (-want +got):\n%s", diff)
			}
			if tc.file == "" {
				return
			}
			// The local run's rule on the same file gives the same spec,
			// hence the same task id for the same source.
			f, err := providerfile.Parse("providers.yaml", []byte(tc.file))
			if err != nil {
				t.Fatal(err)
			}
			local := f.Spec(store.TaskSpec{Prompt: "写{{名称}}", BatchSize: 100})
			if got, wantID := pipeline.DeriveTaskID("skus.xlsx@1", spec), pipeline.DeriveTaskID("skus.xlsx@1", local); got != wantID {
				t.Errorf("task id on AWS %s, locally %s", got, wantID)
			}
		})
	}
}

// TestGeneratorChecksGrants: the generator refuses at cold start a
// providers file that needs a key parameter or Bedrock model its role is
// not granted (template.yaml: ModelApiKeyParam, ProviderApiKeyParams,
// ModelProvider=bedrock's model or profile, ProviderBedrockModels), naming
// what is missing and the parameter that grants it, instead of failing
// every row with AccessDenied.
func TestGeneratorChecksGrants(t *testing.T) {
	t.Parallel()
	const region = "us-east-1"
	tests := []struct {
		name    string
		vars    map[string]string
		wantErr []string // substrings of the error; none: the generator starts
		// reads, when set, is the key parameter the generator goes on to
		// read once the check passed (on a cancelled context: no network).
		reads string
	}{
		{
			name:    "key not granted",
			vars:    map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: openai, kind: openai, api_key_param: /batchgen/other-key}\n"},
			wantErr: []string{"PROVIDERS_FILE:2", `provider "openai"`, "api_key_param /batchgen/other-key", "ProviderApiKeyParams", "granted now: /batchgen/openai-api-key"},
		},
		{
			name:  "key of ModelApiKeyParam",
			vars:  map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: openai, kind: openai, api_key_param: /batchgen/openai-api-key}\n"},
			reads: "/batchgen/openai-api-key",
		},
		{
			name: "keys of ProviderApiKeyParams",
			vars: map[string]string{
				"PROVIDERS_FILE":          "providers:\n  - {name: a, kind: openai, api_key_param: /batchgen/a}\n  - {name: b, kind: mock, base_url: \"http://127.0.0.1:9/v1\", api_key_param: /team/b}\n",
				"PROVIDER_API_KEY_PARAMS": "/batchgen/a,/team/b",
			},
			reads: "/batchgen/a",
		},
		{
			name:    "one of two keys not granted",
			vars:    map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: a, kind: openai, api_key_param: /batchgen/a}\n  - {name: b, kind: openai, api_key_param: /team/b}\n", "PROVIDER_API_KEY_PARAMS": "/batchgen/a"},
			wantErr: []string{`provider "b"`, "/team/b", "PROVIDERS_FILE:3"},
		},
		{
			name:    "bedrock model not granted",
			vars:    map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: nova, kind: bedrock, model: amazon.nova-lite-v1:0}\n"},
			wantErr: []string{`provider "nova"`, "foundation-model/amazon.nova-lite-v1:0 in us-east-1", "add amazon.nova-lite-v1:0 to the template parameter ProviderBedrockModels"},
		},
		{
			name: "bedrock model granted",
			vars: map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: nova, kind: bedrock, model: amazon.nova-lite-v1:0, region: eu-west-3}\n", "PROVIDER_BEDROCK_MODELS": "amazon.nova-lite-v1:0"},
		},
		{
			name:    "profile without its model",
			vars:    map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: pro, kind: bedrock, model: us.amazon.nova-pro-v1:0}\n", "PROVIDER_BEDROCK_MODELS": "us.amazon.nova-pro-v1:0"},
			wantErr: []string{"foundation-model/amazon.nova-pro-v1:0 in every region", "add us.amazon.nova-pro-v1:0,amazon.nova-pro-v1:0"},
		},
		{
			name: "profile and its model",
			vars: map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: pro, kind: bedrock, model: us.amazon.nova-pro-v1:0}\n", "PROVIDER_BEDROCK_MODELS": "amazon.nova-pro-v1:0,us.amazon.nova-pro-v1:0"},
		},
		{
			name: "ModelProvider=bedrock's model, in the function's region",
			vars: map[string]string{"MODEL_PROVIDER": "bedrock", "MODEL_NAME": "amazon.nova-lite-v1:0", "PROVIDERS_FILE": "providers:\n  - {name: nova, kind: bedrock, model: amazon.nova-lite-v1:0}\n  - {name: sim, kind: sim}\n"},
		},
		{
			// ModelName is granted in the stack's region only.
			name:    "ModelProvider=bedrock's model, in another region",
			vars:    map[string]string{"MODEL_PROVIDER": "bedrock", "MODEL_NAME": "amazon.nova-lite-v1:0", "PROVIDERS_FILE": "providers:\n  - {name: nova, kind: bedrock, model: amazon.nova-lite-v1:0, region: us-west-2}\n"},
			wantErr: []string{"foundation-model/amazon.nova-lite-v1:0 in us-west-2"},
		},
		{
			name: "ModelProvider=bedrock's inference profile",
			vars: map[string]string{"MODEL_PROVIDER": "bedrock", "MODEL_NAME": "amazon.nova-lite-v1:0", "BEDROCK_INFERENCE_PROFILE": "us.amazon.nova-lite-v1:0", "PROVIDERS_FILE": "providers:\n  - {name: nova, kind: bedrock, model: us.amazon.nova-lite-v1:0}\n"},
		},
		{
			name: "batch inference of the stack's model, bucket and role",
			vars: map[string]string{"MODEL_PROVIDER": "bedrock", "MODEL_NAME": "anthropic.claude-3-5-haiku-20241022-v1:0", "BEDROCK_BATCH_ROLE_ARN": "arn:aws:iam::123456789012:role/batch",
				"PROVIDERS_FILE": "providers:\n  - {name: claude, kind: bedrock, model: anthropic.claude-3-5-haiku-20241022-v1:0, batch_bucket: batchgen-123456789012-us-east-1, batch_role_arn: \"arn:aws:iam::123456789012:role/batch\"}\n"},
		},
		{
			name: "batch inference in another bucket",
			vars: map[string]string{"MODEL_PROVIDER": "bedrock", "MODEL_NAME": "anthropic.claude-3-5-haiku-20241022-v1:0", "BEDROCK_BATCH_ROLE_ARN": "arn:aws:iam::123456789012:role/batch",
				"PROVIDERS_FILE": "providers:\n  - {name: claude, kind: bedrock, model: anthropic.claude-3-5-haiku-20241022-v1:0, batch_bucket: elsewhere, batch_role_arn: \"arn:aws:iam::123456789012:role/batch\"}\n"},
			wantErr: []string{`provider "claude"`, "only the stack's bucket and service role", "batch_bucket batchgen-123456789012-us-east-1"},
		},
		{
			name: "batch inference of a model the stack does not run",
			vars: map[string]string{"PROVIDER_BEDROCK_MODELS": "anthropic.claude-3-5-haiku-20241022-v1:0",
				"PROVIDERS_FILE": "providers:\n  - {name: claude, kind: bedrock, model: anthropic.claude-3-5-haiku-20241022-v1:0, batch_bucket: b, batch_role_arn: r}\n"},
			wantErr: []string{`provider "claude"`, "batch inference jobs of the stack's own model only"},
		},
		{
			name: "a foundation model's ARN",
			vars: map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: nova, kind: bedrock, model: \"arn:aws:bedrock:us-west-2::foundation-model/amazon.nova-lite-v1:0\"}\n", "PROVIDER_BEDROCK_MODELS": "amazon.nova-lite-v1:0"},
		},
		{
			name:    "a provisioned model's ARN",
			vars:    map[string]string{"PROVIDERS_FILE": "providers:\n  - {name: mine, kind: bedrock, model: \"arn:aws:bedrock:us-east-1:123456789012:provisioned-model/abc\"}\n", "PROVIDER_BEDROCK_MODELS": "abc"},
			wantErr: []string{`provider "mine"`, "foundation models and inference profiles by id"},
		},
		{
			// README's deployment example, deployed as shown.
			name: "README example",
			vars: map[string]string{
				"PROVIDERS_FILE": readmeProviders, "PROVIDER_API_KEY_PARAMS": "/batchgen/openai-key,/batchgen/vllm-key",
				"PROVIDER_BEDROCK_MODELS": "us.amazon.nova-pro-v1:0,amazon.nova-pro-v1:0,amazon.nova-lite-v1:0",
			},
			reads: "/batchgen/openai-key",
		},
		{
			// ... and with the profile's model left out: README quotes
			// this message.
			name: "README example without the profile's model",
			vars: map[string]string{
				"PROVIDERS_FILE": readmeProviders, "PROVIDER_API_KEY_PARAMS": "/batchgen/openai-key,/batchgen/vllm-key",
				"PROVIDER_BEDROCK_MODELS": "us.amazon.nova-pro-v1:0,amazon.nova-lite-v1:0",
			},
			wantErr: []string{`the providers need more than the generator's role is granted: PROVIDERS_FILE:5: provider "nova-pro": the generator's role may not invoke Bedrock foundation-model/amazon.nova-pro-v1:0 in every region: add us.amazon.nova-pro-v1:0,amazon.nova-pro-v1:0 to the template parameter ProviderBedrockModels`},
		},
		{
			// Without a providers file the parameters build the one entry
			// the template grants.
			name: "single provider, bedrock profile",
			vars: map[string]string{"MODEL_PROVIDER": "bedrock", "MODEL_NAME": "amazon.nova-lite-v1:0", "BEDROCK_INFERENCE_PROFILE": "us.amazon.nova-lite-v1:0"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := map[string]string{}
			for k, v := range templateEnv {
				m[k] = v
			}
			for k, v := range tc.vars {
				m[k] = v
			}
			env, err := awswire.LoadEnv(getenv(m))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err = generatorfn.New(ctx, awswire.NewDeps(env, aws.Config{Region: region}, "generator"))
			if tc.reads != "" {
				if err == nil || !strings.Contains(err.Error(), "read the model API key from SSM parameter "+tc.reads) || strings.Contains(err.Error(), "granted") {
					t.Fatalf("generator: %v; want it past the check, reading %s", err, tc.reads)
				}
				return
			}
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("generator: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("generator started; want an error with %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q\nlacks %q", err, want)
				}
			}
		})
	}
}

// readmeProviders is README's providers-aws.yaml.
const readmeProviders = `routing: ordered
providers:
  - {name: openai, kind: openai, model: gpt-4o-mini, api_key_param: /batchgen/openai-key, rpm: 5000, tpm: 2000000}
  - {name: vllm, kind: openai, base_url: "https://llm.internal.example.com/v1", model: qwen2.5-7b-instruct, api_key_param: /batchgen/vllm-key, concurrency: 4}
  - {name: nova-pro, kind: bedrock, model: us.amazon.nova-pro-v1:0, rpm: 500}
  - {name: nova-lite, kind: bedrock, model: amazon.nova-lite-v1:0, region: us-west-2, rpm: 1000, weight: 0}
`

// TestReadmeProvidersExample: README's providers-aws.yaml is the file
// TestGeneratorChecksGrants deploys.
func TestReadmeProvidersExample(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "# providers-aws.yaml\n"+readmeProviders+"```") {
		t.Errorf("README.md's providers-aws.yaml is not readmeProviders:\n%s", readmeProviders)
	}
}
