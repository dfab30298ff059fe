package providers_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/providers"
	"github.com/batchgen/batchgen/internal/quota"
)

func TestShare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ perMinute, instances, want int }{
		{2000, 10, 200}, {2000, 0, 2000}, {2000, 1, 2000}, {5, 10, 1}, {0, 10, 0}, {-1, 3, 0},
	} {
		if got := providers.Share(tc.perMinute, tc.instances); got != tc.want {
			t.Errorf("Share(%d, %d) = %d, want %d", tc.perMinute, tc.instances, got, tc.want)
		}
	}
}

// TestLimitersFor: a fleet with a lease store paces each provider with an
// rpm by one shared limiter; every other provider, and every provider of a
// process alone, gets an in-process limiter with its share of the quota.
func TestLimitersFor(t *testing.T) {
	t.Parallel()
	leases := func(providerfile.Provider) quota.Leaser { return quota.NewMemLeaser() }
	tests := []struct {
		name      string
		l         providers.Limiters
		rpm       int
		wantType  string
		perMinute float64 // an in-process limiter's own quota; 0: learnt
	}{
		{"alone, quota given", providers.Limiters{}, 600, "*quota.Local", 600},
		{"alone, quota learnt", providers.Limiters{}, 0, "*quota.Local", 0},
		{"fleet, quota given", providers.Limiters{Leases: leases, Instances: 10}, 600, "*quota.Shared", 0},
		{"fleet, quota too small to share", providers.Limiters{Leases: leases, Instances: 10}, 30, "*quota.Local", 3},
		{"fleet, quota learnt", providers.Limiters{Leases: leases, Instances: 10}, 0, "*quota.Local", 0},
		{"instances without a lease store", providers.Limiters{Instances: 4}, 600, "*quota.Local", 150},
	}
	for _, tc := range tests {
		l, shared := tc.l.For(providerfile.Provider{Name: "p", RPM: tc.rpm})
		if got := fmt.Sprintf("%T", l); got != tc.wantType {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.wantType)
		}
		if (shared != nil) != (tc.wantType == "*quota.Shared") {
			t.Errorf("%s: shared %v, want it reported exactly when the limiter is shared", tc.name, shared)
		}
		if local, ok := l.(*quota.Local); ok && tc.perMinute > 0 {
			if got := local.Rate() * 60; got > tc.perMinute || got < 0.9*tc.perMinute {
				t.Errorf("%s: paced at %.1f/min, want %v (a little under is its margin)", tc.name, got, tc.perMinute)
			}
		}
	}
}

// TestBuildSet: a file's providers become routes in file order, each
// wrapped and paced as configured; quota waits reach the router's hook.
func TestBuildSet(t *testing.T) {
	t.Parallel()
	f, err := providerfile.Parse("test.yaml", []byte(`routing: weighted
providers:
  - {name: a, kind: sim, rpm: 6000, concurrency: 3, latency: 1ms}
  - {name: b, kind: sim, concurrency: 5, weight: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	var wrapped, waits atomic.Int32
	set, err := providers.Build(f, providers.Config{
		Wrap: func(_ providerfile.Provider, lp llm.Provider) llm.Provider { wrapped.Add(1); return lp },
		Router: pipeline.RouterConfig{OnQuotaWait: func(route string, _ time.Duration) {
			if route == "a" {
				waits.Add(1)
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Router.Routes(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("routes %v, want [a b]", got)
	}
	if wrapped.Load() != 2 || set.Limiter("a") == nil || set.Limiter("b") == nil || set.Limiter("c") != nil || set.Shared() {
		t.Errorf("wrapped %d, limiters a %v b %v c %v, shared %v: want both wrapped and paced in-process", wrapped.Load(),
			set.Limiter("a"), set.Limiter("b"), set.Limiter("c"), set.Shared())
	}
	if err := set.Release(context.Background()); err != nil {
		t.Errorf("Release with no shared limiter: %v", err)
	}
	resp, err := set.Router.Route(context.Background(), context.Background(), llm.Request{Prompt: "x"})
	if err != nil || resp.Route != "a" {
		t.Fatalf("Generate = %+v, %v; want an answer from a", resp, err)
	}
	if waits.Load() != 1 {
		t.Errorf("%d quota waits reported for one call through a, want 1", waits.Load())
	}
	if f.Concurrency() != 8 || f.RPM() != 0 {
		t.Errorf("file concurrency %d, rpm %d; want 3+5 and 0 (b's quota is learnt)", f.Concurrency(), f.RPM())
	}
}

// TestBuildNamesTheEntry: an entry that cannot be built is an error naming
// the file, the line and the provider.
func TestBuildNamesTheEntry(t *testing.T) {
	t.Parallel()
	f, err := providerfile.Parse("keys.yaml", []byte("providers:\n  - {name: a, kind: sim}\n  - {name: gpt, kind: openai, api_key_env: BATCHGEN_TEST_UNSET_KEY}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = providers.Build(f, providers.Config{})
	if err == nil || err.Error() != `keys.yaml:3: provider "gpt": needs an API key in $BATCHGEN_TEST_UNSET_KEY (or a base_url for a local OpenAI-compatible server)` {
		t.Errorf("Build = %v, want the entry's file, line and provider named", err)
	}
}
