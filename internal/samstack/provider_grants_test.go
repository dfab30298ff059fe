package samstack

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/awswire"
)

// TestTemplateProviderGrants: ProviderApiKeyParams and ProviderBedrockModels
// grant the generator's role exactly the listed SSM parameters and Bedrock
// models or profiles (the names exact, only the partition, region and
// account segments wildcards), nothing when left empty, and reach the
// generator as PROVIDER_API_KEY_PARAMS and PROVIDER_BEDROCK_MODELS. And
// what the generator believes it is granted (awswire.Env.Grants, which its
// cold-start check trusts) is granted by the template's statements, so the
// check never passes a file whose calls the role would refuse.
func TestTemplateProviderGrants(t *testing.T) {
	t.Parallel()
	tpl, err := loadTemplate(repoTemplate)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		params     map[string]string
		keys, mods []any // ReadProviderApiKeys' and InvokeProviderModels' resources; nil: no statement
	}{
		{name: "defaults grant nothing more"},
		{
			name:   "keys",
			params: map[string]string{"ProviderApiKeyParams": "/batchgen/openai-key,/team/local-key"},
			keys:   []any{"arn:*:ssm:*:*:parameter/batchgen/openai-key", "arn:*:ssm:*:*:parameter/team/local-key"},
		},
		{
			name:   "models and profiles",
			params: map[string]string{"ProviderBedrockModels": "amazon.nova-lite-v1:0,us.amazon.nova-pro-v1:0,amazon.nova-pro-v1:0"},
			mods: []any{
				"arn:*:bedrock:*::foundation-model/amazon.nova-lite-v1:0",
				"arn:*:bedrock:*::foundation-model/us.amazon.nova-pro-v1:0",
				"arn:*:bedrock:*::foundation-model/amazon.nova-pro-v1:0",
				"arn:*:bedrock:*:*:inference-profile/amazon.nova-lite-v1:0",
				"arn:*:bedrock:*:*:inference-profile/us.amazon.nova-pro-v1:0",
				"arn:*:bedrock:*:*:inference-profile/amazon.nova-pro-v1:0",
			},
		},
		{
			name: "with the single-provider grants",
			params: map[string]string{
				"ModelProvider": "bedrock", "ModelName": "amazon.nova-lite-v1:0", "BedrockInferenceProfileId": "us.amazon.nova-lite-v1:0",
				"ModelApiKeyParam": "/batchgen/openai-key", "ProviderApiKeyParams": "/team/b", "ProviderBedrockModels": "anthropic.claude-3-haiku-20240307-v1:0",
			},
			keys: []any{"arn:*:ssm:*:*:parameter/team/b"},
			mods: []any{
				"arn:*:bedrock:*::foundation-model/anthropic.claude-3-haiku-20240307-v1:0",
				"arn:*:bedrock:*:*:inference-profile/anthropic.claude-3-haiku-20240307-v1:0",
			},
		},
		{
			name:   "bedrock model in the stack's region only",
			params: map[string]string{"ModelProvider": "bedrock", "ModelName": "amazon.nova-lite-v1:0"},
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
			stmts := statements(props["Policies"])
			if diff := cmp.Diff(tc.keys, resources(t, stmts["ReadProviderApiKeys"])); diff != "" {
				t.Errorf("ReadProviderApiKeys resources (-want +got):\n%s", diff)
			}
			// The ARNs' wildcards (CloudFormation cannot prefix a list with the
			// stack's account and region) are held to the stack's own.
			if tc.keys != nil {
				want := map[string]any{"StringEquals": map[string]any{"aws:ResourceAccount": AccountID, "aws:RequestedRegion": "us-east-1"}}
				if diff := cmp.Diff(want, stmts["ReadProviderApiKeys"]["Condition"]); diff != "" {
					t.Errorf("ReadProviderApiKeys condition (-want +got):\n%s", diff)
				}
			}
			if diff := cmp.Diff(tc.mods, resources(t, stmts["InvokeProviderModels"])); diff != "" {
				t.Errorf("InvokeProviderModels resources (-want +got):\n%s", diff)
			}
			vars := props["Environment"].(map[string]any)["Variables"].(map[string]any)
			if got, want := vars["PROVIDER_API_KEY_PARAMS"], tc.params["ProviderApiKeyParams"]; got != want {
				t.Errorf("PROVIDER_API_KEY_PARAMS = %q, want %q", got, want)
			}
			if got, want := vars["PROVIDER_BEDROCK_MODELS"], tc.params["ProviderBedrockModels"]; got != want {
				t.Errorf("PROVIDER_BEDROCK_MODELS = %q, want %q", got, want)
			}

			// What the generator's check counts as granted, the role allows.
			env, err := awswire.LoadEnv(func(k string) string {
				if v, ok := vars[k]; ok {
					return fmt.Sprint(v)
				}
				return ""
			})
			if err != nil {
				t.Fatal(err)
			}
			granted := func(action string) []string {
				var out []string
				for _, s := range stmts {
					if s["Action"] == action {
						for _, r := range resources(t, s) {
							out = append(out, r.(string))
						}
					}
				}
				return out
			}
			const region, elsewhere = "us-east-1", "eu-west-3"
			g := env.Grants(region)
			for _, name := range g.APIKeyParams {
				arn := fmt.Sprintf("arn:aws:ssm:%s:%s:parameter%s", region, AccountID, name)
				if !slices.ContainsFunc(granted("ssm:GetParameter"), func(p string) bool { return arnMatch(p, arn) }) {
					t.Errorf("the generator counts key %s as readable, but the role may not read %s", name, arn)
				}
			}
			for _, b := range g.Bedrock {
				r := b.Region
				if r == "" {
					r = elsewhere // granted in every region: try one that is not the stack's
				}
				arn := fmt.Sprintf("arn:aws:bedrock:%s::%s", r, b.Resource)
				if strings.HasPrefix(b.Resource, "inference-profile/") {
					arn = fmt.Sprintf("arn:aws:bedrock:%s:%s:%s", r, AccountID, b.Resource)
				}
				if !slices.ContainsFunc(granted("bedrock:InvokeModel"), func(p string) bool { return arnMatch(p, arn) }) {
					t.Errorf("the generator counts %+v as invocable, but the role may not invoke %s", b, arn)
				}
			}
			if len(tc.keys) > 0 && len(g.APIKeyParams) == 0 || len(tc.mods) > 0 && len(g.Bedrock) == 0 {
				t.Errorf("grants %+v: the generator does not see the template's grants", g)
			}
		})
	}
}

// statements returns the generator's policy statements by Sid.
func statements(policies any) map[string]map[string]any {
	out := map[string]map[string]any{}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			if sid, ok := x["Sid"].(string); ok {
				out[sid] = x
				return
			}
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(policies)
	return out
}

// resources returns a statement's Resource as a list (nil: no statement).
func resources(t *testing.T, s map[string]any) []any {
	t.Helper()
	switch r := s["Resource"].(type) {
	case nil:
		return nil
	case string:
		return []any{r}
	case []any:
		return r
	default:
		t.Fatalf("resource %T %v", r, r)
		return nil
	}
}

// arnMatch reports whether IAM's resource pattern (wildcards * and ?)
// matches arn.
func arnMatch(pattern, arn string) bool {
	var re strings.Builder
	re.WriteString("^")
	for _, c := range pattern {
		switch c {
		case '*':
			re.WriteString(".*")
		case '?':
			re.WriteString(".")
		default:
			re.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	re.WriteString("$")
	return regexp.MustCompile(re.String()).MatchString(arn)
}
