package samstack

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestTemplateBedrockGrant: the generator may invoke Bedrock only when the
// provider is bedrock, and then only the configured model (in this region)
// or the configured inference profile and its model.
func TestTemplateBedrockGrant(t *testing.T) {
	t.Parallel()
	tpl, err := loadTemplate(repoTemplate)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		params map[string]string
		want   []any // the InvokeConfiguredModel statement's resources; nil: no such statement
	}{
		{name: "sim", params: nil, want: nil},
		{name: "openai", params: map[string]string{"ModelProvider": "openai"}, want: nil},
		{
			name:   "bedrock model",
			params: map[string]string{"ModelProvider": "bedrock", "ModelName": "amazon.nova-lite-v1:0"},
			want:   []any{"arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-lite-v1:0"},
		},
		{
			name:   "bedrock inference profile",
			params: map[string]string{"ModelProvider": "bedrock", "ModelName": "amazon.nova-lite-v1:0", "BedrockInferenceProfileId": "us.amazon.nova-lite-v1:0"},
			want: []any{
				fmt.Sprintf("arn:aws:bedrock:us-east-1:%s:inference-profile/us.amazon.nova-lite-v1:0", AccountID),
				"arn:aws:bedrock:*::foundation-model/amazon.nova-lite-v1:0",
			},
		},
		{
			name:   "a profile without bedrock grants nothing",
			params: map[string]string{"ModelProvider": "openai", "BedrockInferenceProfileId": "us.amazon.nova-lite-v1:0"},
			want:   nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev, err := newEvaluator(tpl, tc.params, testPseudo, symbolic{})
			if err != nil {
				t.Fatal(err)
			}
			props := functionProps(t, tpl, ev, "GeneratorFunction")
			var got []any
			found := false
			var walk func(v any)
			walk = func(v any) {
				switch x := v.(type) {
				case []any:
					for _, e := range x {
						walk(e)
					}
				case map[string]any:
					if x["Sid"] == "InvokeConfiguredModel" {
						found = true
						if x["Action"] != "bedrock:InvokeModel" {
							t.Errorf("action = %v, want bedrock:InvokeModel alone", x["Action"])
						}
						switch r := x["Resource"].(type) {
						case string:
							got = []any{r}
						case []any:
							got = r
						default:
							t.Errorf("resource %T %v", r, r)
						}
						return
					}
					for _, e := range x {
						walk(e)
					}
				}
			}
			walk(props["Policies"])
			if !found && tc.want != nil {
				t.Fatalf("no InvokeConfiguredModel statement; policies: %v", props["Policies"])
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("bedrock resources (-want +got):\n%s", diff)
			}
			if env := props["Environment"].(map[string]any)["Variables"].(map[string]any); env["BEDROCK_INFERENCE_PROFILE"] != tc.params["BedrockInferenceProfileId"] {
				t.Errorf("BEDROCK_INFERENCE_PROFILE = %v, want the parameter", env["BEDROCK_INFERENCE_PROFILE"])
			}
		})
	}
}
