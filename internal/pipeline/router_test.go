package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/metrics"
)

// fakeRoute is a provider whose answers a test scripts.
type fakeRoute struct {
	name  string
	calls atomic.Int64
	// answer decides each call; nil answers "ok from <name>".
	answer func(ctx context.Context, n int64) (llm.Response, error)
	// models records the model of each request.
	mu     sync.Mutex
	models []string
}

func (f *fakeRoute) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	n := f.calls.Add(1)
	f.mu.Lock()
	f.models = append(f.models, req.Model)
	f.mu.Unlock()
	if f.answer != nil {
		return f.answer(ctx, n)
	}
	return llm.Response{Text: "ok from " + f.name}, nil
}

func failWith(class llm.ErrorClass, status int) func(context.Context, int64) (llm.Response, error) {
	return func(context.Context, int64) (llm.Response, error) {
		return llm.Response{}, &llm.Error{Class: class, StatusCode: status, Message: "scripted " + string(class)}
	}
}

// hang blocks until the call's context ends.
func hang(ctx context.Context, _ int64) (llm.Response, error) {
	<-ctx.Done()
	return llm.Response{}, ctx.Err()
}

// recordingLimiter counts waits and penalties.
type recordingLimiter struct {
	waits, settles, penalties atomic.Int64
}

func (l *recordingLimiter) Wait(ctx context.Context, _ int) error { l.waits.Add(1); return ctx.Err() }
func (l *recordingLimiter) Settle(charged, used int)              { l.settles.Add(1) }
func (l *recordingLimiter) Observe(llm.RateLimits)                {}
func (l *recordingLimiter) Penalize(time.Duration)                { l.penalties.Add(1) }

func TestRouterFailover(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// a is the first route's behaviour; the second always answers.
		a         func(context.Context, int64) (llm.Response, error)
		aTimeout  time.Duration
		wantRoute string
		wantCalls int
		wantClass llm.ErrorClass // when the call fails
		wantB     int64
	}{
		{name: "a answers", wantRoute: "a", wantCalls: 1},
		{name: "5xx fails over", a: failWith(llm.ClassServer, 503), wantRoute: "b", wantCalls: 2, wantB: 1},
		{name: "connection error fails over", a: failWith(llm.ClassConnection, 0), wantRoute: "b", wantCalls: 2, wantB: 1},
		{name: "timeout fails over", a: hang, aTimeout: 20 * time.Millisecond, wantRoute: "b", wantCalls: 2, wantB: 1},
		{name: "429 fails over", a: failWith(llm.ClassRateLimited, 429), wantRoute: "b", wantCalls: 2, wantB: 1},
		{name: "insufficient quota fails over", a: failWith(llm.ClassQuotaExhausted, 429), wantRoute: "b", wantCalls: 2, wantB: 1},
		{name: "auth fails over", a: failWith(llm.ClassAuth, 401), wantRoute: "b", wantCalls: 2, wantB: 1},
		{name: "content filter is the row's own", a: failWith(llm.ClassContentFilter, 400), wantClass: llm.ClassContentFilter},
		{name: "bad request is the row's own", a: failWith(llm.ClassBadRequest, 400), wantClass: llm.ClassBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := &fakeRoute{name: "a", answer: tc.a}, &fakeRoute{name: "b"}
			lim := &recordingLimiter{}
			r := NewRouter(RouterConfig{Routes: []Route{
				{Name: "a", Provider: a, Timeout: tc.aTimeout, Limiter: lim, Model: "model-a"},
				{Name: "b", Provider: b, Model: "model-b"},
			}})
			resp, err := r.Route(context.Background(), context.Background(), llm.Request{Model: "task-model", Prompt: "p"})
			if tc.wantClass != "" {
				if got := llm.Classify(err); err == nil || got.Class != tc.wantClass {
					t.Fatalf("err = %v, want class %s", err, tc.wantClass)
				}
			} else if err != nil {
				t.Fatalf("Route: %v", err)
			}
			if resp.Route != tc.wantRoute || resp.Calls != tc.wantCalls && tc.wantClass == "" {
				t.Errorf("answered by %q after %d calls, want %q after %d", resp.Route, resp.Calls, tc.wantRoute, tc.wantCalls)
			}
			if err == nil && resp.Provider != tc.wantRoute {
				t.Errorf("Response.Provider = %q, want the route's name %q (the row's provider column)", resp.Provider, tc.wantRoute)
			}
			if got := b.calls.Load(); got != tc.wantB {
				t.Errorf("b called %d times, want %d (a row is called elsewhere only when its call failed)", got, tc.wantB)
			}
			if a.calls.Load() != 1 {
				t.Errorf("a called %d times, want 1", a.calls.Load())
			}
			if diff := cmp.Diff([]string{"model-a"}, a.models); diff != "" {
				t.Errorf("model sent to a (-want +got):\n%s", diff)
			}
			wantPenalties := int64(0)
			if tc.name == "429 fails over" {
				wantPenalties = 1
			}
			if got := lim.penalties.Load(); got != wantPenalties {
				t.Errorf("a's limiter penalised %d times, want %d", got, wantPenalties)
			}
			wantSettles := int64(0)
			if tc.wantRoute == "a" {
				wantSettles = 1
			}
			if got, waits := lim.settles.Load(), lim.waits.Load(); got != wantSettles || waits != 1 {
				t.Errorf("a's limiter: %d waits, %d settles; want 1 wait and %d settle (only answered calls are settled)", waits, got, wantSettles)
			}
		})
	}
}

