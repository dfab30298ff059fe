package main

import (
	"bytes"
	"errors"
	"flag"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/store"
)

func noenv(string) string { return "" }

// TestUsage: bad command lines, and a missing emulator, exit 2 with a
// message that says what to do.
func TestUsage(t *testing.T) {
	t.Setenv(samstack.EndpointEnv, "")
	tests := []struct {
		name       string
		args       []string
		wantStderr string
	}{
		{name: "no emulator", args: []string{"--prefix", "x"}, wantStderr: `AWS_ENDPOINT_URL is not set. Start the emulator and export its endpoint first:
  eval "$(infra/emulator/start.sh)"; export AWS_ENDPOINT_URL`},
		{name: "no emulator for upload", args: []string{"upload", "main.go"}, wantStderr: "AWS_ENDPOINT_URL is not set"},
		{name: "no emulator for download", args: []string{"download", "0123456789abcdef0123"}, wantStderr: "AWS_ENDPOINT_URL is not set"},
		{name: "stray argument", args: []string{"skus.xlsx"}, wantStderr: `unexpected arguments ["skus.xlsx"]`},
		{name: "missing --once file", args: []string{"--once", "no-such.xlsx"}, wantStderr: "--once: open no-such.xlsx"},
		{name: "bad log level", args: []string{"--log-level", "loud"}, wantStderr: `--log-level "loud"`},
		{name: "upload without a file", args: []string{"upload"}, wantStderr: "usage: batchgen-localaws upload"},
		{name: "download of a bad task id", args: []string{"download", "../x"}, wantStderr: "usage: batchgen-localaws download"},
		{name: "unknown flag", args: []string{"--nope"}, wantStderr: "flag provided but not defined: -nope"},
		{name: "openai without an endpoint", args: []string{"--provider", "openai"}, wantStderr: "--provider openai needs --base-url"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runMain(t.Context(), tc.args, &stdout, &stderr, noenv)
			if code != report.Rejected {
				t.Errorf("exit code = %d, want %d; stderr:\n%s", code, report.Rejected, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr.String(), tc.wantStderr)
			}
		})
	}
}

// TestFunctionEnv: the functions' settings come from the resources, then
// the flags' defaults, then the Lambda variables in the environment, then
// the flags given.
func TestFunctionEnv(t *testing.T) {
	t.Parallel()
	res := &samstack.Resources{TableName: "tbl", QueueURL: "q", DLQURL: "dlq", BucketName: "bkt", StateMachineArn: "sm"}
	type got struct {
		Provider, Model, BaseURL, Prompt string
		SimLatency                       time.Duration
		BatchSize, QuotaRPM              int
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    got
		wantErr string
	}{
		{name: "defaults", want: got{Provider: "sim", Model: "mock-1", SimLatency: 50 * time.Millisecond, BatchSize: 25}},
		{
			name: "environment over defaults",
			env:  map[string]string{"MODEL_PROVIDER": "openai", "MODEL_BASE_URL": "http://h/v1", "MODEL_NAME": "m", "BATCH_SIZE": "10", "QUOTA_RPM": "600"},
			want: got{Provider: "openai", Model: "m", BaseURL: "http://h/v1", SimLatency: 50 * time.Millisecond, BatchSize: 10, QuotaRPM: 600},
		},
		{
			name: "flags over environment",
			args: []string{"--sim-latency", "1ms", "--batch-size", "7", "--provider", "sim", "--prompt", "写{{a}}"},
			env:  map[string]string{"MODEL_PROVIDER": "openai", "MODEL_BASE_URL": "http://h/v1", "BATCH_SIZE": "10", "SIM_LATENCY": "1s"},
			want: got{Provider: "sim", Model: "mock-1", BaseURL: "http://h/v1", Prompt: "写{{a}}", SimLatency: time.Millisecond, BatchSize: 7},
		},
		{
			name: "--base-url implies openai",
			args: []string{"--base-url", "http://127.0.0.1:8089/v1"},
			want: got{Provider: "openai", Model: "mock-1", BaseURL: "http://127.0.0.1:8089/v1", SimLatency: 50 * time.Millisecond, BatchSize: 25},
		},
		{name: "openai without an endpoint", args: []string{"--provider", "openai"}, wantErr: "--provider openai needs --base-url"},
		{name: "bad provider", args: []string{"--provider", "gpt"}, wantErr: `MODEL_PROVIDER="gpt"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			var m modelFlags
			m.register(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			env, err := functionEnv(res, fs, &m, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			g := got{env.ModelProvider, env.ModelName, env.ModelBaseURL, env.DefaultPrompt, env.SimLatency, env.BatchSize, env.QuotaRPM}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("env mismatch (-want +got):\n%s", diff)
			}
			if env.TableName != "tbl" || env.QueueURL != "q" || env.DLQURL != "dlq" || env.BucketName != "bkt" || env.StateMachineARN != "sm" {
				t.Errorf("resources not passed on: %+v", env)
			}
		})
	}
}

// TestState: a recorded stack is found again for its endpoint only.
func TestState(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sub", "localaws-p.json")
	if _, err := loadState(path, "http://a"); !errors.Is(err, errNoState) {
		t.Fatalf("no file: error = %v, want errNoState", err)
	}
	res := &samstack.Resources{TableName: "p-table", QueueURL: "q", BucketName: "p-bucket", FunctionARNs: map[string]string{"ExporterFunction": "arn:x"}}
	if err := saveState(path, stackState{Endpoint: "http://a", Resources: res}); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(path, "http://a")
	if err != nil {
		t.Fatal(err)
	}
	if got.TableName != res.TableName || got.QueueURL != res.QueueURL || got.BucketName != res.BucketName || got.FunctionARNs["ExporterFunction"] != "arn:x" {
		t.Errorf("loaded %+v, want %+v", got, res)
	}
	if _, err := loadState(path, "http://b"); !errors.Is(err, errNoState) {
		t.Errorf("another endpoint: error = %v, want errNoState", err)
	}
}

// TestExitFor: --once exits as batchgen run does.
func TestExitFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		task store.Task
		want int
	}{
		{name: "succeeded", task: store.Task{State: store.TaskSucceeded, BatchesTotal: 2}, want: report.OK},
		{name: "partial", task: store.Task{State: store.TaskPartial, BatchesTotal: 2, RowsFailed: 1}, want: report.RowsFailed},
		{name: "cancelled", task: store.Task{State: store.TaskCancelled, BatchesTotal: 2}, want: report.RowsFailed},
		{name: "rejected by the splitter", task: store.Task{State: store.TaskFailed, Error: "no rows"}, want: report.Rejected},
		{name: "export failed", task: store.Task{State: store.TaskFailed, BatchesTotal: 2, Error: "export failed"}, want: report.Failure},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code := report.OK
			var ee *report.ExitError
			if err := exitFor(tc.task); errors.As(err, &ee) {
				code = ee.Code
			} else if err != nil {
				t.Fatalf("error %v is not an exitError", err)
			}
			if code != tc.want {
				t.Errorf("exit code = %d, want %d", code, tc.want)
			}
		})
	}
}
