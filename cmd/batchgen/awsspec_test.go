package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/embedded"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// TestRunSpecMatchesAWS: `batchgen run --providers FILE` and a stack whose
// ProvidersFile is the same file (PROVIDERS_FILE, read by the splitter and
// the api through awswire's DefaultSpec) build the same task spec: the
// local run's task id is the one derived from the AWS spec for the same
// source, so a routed job's tasks and cache keys agree between runtimes.
func TestRunSpecMatchesAWS(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, file string }{
		{"routed", "routing: weighted\nproviders:\n  - {name: fast, kind: sim, latency: 1ms, weight: 3}\n  - {name: slow, kind: sim, latency: 2ms}\n"},
		{"one entry", "providers:\n  - {name: only, kind: sim, model: sim-2, latency: 1ms}\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			in := productsCSV(t, dir, 3, nil)
			providers := writeFile(t, filepath.Join(dir, "providers.yaml"), tc.file)
			const prompt = "为{{商品名称}}写一句文案"
			data := filepath.Join(dir, "data")
			res := runBinary(t, context.Background(), "run", "--in", in, "--prompt", prompt, "--providers", providers, "--data", data, "--quiet")
			if res.code != 0 {
				t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
			}
			list := runBinary(t, context.Background(), "tasks", "--data", data)
			if list.code != 0 {
				t.Fatalf("tasks: exit %d\n%s", list.code, list.stderr)
			}

			env, err := awswire.LoadEnv(func(k string) string {
				return map[string]string{"PROVIDERS_FILE": tc.file, "DEFAULT_PROMPT": prompt, "BATCH_SIZE": "100"}[k]
			})
			if err != nil {
				t.Fatal(err)
			}
			spec, err := env.DefaultSpec()
			if err != nil {
				t.Fatal(err)
			}
			identity, err := embedded.FileIdentity(in)
			if err != nil {
				t.Fatal(err)
			}
			want := pipeline.DeriveTaskID(identity+"|sheet=|max-rows=200000", spec)
			if !strings.Contains(list.stdout, want) {
				b, _ := os.ReadFile(providers)
				t.Errorf("the local run's task is not %s, the id of the AWS spec %+v for %s:\n%s", want, spec, b, list.stdout)
			}
		})
	}
}
