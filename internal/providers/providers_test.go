package providers_test

import (
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/providers"
)

// Each kind builds its adapter or says what is missing, naming the fix.
func TestBuild(t *testing.T) {
	t.Parallel()
	bedrock := func(providerfile.Provider) (llm.Provider, error) { return nil, nil }
	tests := []struct {
		name    string
		b       providers.Builder
		p       providerfile.Provider
		wantErr string
	}{
		{"sim", providers.Builder{}, providerfile.Provider{Kind: providerfile.KindSim}, ""},
		{"openai with a base_url", providers.Builder{}, providerfile.Provider{Kind: providerfile.KindOpenAI, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}, ""},
		{"openai without key or base_url", providers.Builder{}, providerfile.Provider{Kind: providerfile.KindOpenAI, APIKeyEnv: "BATCHGEN_TEST_UNSET_KEY", Model: "m"}, "needs an API key in $BATCHGEN_TEST_UNSET_KEY"},
		{"openai with a key", providers.Builder{Key: func(providerfile.Provider) (string, error) { return "sk-test", nil }}, providerfile.Provider{Kind: providerfile.KindOpenAI, Model: "m"}, ""},
		{"bedrock not wired", providers.Builder{}, providerfile.Provider{Kind: providerfile.KindBedrock, Model: "m"}, "not available in this build"},
		{"bedrock wired", providers.Builder{Bedrock: bedrock}, providerfile.Provider{Kind: providerfile.KindBedrock, Model: "m"}, ""},
		{"unknown kind", providers.Builder{}, providerfile.Provider{Kind: "llama"}, `kind "llama"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.b.Build(tc.p)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Build: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Build: err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
