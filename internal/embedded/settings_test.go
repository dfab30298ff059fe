package embedded

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/batchgen/batchgen/internal/store"
)

// settingsFrom parses args as the flags of a command that calls the model.
func settingsFrom(t *testing.T, args ...string) *Settings {
	t.Helper()
	var s Settings
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	s.RegisterSpec(fs)
	s.RegisterEngine(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return &s
}

// TestSettingsNameTheFlag: every refused setting is refused by the name
// the user gave it, and what is accepted reads into the spec.
func TestSettingsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	providers := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(providers, []byte("providers:\n  - name: a\n    kind: sim\n    model: sim-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	tests := []struct {
		args []string
		want string // "" accepted
	}{
		{nil, ""},
		{[]string{"--concurrency", "0"}, "--concurrency 0: must be at least 1"},
		{[]string{"--rpm", "-1"}, "--rpm -1: must be 0"},
		{[]string{"--tpm", "-1"}, "--tpm -1: must be 0"},
		{[]string{"--max-cost", "-2"}, "--max-cost"},
		{[]string{"--sweep-after", "10ms"}, "--sweep-after 10ms: must be at least 1s"},
		{[]string{"--batch-poll", "0s"}, "--batch-poll 0s: must be at least 1s"},
		{[]string{"--mode", "auto"}, "deadline"},
		{[]string{"--mode", "cheap"}, "--mode"},
		{[]string{"--rounds", "0"}, "--calls-per-round and --rounds must be at least 1"},
		{[]string{"--lease", "0s"}, "--lease 0s and --call-timeout 1m0s: both must be positive"},
		{[]string{"--retry-delays", "soon"}, "--retry-delays"},
		{[]string{"--cache", "sometimes"}, "--cache"},
		{[]string{"--no-cache", "--cache", "always"}, "--no-cache contradicts --cache always"},
		{[]string{"--cache-ttl", "forever"}, "--cache-ttl"},
		{[]string{"--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"--temperature", "3"}, "--temperature 3: must be between 0 and 2"},
		{[]string{"--max-tokens", "-5"}, "--max-tokens -5"},
		{[]string{"--provider", "gemini"}, "--provider"},
		{[]string{"--provider", "openai"}, "--provider openai needs OPENAI_API_KEY"},
		{[]string{"--provider", "openai", "--base-url", "http://127.0.0.1:9/v1"}, ""},
		{[]string{"--providers", providers, "--rpm", "10"}, "--rpm and --providers are both set"},
		{[]string{"--providers", providers}, ""},
		{[]string{"--prices", filepath.Join(dir, "none.yaml")}, "--prices"},
	}
	for _, tt := range tests {
		_, err := settingsFrom(t, tt.args...).Check()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%v: %v, want accepted", tt.args, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%v: %v, want an error naming %q", tt.args, err, tt.want)
		}
	}

	specs := []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", "a", "--prompt-file", empty}, "--prompt and --prompt-file are both set"},
		{[]string{"--prompt-file", empty}, "--prompt-file " + empty + " is empty"},
		{[]string{"--prompt-file", filepath.Join(dir, "gone.txt")}, "--prompt-file"},
		{[]string{"--columns", "a:number", "--schema", empty}, "--columns and --schema are both set"},
		{[]string{"--columns", "a:colour"}, "--columns"},
		{[]string{"--batch-size", "1001"}, "--batch-size 1001: must be between 1 and 1000"},
		{[]string{"--rows-per-call", "101"}, "--rows-per-call 101: must be between 1 and 100"},
		{[]string{"--max-rows", "0"}, "--max-rows 0: must be at least 1"},
	}
	for _, tt := range specs {
		if err := settingsFrom(t, tt.args...).CheckSpec(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want an error naming %q", tt.args, err, tt.want)
		}
	}
}

// TestSettingsTaskSpec: the spec reads the checked settings, one row a
// call stays the spec's zero (a task asked as before keeps its id), and no
// --temperature leaves the provider's own.
func TestSettingsTaskSpec(t *testing.T) {
	s := settingsFrom(t, "--prompt", "Copy for {{name}}", "--columns", "score:number, summary", "--batch-size", "7", "--mode", "economy", "--max-cost", "2.5")
	if err := s.CheckSpec(); err != nil {
		t.Fatal(err)
	}
	c, err := s.Check()
	if err != nil {
		t.Fatal(err)
	}
	spec := s.TaskSpec(c.Providers)
	if spec.Prompt != "Copy for {{name}}" || spec.BatchSize != 7 || spec.RowsPerCall != 0 || spec.Temperature != nil || len(spec.Columns) != 2 || spec.Provider == "" {
		t.Errorf("spec = %+v", spec)
	}
	if terms := s.Terms(store.Terms{}); terms.MaxCost != 2.5 || terms.Mode.String() != "economy" {
		t.Errorf("terms = %+v, want the cap and economy", terms)
	}
}
