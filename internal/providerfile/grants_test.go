package providerfile_test

import (
	"testing"

	"github.com/batchgen/batchgen/internal/providerfile"
)

// TestBedrockBaseModel: a cross-region inference profile id names its
// foundation model after the geography prefix; other ids are models.
func TestBedrockBaseModel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id, model string
		profile   bool
	}{
		{"us.amazon.nova-lite-v1:0", "amazon.nova-lite-v1:0", true},
		{"apac.anthropic.claude-3-haiku-20240307-v1:0", "anthropic.claude-3-haiku-20240307-v1:0", true},
		{"global.anthropic.claude-sonnet-4-20250514-v1:0", "anthropic.claude-sonnet-4-20250514-v1:0", true},
		{"amazon.nova-lite-v1:0", "amazon.nova-lite-v1:0", false},
		{"usage.model", "usage.model", false},
	}
	for _, tc := range tests {
		model, profile := providerfile.BedrockBaseModel(tc.id)
		if model != tc.model || profile != tc.profile {
			t.Errorf("BedrockBaseModel(%q) = %q, %v; want %q, %v", tc.id, model, profile, tc.model, tc.profile)
		}
	}
}