// TestRouterFatalStopsCalls: a route that refused for good is never called
// again, and only when every route has refused is the refusal the answer.
func TestRouterFatalStopsCalls(t *testing.T) {
	t.Parallel()
	a := &fakeRoute{name: "a", answer: failWith(llm.ClassQuotaExhausted, 429)}
	b := &fakeRoute{name: "b"}
	r := NewRouter(RouterConfig{Routes: []Route{{Name: "a", Provider: a}, {Name: "b", Provider: b}}})
	for i := range 5 {
		resp, err := r.Route(context.Background(), context.Background(), llm.Request{Prompt: fmt.Sprint(i)})
		if err != nil || resp.Route != "b" {
			t.Fatalf("call %d: route %q, err %v; want b", i, resp.Route, err)
		}
	}
	if got := a.calls.Load(); got != 1 {
		t.Errorf("a called %d times after refusing for good, want 1", got)
	}
	if e := r.Refused(); e != nil {
		t.Errorf("Refused = %v while b still answers, want nil", e)
	}
	b.answer = failWith(llm.ClassAuth, 401)
	_, err := r.Route(context.Background(), context.Background(), llm.Request{Prompt: "x"})
	if e := llm.Classify(err); err == nil || !e.Class.Fatal() {
		t.Fatalf("with every route out, err = %v; want a fatal class", err)
	}
	_, err = r.Route(context.Background(), context.Background(), llm.Request{Prompt: "y"})
	if e := llm.Classify(err); err == nil || !e.Class.Fatal() || b.calls.Load() != 6 {
		t.Fatalf("after every route refused: err %v, b calls %d; want a fatal error without a call", err, b.calls.Load())
	}
	if e := r.Refused(); e == nil || !e.Class.Fatal() {
		t.Errorf("Refused = %v with every route out, want the fatal refusal", e)
	}
}

// TestRouterOrderedOverflow: ordered routing fills the first route's slots
// and sends the overflow to the next.
func TestRouterOrderedOverflow(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan string, 10)
	blocking := func(name string) func(context.Context, int64) (llm.Response, error) {
		return func(ctx context.Context, _ int64) (llm.Response, error) {
			started <- name
			select {
			case <-release:
				return llm.Response{Text: name}, nil
			case <-ctx.Done():
				return llm.Response{}, ctx.Err()
			}
		}
	}
	a, b := &fakeRoute{name: "a"}, &fakeRoute{name: "b"}
	a.answer, b.answer = blocking("a"), blocking("b")
	r := NewRouter(RouterConfig{Mode: RouteOrdered, Routes: []Route{
		{Name: "a", Provider: a, Concurrency: 2}, {Name: "b", Provider: b, Concurrency: 2},
	}})
	var wg sync.WaitGroup
	got := map[string]int{}
	for i := range 3 {
		if i == 2 {
			// The third call starts once the first two hold a's slots.
			<-started
			<-started
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.Route(context.Background(), context.Background(), llm.Request{}); err != nil {
				t.Errorf("Route: %v", err)
			}
		}()
	}
	got[<-started]++
	close(release)
	wg.Wait()
	if diff := cmp.Diff(map[string]int{"b": 1}, got); diff != "" {
		t.Errorf("third call went to (-want +got):\n%s", diff)
	}
	if a.calls.Load() != 2 || b.calls.Load() != 1 {
		t.Errorf("calls a=%d b=%d, want 2 and 1", a.calls.Load(), b.calls.Load())
	}
}

