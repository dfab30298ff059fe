package providerfile_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/providerfile"
)

func TestParseKind(t *testing.T) {
	t.Parallel()
	for _, k := range providerfile.Kinds {
		if got, err := providerfile.ParseKind(string(k)); err != nil || got != k {
			t.Errorf("ParseKind(%q) = %q, %v", k, got, err)
		}
	}
	for _, bad := range []string{"", "OpenAI", "vertex", "sim "} {
		_, err := providerfile.ParseKind(bad)
		if err == nil || !strings.HasSuffix(err.Error(), ": use openai, anthropic, bedrock, sim or mock") {
			t.Errorf("ParseKind(%q) = %v, want the kinds listed", bad, err)
		}
	}
}

// TestSingle: the one entry of an entry point's own settings, named and
// defaulted as a file's entry would be, with what its kind does not take
// left out.
func TestSingle(t *testing.T) {
	t.Parallel()
	one := 1
	tests := []struct {
		name   string
		single providerfile.Single
		want   providerfile.Provider
	}{
		{"sim: default model, latency kept, base URL dropped",
			providerfile.Single{Kind: providerfile.KindSim, BaseURL: "http://from-OPENAI_BASE_URL/v1", RPM: 60, Latency: time.Second, Jitter: time.Millisecond},
			providerfile.Provider{Name: "sim/sim-1", Kind: providerfile.KindSim, Model: "sim-1", RPM: 60, Concurrency: providerfile.DefaultConcurrency,
				Timeout: providerfile.DefaultTimeout, Weight: &one, Latency: time.Second, Jitter: time.Millisecond}},
		{"openai: default model and key variable, key parameter kept, latency dropped",
			providerfile.Single{Kind: providerfile.KindOpenAI, APIKeyParam: "/k", Concurrency: 3, Latency: time.Second},
			providerfile.Provider{Name: "openai/gpt-4o-mini", Kind: providerfile.KindOpenAI, Model: "gpt-4o-mini", APIKeyParam: "/k",
				Concurrency: 3, Timeout: providerfile.DefaultTimeout, Weight: &one}},
		{"anthropic: default model, key parameter kept",
			providerfile.Single{Kind: providerfile.KindAnthropic, BaseURL: "http://127.0.0.1:8089", APIKeyParam: "/a"},
			providerfile.Provider{Name: "anthropic/claude-haiku-4-5", Kind: providerfile.KindAnthropic, Model: "claude-haiku-4-5", BaseURL: "http://127.0.0.1:8089",
				APIKeyParam: "/a", Concurrency: providerfile.DefaultConcurrency, Timeout: providerfile.DefaultTimeout, Weight: &one}},
		{"bedrock: its model, region kept, key parameter dropped",
			providerfile.Single{Kind: providerfile.KindBedrock, Model: "amazon.nova-lite-v1:0", Region: "us-west-2", APIKeyParam: "/k", Timeout: time.Minute},
			providerfile.Provider{Name: "bedrock/amazon.nova-lite-v1:0", Kind: providerfile.KindBedrock, Model: "amazon.nova-lite-v1:0", Region: "us-west-2",
				Concurrency: providerfile.DefaultConcurrency, Timeout: time.Minute, Weight: &one}},
	}
	for _, tc := range tests {
		f, err := tc.single.File()
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if diff := cmp.Diff([]providerfile.Provider{tc.want}, f.Providers, cmpopts.IgnoreUnexported(providerfile.Provider{}), cmpopts.IgnoreFields(providerfile.Provider{}, "APIKeyEnv")); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	// Each kind's key variable, when neither a variable nor a parameter is
	// named.
	for kind, env := range map[providerfile.Kind]string{providerfile.KindOpenAI: "OPENAI_API_KEY", providerfile.KindAnthropic: "ANTHROPIC_API_KEY", providerfile.KindSim: ""} {
		f, err := providerfile.Single{Kind: kind}.File()
		if err != nil {
			t.Errorf("%s: %v", kind, err)
		} else if got := f.Providers[0].APIKeyEnv; got != env {
			t.Errorf("%s: key variable %q, want %q", kind, got, env)
		}
	}
	if _, err := (providerfile.Single{Kind: providerfile.KindBedrock}).File(); err == nil || !strings.Contains(err.Error(), "kind bedrock needs model") {
		t.Errorf("bedrock without a model: %v, want the model asked for", err)
	}
	if _, err := (providerfile.Single{Kind: providerfile.KindSim, RPM: -1}).File(); err == nil || !strings.Contains(err.Error(), "rpm -1") {
		t.Errorf("negative rpm: %v, want it refused", err)
	}
}

// TestFileTotals: the concurrency and quota a file's providers have
// together, as the generator and the progress line read them.
func TestFileTotals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml                         string
		concurrency, rpm, packTokens int
	}{
		{"providers:\n  - {name: a, kind: sim, rpm: 600, concurrency: 2, tpm: 40000}\n  - {name: b, kind: sim, rpm: 60, tpm: 8000}\n", 2 + providerfile.DefaultConcurrency, 660, 2000},
		{"providers:\n  - {name: a, kind: sim, rpm: 600}\n  - {name: b, kind: sim, tpm: 100000}\n", 2 * providerfile.DefaultConcurrency, 0, 25000},
		{"providers:\n  - {name: a, kind: sim}\n", providerfile.DefaultConcurrency, 0, 0},
	} {
		f, err := providerfile.Parse("t.yaml", []byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if f.Concurrency() != tc.concurrency || f.RPM() != tc.rpm || f.PackTokens() != tc.packTokens {
			t.Errorf("%q: concurrency %d, rpm %d, pack tokens %d; want %d, %d, %d", tc.yaml, f.Concurrency(), f.RPM(), f.PackTokens(), tc.concurrency, tc.rpm, tc.packTokens)
		}
	}
}
