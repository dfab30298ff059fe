package providerfile

import (
	"fmt"
	"strings"

	"github.com/batchgen/batchgen/internal/store"
)

// FixedModels says why a task cannot choose its model under f, or "" when
// it can. A lone provider calls the model its task names (by default the
// entry's, or one a request chose within the deployment's allow-list);
// several providers each call their own entry's model
// (package providers builds the router), so a model a request named would change the
// task's id and cache keys without changing any call.
func (f *File) FixedModels() string {
	if len(f.Providers) < 2 {
		return ""
	}
	return fmt.Sprintf("this deployment routes rows over the providers %s, each calling the model its providers file names",
		strings.Join(f.Names(), ", "))
}

// ProviderLabel is what a task records as its provider: the kind of a lone
// provider (so a task run with the single-provider flags keeps its id), or
// the routed names.
func (f *File) ProviderLabel() string {
	if len(f.Providers) == 1 {
		return string(f.Providers[0].Kind)
	}
	return "routed:" + strings.Join(f.Names(), ",")
}

// Spec returns spec with what a task records about its provider(s) when f
// is the deployment's providers config: the provider label
// (ProviderLabel) and the first provider's model. Both are part of the
// task id and of the cache key, so every entry point that builds a spec
// (batchgen run and serve, the splitter, the API and the generator on
// AWS) goes through this one rule: the same sheet under the same providers
// file is the same task wherever it runs.
func (f *File) Spec(spec store.TaskSpec) store.TaskSpec {
	spec.Provider = f.ProviderLabel()
	spec.Model = f.Providers[0].Model
	return spec
}