// TestRouterWeights: with free slots everywhere, calls spread by weight;
// a standby (weight 0) gets none until the others fail.
func TestRouterWeights(t *testing.T) {
	t.Parallel()
	a, b, c := &fakeRoute{name: "a"}, &fakeRoute{name: "b"}, &fakeRoute{name: "standby"}
	r := NewRouter(RouterConfig{Mode: RouteWeighted, Routes: []Route{
		{Name: "a", Provider: a, Weight: 3}, {Name: "b", Provider: b, Weight: 1}, {Name: "standby", Provider: c, Weight: 0},
	}})
	const n = 8000
	for range n {
		if _, err := r.Route(context.Background(), context.Background(), llm.Request{}); err != nil {
			t.Fatal(err)
		}
	}
	share := float64(a.calls.Load()) / n
	// 3:1 is 0.75; the binomial's standard deviation at n=8000 is ~0.005.
	if share < 0.72 || share > 0.78 || c.calls.Load() != 0 {
		t.Errorf("a took %.3f of the calls (want 0.75±0.03), standby %d (want 0)", share, c.calls.Load())
	}
	a.answer = failWith(llm.ClassServer, 500)
	b.answer = failWith(llm.ClassServer, 500)
	resp, err := r.Route(context.Background(), context.Background(), llm.Request{})
	if err != nil || resp.Route != "standby" || resp.Calls != 3 {
		t.Errorf("with a and b failing: route %q after %d calls, err %v; want standby after 3", resp.Route, resp.Calls, err)
	}
}

// TestRouterBulkhead: a hung route holds only its own slots; every other
// row is answered by the healthy route meanwhile.
func TestRouterBulkhead(t *testing.T) {
	t.Parallel()
	hung := make(chan struct{}, 100)
	a := &fakeRoute{name: "a", answer: func(ctx context.Context, _ int64) (llm.Response, error) {
		hung <- struct{}{}
		return hang(ctx, 0)
	}}
	b := &fakeRoute{name: "b"}
	r := NewRouter(RouterConfig{Mode: RouteOrdered, Routes: []Route{
		{Name: "a", Provider: a, Concurrency: 2, Timeout: time.Hour}, {Name: "b", Provider: b, Concurrency: 2},
	}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Two rows take a's slots and hang there.
	hungDone := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := r.Route(ctx, ctx, llm.Request{})
			hungDone <- err
		}()
	}
	<-hung
	<-hung
	const rows = 50
	var wg sync.WaitGroup
	var byB atomic.Int64
	for range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := r.Route(ctx, ctx, llm.Request{})
			if err == nil && resp.Route == "b" {
				byB.Add(1)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("rows stuck behind the hung route")
	}
	if byB.Load() != rows || a.calls.Load() != 2 {
		t.Errorf("b answered %d of %d rows, a got %d calls; want all by b and a only the 2 hung", byB.Load(), rows, a.calls.Load())
	}
	select {
	case err := <-hungDone:
		t.Fatalf("a hung row returned early: %v", err)
	default:
	}
	cancel()
	for range 2 {
		if err := <-hungDone; err == nil {
			t.Error("a hung row succeeded after cancel")
		}
	}
}

