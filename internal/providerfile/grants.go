package providerfile

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Grants is what the generator's role on AWS may use of the providers:
// the SSM parameters it may read and the Bedrock resources it may invoke.
// The wiring derives it from the same parameters the template grants from
// (ModelApiKeyParam, ProviderApiKeyParams, ModelProvider=bedrock with
// ModelName or BedrockInferenceProfileId, ProviderBedrockModels), so a
// providers file needing more is refused at cold start with the parameter
// to set, instead of failing every row with AccessDenied.
type Grants struct {
	// APIKeyParams are the SSM parameter names the role may read.
	APIKeyParams []string
	// Bedrock are the Bedrock resources the role may invoke.
	Bedrock []BedrockGrant
	// Region is the function's own region: a bedrock entry without a
	// region calls it.
	Region string
	// Batch is what the role may use of Bedrock's batch inference: the
	// bucket of the jobs' files, the service role it may pass, and the
	// models whose jobs it may create (the stack's configured model);
	// zero when the stack grants none (ModelProvider is not bedrock).
	Batch BatchGrant
}

// BatchGrant is what the generator's role may use of Bedrock's batch
// inference.
type BatchGrant struct {
	Bucket, RoleARN string
	Models          []BedrockGrant
}

// BedrockGrant is one Bedrock resource the role may invoke.
type BedrockGrant struct {
	// Resource is "foundation-model/ID" or "inference-profile/ID".
	Resource string
	// Region is where it may be invoked; "" is every region.
	Region string
}

// covers reports whether g allows invoking need.
func (g BedrockGrant) covers(need BedrockGrant) bool {
	return g.Resource == need.Resource && (g.Region == "" || g.Region == need.Region)
}

// inferenceProfilePrefixes are the geography prefixes of Bedrock's
// cross-region (system-defined) inference profile ids.
var inferenceProfilePrefixes = []string{"us.", "eu.", "apac.", "global.", "us-gov.", "jp.", "au.", "ca."}

// BedrockBaseModel returns the foundation model id of a Bedrock model id
// and whether id is a cross-region inference profile id
// ("us.amazon.nova-lite-v1:0" is a profile of "amazon.nova-lite-v1:0"),
// which routes calls to that model in several regions.
func BedrockBaseModel(id string) (model string, profile bool) {
	for _, prefix := range inferenceProfilePrefixes {
		if rest, ok := strings.CutPrefix(id, prefix); ok {
			return rest, true
		}
	}
	return id, false
}

// bedrockNeeds returns what invoking p's model needs granted: the
// foundation model in the entry's region, or an inference profile there
// and its foundation model in every region the profile routes to.
func bedrockNeeds(p Provider, region string) ([]BedrockGrant, error) {
	region = cmp.Or(p.Region, region)
	id := p.Model
	if strings.HasPrefix(id, "arn:") {
		// arn:PARTITION:bedrock:REGION:ACCOUNT:TYPE/ID
		parts := strings.SplitN(id, ":", 6)
		typ, rest, _ := strings.Cut(parts[len(parts)-1], "/")
		if len(parts) != 6 || parts[2] != "bedrock" || (typ != "foundation-model" && typ != "inference-profile") || rest == "" {
			return nil, fmt.Errorf("model %s: the generator's role can be granted Bedrock foundation models and inference profiles by id (ProviderBedrockModels); name one of those", id)
		}
		id, region = rest, cmp.Or(parts[3], region)
	}
	if base, profile := BedrockBaseModel(id); profile {
		return []BedrockGrant{{Resource: "inference-profile/" + id, Region: region}, {Resource: "foundation-model/" + base}}, nil
	}
	return []BedrockGrant{{Resource: "foundation-model/" + id, Region: region}}, nil
}

// CheckGrants returns an error naming, for each provider of f, the key
// parameter or Bedrock model g does not cover and the template parameter
// that grants it; nil when the role may do everything f asks.
func (f *File) CheckGrants(g Grants) error {
	var errs []error
	for _, p := range f.Providers {
		bad := func(format string, a ...any) {
			errs = append(errs, &Error{File: f.name, Line: p.line, Msg: fmt.Sprintf("provider %q: ", p.Name) + fmt.Sprintf(format, a...)})
		}
		if p.APIKeyParam != "" && !slices.Contains(g.APIKeyParams, p.APIKeyParam) {
			bad("the generator's role may not read api_key_param %s: add it to the template parameter ProviderApiKeyParams (granted now: %s)", p.APIKeyParam, listOrNone(g.APIKeyParams))
		}
		if p.Kind != KindBedrock {
			continue
		}
		needs, err := bedrockNeeds(p, g.Region)
		if err != nil {
			bad("%v", err)
			continue
		}
		if p.BatchBucket != "" {
			covered := g.Batch.RoleARN != "" && !slices.ContainsFunc(needs, func(need BedrockGrant) bool {
				return !slices.ContainsFunc(g.Batch.Models, func(have BedrockGrant) bool { return have.covers(need) })
			})
			switch {
			case !covered:
				bad("the generator's role may run batch inference jobs of the stack's own model only (ModelProvider=bedrock, ModelName): leave batch_bucket out, or make this model the stack's")
			case p.BatchBucket != g.Batch.Bucket || p.BatchRoleARN != g.Batch.RoleARN:
				bad("batch inference jobs may use only the stack's bucket and service role: batch_bucket %s, batch_role_arn %s", g.Batch.Bucket, g.Batch.RoleARN)
			}
		}
		var missing []string
		for _, need := range needs {
			if !slices.ContainsFunc(g.Bedrock, func(have BedrockGrant) bool { return have.covers(need) }) {
				where := "every region"
				if need.Region != "" {
					where = need.Region
				}
				missing = append(missing, fmt.Sprintf("%s in %s", need.Resource, where))
			}
		}
		if len(missing) > 0 {
			var ids []string
			for _, need := range needs {
				_, id, _ := strings.Cut(need.Resource, "/")
				ids = append(ids, id)
			}
			bad("the generator's role may not invoke Bedrock %s: add %s to the template parameter ProviderBedrockModels",
				strings.Join(missing, " and "), strings.Join(ids, ","))
		}
	}
	return errors.Join(errs...)
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ",")
}
