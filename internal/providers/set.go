package providers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/quota"
)

// Limiters says how the providers of a file are paced to their quotas: the
// one rule for a process alone (batchgen run and serve) and for a fleet of
// generator instances (AWS).
type Limiters struct {
	// Clock drives the limiters. Defaults to clock.Real.
	Clock clock.Clock
	// Logger receives a shared limiter's notes. Defaults to discarding.
	Logger *slog.Logger
	// Leases, when non-nil, returns the store in which a fleet's processes
	// lease provider p's quota (DynamoDB on AWS): each provider with an rpm
	// is then paced by one quota.Shared across the fleet. Nil: every
	// process paces alone (quota.Local), the embedded runtime's case.
	Leases func(p providerfile.Provider) quota.Leaser
	// Instances is how many processes at most call a provider at once (the
	// generator's maximum concurrency on AWS). Where no shared limiter
	// paces a provider (no Leases, a quota too small to share, or none
	// given and learnt), each process takes 1/Instances of its quota, so
	// the fleet's sum holds. 0 or 1 is a lone process with the whole quota.
	Instances int
}

// For returns the limiter of provider p, and the shared limiter it is when
// it is one (whose leased seconds Set.Release gives back).
func (l Limiters) For(p providerfile.Provider) (pipeline.Limiter, *quota.Shared) {
	clk := l.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	log := l.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if l.Leases != nil && p.RPM > 0 {
		shared, err := quota.NewShared(l.Leases(p), quota.SharedConfig{RPM: p.RPM, TPM: p.TPM, Clock: clk, Logger: log.With("provider", p.Name)})
		if err == nil {
			return shared, shared
		}
		log.Warn("quota too small to share; each instance takes its share", "provider", p.Name, "rpm", p.RPM, "tpm", p.TPM, "reason", err)
	}
	return quota.NewLocal(quota.LocalConfig{RPM: Share(p.RPM, l.Instances), TPM: Share(p.TPM, l.Instances), Clock: clk}), nil
}

// Share is one of instances' share of a per-minute quota: at least 1, and 0
// (none: learnt) for none.
func Share(perMinute, instances int) int {
	if perMinute <= 0 {
		return 0
	}
	return max(1, perMinute/max(1, instances))
}

// Config is what a runtime supplies to build a file's providers: how an
// entry becomes a provider, how it is paced, and the router's settings.
type Config struct {
	// Builder turns entries into providers (keys from the environment or
	// from SSM, Bedrock's AWS configuration).
	Builder Builder
	// Limiters paces each provider.
	Limiters Limiters
	// Wrap, when non-nil, wraps each provider (counting calls, say).
	Wrap func(p providerfile.Provider, lp llm.Provider) llm.Provider
	// Router configures the router; its Mode and Routes come from the file.
	Router pipeline.RouterConfig
}

// Set is the providers of one file, built for one runtime: the router over
// them, in file order, and the shared limiters among their limiters.
type Set struct {
	// Router routes rows over the providers.
	Router   *pipeline.Router
	limiters map[string]pipeline.Limiter
	shared   []*quota.Shared
	// shapes are the adapters that learn whether their server holds
	// answers to a schema, by provider name.
	shapes map[string]jsonModer
}

// jsonModer is an adapter that may learn that its server refused
// structured outputs (openaillm.Provider, anthropicllm.Provider).
type jsonModer interface{ JSONMode() bool }

// JSONMode names the providers whose server refused structured outputs in
// this run, so that answers with columns were asked in JSON mode (and
// checked as ever): for the run's summary.
func (s *Set) JSONMode() []string {
	if s == nil {
		return nil
	}
	var names []string
	for name, p := range s.shapes {
		if p.JSONMode() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// Limiter returns the limiter pacing the provider called name; nil for no
// such provider.
func (s *Set) Limiter(name string) pipeline.Limiter { return s.limiters[name] }

// QuotaPace is the requests a second the quotas of f's providers allow:
// the configured ones, or what the set's limiters learnt so far (a quote's
// sample teaches them); 0 when a provider's is not known.
func (s *Set) QuotaPace(f *providerfile.File) float64 {
	if rpm := f.RPM(); rpm > 0 {
		return float64(rpm) / 60
	}
	total := 0.0
	for _, p := range f.Providers {
		l, ok := s.Limiter(p.Name).(interface{ Rate() float64 })
		if !ok || l.Rate() <= 0 {
			return 0
		}
		total += l.Rate()
	}
	return total
}

// Build builds the providers of f (validated) for one runtime.
func Build(f *providerfile.File, cfg Config) (*Set, error) {
	rc := cfg.Router
	rc.Mode = pipeline.RoutingMode(f.Routing)
	rc.Routes = nil
	set := &Set{limiters: map[string]pipeline.Limiter{}, shapes: map[string]jsonModer{}}
	for _, p := range f.Providers {
		lp, err := cfg.Builder.Build(p)
		if err != nil {
			return nil, &providerfile.Error{File: f.Name(), Line: p.Line(), Msg: fmt.Sprintf("provider %q: %v", p.Name, err)}
		}
		if jm, ok := lp.(jsonModer); ok {
			set.shapes[p.Name] = jm
		}
		// The batch API is the adapter's own: a wrapper counts online
		// calls.
		bp, _ := lp.(llm.BatchProvider)
		if bp == nil {
			if bp, err = cfg.Builder.Batch(p); err != nil {
				return nil, &providerfile.Error{File: f.Name(), Line: p.Line(), Msg: fmt.Sprintf("provider %q: batch inference: %v", p.Name, err)}
			}
		}
		if cfg.Wrap != nil {
			lp = cfg.Wrap(p, lp)
		}
		limiter, shared := cfg.Limiters.For(p)
		set.limiters[p.Name] = limiter
		if shared != nil {
			set.shared = append(set.shared, shared)
		}
		rc.Routes = append(rc.Routes, pipeline.Route{
			Name: p.Name, Provider: lp, Batch: bp, Model: p.Model, Limiter: limiter,
			Concurrency: p.Concurrency, Timeout: p.Timeout, Weight: *p.Weight,
		})
	}
	set.Router = pipeline.NewRouter(rc)
	return set, nil
}

// Shared reports whether any provider of s is paced by a fleet-wide
// limiter.
func (s *Set) Shared() bool { return len(s.shared) > 0 }

// Release gives back the seconds every shared limiter of s leased ahead:
// the generator calls it when an invocation ends, before Lambda may freeze
// the instance. An error leaves those seconds unused (the fleet loses a few
// seconds of quota, nothing more).
func (s *Set) Release(ctx context.Context) error {
	var errs []error
	for _, sh := range s.shared {
		errs = append(errs, sh.Release(ctx))
	}
	return errors.Join(errs...)
}