// TestRouterNotStarted: when no new call may start, a row waiting for a
// slot gives up without a call, and the generator can tell.
func TestRouterNotStarted(t *testing.T) {
	t.Parallel()
	a := &fakeRoute{name: "a", answer: hang}
	r := NewRouter(RouterConfig{Routes: []Route{{Name: "a", Provider: a, Concurrency: 1, Timeout: time.Hour}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = r.Route(ctx, ctx, llm.Request{}) }()
	for a.calls.Load() == 0 {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
	}
	start, stop := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := r.Route(context.Background(), start, llm.Request{})
		errc <- err
	}()
	stop()
	if err := <-errc; !errors.Is(err, errNotStarted) {
		t.Fatalf("err = %v, want errNotStarted", err)
	}
	if a.calls.Load() != 1 {
		t.Errorf("a called %d times, want only the hung call", a.calls.Load())
	}
}

// TestBreakerTransitions drives a route's breaker through its states on
// synctest's fake clock (gobreaker reads time.Now, which the bubble
// controls; time.Sleep there advances that clock at once, it does not
// synchronise anything).
func TestBreakerTransitions(t *testing.T) {
	type step struct {
		// fail makes a's next call fail (5xx) instead of answering.
		fail bool
		// wait advances the clock before the call.
		wait      time.Duration
		wantRoute string
		wantState string
	}
	cases := []struct {
		name        string
		steps       []step
		wantChanges []BreakerChange
	}{
		{
			name: "opens after a run of failures, then routes elsewhere",
			steps: []step{
				{fail: true, wantRoute: "b", wantState: "closed"},
				{fail: true, wantRoute: "b", wantState: "closed"},
				{fail: true, wantRoute: "b", wantState: "open"},
				{wantRoute: "b", wantState: "open"},
				{wait: 9 * time.Second, wantRoute: "b", wantState: "open"},
			},
			wantChanges: []BreakerChange{{"a", "closed", "open"}},
		},
		{
			name: "a success in between resets the run",
			steps: []step{
				{fail: true, wantRoute: "b", wantState: "closed"},
				{fail: true, wantRoute: "b", wantState: "closed"},
				{wantRoute: "a", wantState: "closed"},
				{fail: true, wantRoute: "b", wantState: "closed"},
				{fail: true, wantRoute: "b", wantState: "closed"},
			},
		},
		{
			name: "half-open probe that succeeds closes it",
			steps: []step{
				{fail: true, wantRoute: "b"}, {fail: true, wantRoute: "b"}, {fail: true, wantRoute: "b", wantState: "open"},
				{wait: 11 * time.Second, wantRoute: "a", wantState: "closed"},
				{wantRoute: "a", wantState: "closed"},
			},
			wantChanges: []BreakerChange{{"a", "closed", "open"}, {"a", "open", "half-open"}, {"a", "half-open", "closed"}},
		},
		{
			name: "half-open probe that fails opens it again",
			steps: []step{
				{fail: true, wantRoute: "b"}, {fail: true, wantRoute: "b"}, {fail: true, wantRoute: "b", wantState: "open"},
				{wait: 11 * time.Second, fail: true, wantRoute: "b", wantState: "open"},
				{wait: 5 * time.Second, wantRoute: "b", wantState: "open"},
				{wait: 6 * time.Second, wantRoute: "a", wantState: "closed"},
			},
			wantChanges: []BreakerChange{
				{"a", "closed", "open"}, {"a", "open", "half-open"}, {"a", "half-open", "open"},
				{"a", "open", "half-open"}, {"a", "half-open", "closed"},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var fail atomic.Bool
				a := &fakeRoute{name: "a", answer: func(context.Context, int64) (llm.Response, error) {
					if fail.Load() {
						return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: 502}
					}
					return llm.Response{Text: "a"}, nil
				}}
				var mu sync.Mutex
				var changes []BreakerChange
				counted := &countingRecorder{}
				r := NewRouter(RouterConfig{
					Routes:          []Route{{Name: "a", Provider: a}, {Name: "b", Provider: &fakeRoute{name: "b"}}},
					BreakerFailures: 3, BreakerOpen: 10 * time.Second,
					OnBreakerChange: func(c BreakerChange) { mu.Lock(); changes = append(changes, c); mu.Unlock() },
					Metrics:         counted,
				})
				for i, s := range tc.steps {
					time.Sleep(s.wait)
					fail.Store(s.fail)
					resp, err := r.Route(context.Background(), context.Background(), llm.Request{})
					if err != nil || resp.Route != s.wantRoute {
						t.Fatalf("step %d: answered by %q, err %v; want %q", i, resp.Route, err, s.wantRoute)
					}
					if s.wantState != "" {
						if got := r.BreakerState("a"); got != s.wantState {
							t.Fatalf("step %d: breaker %s, want %s", i, got, s.wantState)
						}
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if diff := cmp.Diff(tc.wantChanges, changes); diff != "" {
					t.Errorf("transitions (-want +got):\n%s", diff)
				}
				// Every transition is counted, by provider and state entered.
				wantCounts := map[string]float64{}
				for _, c := range tc.wantChanges {
					wantCounts[metrics.BreakerTransitions+"/"+c.Route+"/"+c.To]++
				}
				if diff := cmp.Diff(wantCounts, counted.snapshot(), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("breaker metrics (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestRouterSingleRouteHasNoBreaker: with nowhere to fail over to, a run of
// failures never stops the calls (the generator's backoff paces them).
func TestRouterSingleRouteHasNoBreaker(t *testing.T) {
	t.Parallel()
	a := &fakeRoute{name: "a", answer: failWith(llm.ClassServer, 500)}
	r := NewRouter(RouterConfig{Routes: []Route{{Name: "a", Provider: a}}, BreakerFailures: 1})
	for range 10 {
		if _, err := r.Route(context.Background(), context.Background(), llm.Request{}); llm.Classify(err).Class != llm.ClassServer {
			t.Fatalf("err = %v, want the server error", err)
		}
	}
	if a.calls.Load() != 10 || r.BreakerState("a") != "" {
		t.Errorf("a called %d times, breaker %q; want 10 calls and no breaker", a.calls.Load(), r.BreakerState("a"))
	}
}

func TestNewRouterRejectsBadConfig(t *testing.T) {
	t.Parallel()
	cases := map[string]RouterConfig{
		"no routes":         {},
		"duplicate names":   {Routes: []Route{{Name: "a", Provider: &fakeRoute{}}, {Name: "a", Provider: &fakeRoute{}}}},
		"nil provider":      {Routes: []Route{{Name: "a"}}},
		"all weights zero":  {Mode: RouteWeighted, Routes: []Route{{Name: "a", Provider: &fakeRoute{}}}},
		"unknown mode":      {Mode: "fastest", Routes: []Route{{Name: "a", Provider: &fakeRoute{}}}},
		"negative capacity": {Routes: []Route{{Name: "a", Provider: &fakeRoute{}, Concurrency: -1}}},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("NewRouter accepted it")
				}
			}()
			NewRouter(cfg)
		})
	}
}

// countingRecorder is a metrics.Recorder that sums counters by name and
// labels ("Name/label/label").
type countingRecorder struct {
	mu sync.Mutex
	m  map[string]float64
}

func (c *countingRecorder) Add(name string, v float64, labels ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]float64{}
	}
	c.m[strings.Join(append([]string{name}, labels...), "/")] += v
}

func (c *countingRecorder) Observe(string, float64, ...string) {}

func (c *countingRecorder) Set(string, float64, ...string) {}

func (c *countingRecorder) snapshot() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// TestLoneRouteCallsTheTaskModel: a deployment of one provider lets a task
// choose its model (the API's allow-list), so its lone route calls the
// model the task names and its rows record the task's provider and model
// (priced at that model), while routes among several call their own model
// under their own name.
func TestLoneRouteCallsTheTaskModel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		routes        int
		wantModel     string
		wantAnswerers string
	}{
		{name: "one route", routes: 1, wantModel: "gpt-4o", wantAnswerers: ""},
		{name: "two routes", routes: 2, wantModel: "gpt-4o-mini", wantAnswerers: "openai/gpt-4o-mini"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &fakeRoute{name: "a"}
			routes := []Route{{Name: "openai/gpt-4o-mini", Provider: a, Model: "gpt-4o-mini", Weight: 1}}
			if tc.routes == 2 {
				routes = append(routes, Route{Name: "standby", Provider: &fakeRoute{name: "b"}, Model: "other"})
			}
			r := NewRouter(RouterConfig{Routes: routes})
			resp, err := r.Route(context.Background(), context.Background(), llm.Request{Model: "gpt-4o", Prompt: "p"})
			if err != nil {
				t.Fatal(err)
			}
			if a.models[0] != tc.wantModel {
				t.Errorf("called model %q, want %q", a.models[0], tc.wantModel)
			}
			if resp.Provider != tc.wantAnswerers {
				t.Errorf("Response.Provider = %q, want %q (empty: the task's own provider and model)", resp.Provider, tc.wantAnswerers)
			}
		})
	}
}
