package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommandLine checks the command line itself: usage errors exit 2 with
// a hint, help exits 0 and lists every flag, flags go before or after the
// positional arguments, and completion scripts are generated.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 2, nil)
	data := filepath.Join(dir, "nodata")
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr []string
	}{
		{name: "no command", args: nil, code: 2, stderr: []string{"Available Commands:", "run"}},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, stderr: []string{`unknown command "frobnicate"`, "batchgen --help"}},
		{name: "unknown flag", args: []string{"run", "--in", in, "--bogus"}, code: 2, stderr: []string{"unknown flag: --bogus", "batchgen run --help"}},
		{name: "bad flag value", args: []string{"run", "--in", in, "--concurrency", "many"}, code: 2, stderr: []string{"--concurrency"}},
		{name: "bad temperature", args: []string{"run", "--in", in, "--temperature", "NaN"}, code: 2, stderr: []string{"--temperature"}},
		{name: "input twice", args: []string{"run", "--in", in, in}, code: 2, stderr: []string{"unexpected arguments"}},
		{name: "cancel without task", args: []string{"cancel", "--data", data}, code: 2, stderr: []string{"want one TASK"}},
		{name: "retry with two tasks", args: []string{"retry", "a", "b"}, code: 2, stderr: []string{"want one TASK"}},
		{name: "tasks with an argument", args: []string{"tasks", "extra"}, code: 2, stderr: []string{`unknown command "extra"`}},
		{name: "dlq without verb", args: []string{"dlq"}, code: 2, stderr: []string{"batchgen dlq list"}},
		{name: "dlq unknown verb", args: []string{"dlq", "purge"}, code: 2, stderr: []string{`unknown command "purge"`}},
		{name: "dlq half the AWS flags", args: []string{"dlq", "list", "--queue-url", "http://q"}, code: 2, stderr: []string{"--queue-url and --dlq-url go together"}},
		{name: "help", args: []string{"help"}, code: 0, stdout: []string{"run", "tasks", "cancel", "retry", "dlq", "mock-llm", "completion"}},
		{name: "run -h lists every flag", args: []string{"run", "-h"}, code: 0, stdout: []string{
			"--in", "--out", "--prompt", "--prompt-file", "--system", "--sheet", "--data", "--batch-size", "--max-rows",
			"--concurrency", "--rpm", "--no-cache", "--quiet", "--log-level", "--progress-interval", "--calls-per-round",
			"--rounds", "--retry-delays", "--call-timeout", "--lease", "--sweep-after", "--provider", "--base-url",
			"--model", "--temperature", "--max-tokens", "--sim-latency", "--sim-jitter",
		}},
		{name: "retry --help", args: []string{"retry", "--help"}, code: 0, stdout: []string{"--error-class", "--data", "--provider"}},
		{name: "dlq list --help", args: []string{"dlq", "list", "--help"}, code: 0, stdout: []string{"--data", "--queue-url", "--dlq-url"}},
		// The README's order: the task first, flags after; and flags first.
		{name: "cancel TASK --data DIR", args: []string{"cancel", "0123456789abcdef0123", "--data", data}, code: 2, stderr: []string{"no batchgen data in " + data}},
		{name: "cancel --data DIR TASK", args: []string{"cancel", "--data", data, "0123456789abcdef0123"}, code: 2, stderr: []string{"no batchgen data in " + data}},
		{name: "retry TASK --data DIR --error-class", args: []string{"retry", "0123456789abcdef0123", "--data", data, "--error-class", "content_filter"}, code: 2, stderr: []string{"no batchgen data in " + data}},
		{name: "dlq --data DIR list", args: []string{"dlq", "--data", data, "list"}, code: 2, stderr: []string{"no batchgen data in " + data}},
		{name: "completion bash", args: []string{"completion", "bash"}, code: 0, stdout: []string{"bash completion", "__start_batchgen"}},
		{name: "completion zsh", args: []string{"completion", "zsh"}, code: 0, stdout: []string{"#compdef batchgen"}},
		{name: "completion fish", args: []string{"completion", "fish"}, code: 0, stdout: []string{"complete -c batchgen"}},
		{name: "completion of run's flags", args: []string{"__complete", "run", "--pro"}, code: 0, stdout: []string{"--prompt", "--prompt-file", "--provider"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runBinary(t, context.Background(), tt.args...)
			if r.code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tt.code, r.stdout, r.stderr)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
				}
			}
			for _, want := range tt.stderr {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
				}
			}
			if strings.Contains(r.stderr, "panic") || strings.Contains(r.stderr, "goroutine ") {
				t.Errorf("stderr shows a panic:\n%s", r.stderr)
			}
		})
	}
}
