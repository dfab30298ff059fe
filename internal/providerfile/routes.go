package providerfile

import (
	"fmt"
	"strings"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// Wiring is what a runtime supplies to turn a File into routes: how an
// entry becomes a provider (package providers builds the adapters; this
// package links none, so that what only reads a providers file, such as
// the price table of the API function, carries no model SDK) and which
// limiter paces each provider differ between the embedded runtime and
// Lambda; the rest is the same.
type Wiring struct {
	// Build returns the provider of an entry. Required.
	Build func(p Provider) (llm.Provider, error)
	// Limiter returns the limiter of a provider, or nil for none (rpm and
	// tpm 0). Required.
	Limiter func(p Provider) pipeline.Limiter
	// Wrap, when non-nil, wraps each provider (counting calls, say).
	Wrap func(p Provider, lp llm.Provider) llm.Provider
}

// Router builds the router over f's providers, in file order.
func (f *File) Router(w Wiring, cfg pipeline.RouterConfig) (*pipeline.Router, error) {
	if w.Build == nil || w.Limiter == nil {
		return nil, fmt.Errorf("providers file %s: Wiring needs Build and Limiter", f.name)
	}
	cfg.Mode = pipeline.RoutingMode(f.Routing)
	cfg.Routes = nil
	for _, p := range f.Providers {
		lp, err := w.Build(p)
		if err != nil {
			return nil, &Error{File: f.name, Line: p.line, Msg: fmt.Sprintf("provider %q: %v", p.Name, err)}
		}
		if w.Wrap != nil {
			lp = w.Wrap(p, lp)
		}
		cfg.Routes = append(cfg.Routes, pipeline.Route{
			Name: p.Name, Provider: lp, Model: p.Model, Limiter: w.Limiter(p),
			Concurrency: p.Concurrency, Timeout: p.Timeout, Weight: *p.Weight,
		})
	}
	return pipeline.NewRouter(cfg), nil
}

// FixedModels says why a task cannot choose its model under f, or "" when
// it can. A lone provider calls the model its task names (by default the
// entry's, or one a request chose within the deployment's allow-list);
// several providers each call their own entry's model
// (pipeline.NewRouter), so a model a request named would change the
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
