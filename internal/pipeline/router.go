package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/metrics"
)

// RoutingMode is how a Router chooses among routes with a free slot.
type RoutingMode string

// Routing modes (the providers file's `routing:`).
const (
	// RouteOrdered takes the first route, in order, with a free slot.
	RouteOrdered RoutingMode = "ordered"
	// RouteWeighted picks among the routes with a free slot in proportion
	// to their weights.
	RouteWeighted RoutingMode = "weighted"
)

// Route is one provider endpoint and model behind a Router, with its own
// bulkhead: its own quota limiter, concurrency slots and call timeout, so a
// slow or failing endpoint cannot take another's capacity.
type Route struct {
	// Name identifies the route in logs, metrics and the result's provider
	// column. Required.
	Name string
	// Provider makes the calls. Required.
	Provider llm.Provider
	// Batch, when non-nil, is the same provider's batch API, which the
	// rows of economy tasks go to (economy.go).
	Batch llm.BatchProvider
	// Model, when set, replaces the request's model for this route. A
	// Router of one route ignores it: that route calls the task's model.
	Model string
	// Limiter, when non-nil, paces this route's calls to its quota.
	Limiter Limiter
	// Concurrency bounds this route's calls in flight (counting calls
	// waiting for its limiter). 0 means no bound of its own.
	Concurrency int
	// Timeout bounds one call. Defaults to DefaultCallTimeout.
	Timeout time.Duration
	// Weight is the route's share in weighted routing. A route of weight 0
	// is a standby in both modes: a row goes there only when every route of
	// positive weight is spent for it (tried, out of service or open).
	Weight int
}

// BreakerChange is one circuit breaker transition, for metrics.
type BreakerChange struct {
	Route    string
	From, To string
}

// RouterConfig configures a Router. Zero fields take the defaults.
type RouterConfig struct {
	// Mode defaults to RouteOrdered.
	Mode RoutingMode
	// Routes are the providers, in order of preference. At least one.
	Routes []Route
	// BreakerFailures is how many calls of a route must fail in a row
	// (5xx, timeout, connection) before its breaker opens and rows go
	// elsewhere. Defaults to 5. Breakers apply only with two or more
	// routes: with one there is nowhere else to go, and the generator's
	// backoff and graded redelivery already pace calls to a sick endpoint.
	BreakerFailures int
	// BreakerOpen is how long an open breaker refuses calls before letting
	// probes through (half-open). Defaults to 30 seconds.
	BreakerOpen time.Duration
	// BreakerProbes is how many calls a half-open breaker lets through; as
	// many successes close it, one failure opens it again. Defaults to 1.
	BreakerProbes int
	// OnBreakerChange, when non-nil, is called on every breaker transition
	// (after it is logged): the hook the metrics adapter counts with. It
	// must not block.
	OnBreakerChange func(BreakerChange)
	// OnQuotaWait, when non-nil, is told how long each call waited for its
	// route's quota limiter, whether or not the call then started: what a
	// progress display says holds the job back. It must not block.
	OnQuotaWait func(route string, waited time.Duration)
	// Metrics counts the transitions (metrics.BreakerTransitions). Nil
	// records nothing.
	Metrics metrics.Recorder
	// Logger defaults to discarding.
	Logger *slog.Logger
}

func (c RouterConfig) withDefaults() RouterConfig {
	c.Mode = cmp.Or(c.Mode, RouteOrdered)
	c.BreakerFailures = cmp.Or(c.BreakerFailures, 5)
	c.BreakerOpen = cmp.Or(c.BreakerOpen, 30*time.Second)
	c.BreakerProbes = cmp.Or(c.BreakerProbes, 1)
	c.Logger = orLogger(c.Logger)
	c.Metrics = metrics.Or(c.Metrics)
	routes := make([]Route, len(c.Routes))
	for i, r := range c.Routes {
		r.Timeout = cmp.Or(r.Timeout, DefaultCallTimeout)
		routes[i] = r
	}
	c.Routes = routes
	return c
}

func (c RouterConfig) validate() error {
	var errs []error
	if c.Mode != RouteOrdered && c.Mode != RouteWeighted {
		errs = append(errs, fmt.Errorf("mode %q: use ordered or weighted", c.Mode))
	}
	if len(c.Routes) == 0 {
		errs = append(errs, errors.New("no Routes"))
	}
	if c.BreakerFailures < 1 || c.BreakerProbes < 1 || c.BreakerOpen <= 0 {
		errs = append(errs, fmt.Errorf("breaker failures %d, probes %d, open time %v: must be positive", c.BreakerFailures, c.BreakerProbes, c.BreakerOpen))
	}
	names := map[string]bool{}
	positive := false
	for i, r := range c.Routes {
		if r.Name == "" || names[r.Name] {
			errs = append(errs, fmt.Errorf("route %d: name %q is empty or used twice", i, r.Name))
		}
		names[r.Name] = true
		if err := required(fmt.Sprintf("Routes[%d].Provider", i), r.Provider); err != nil {
			errs = append(errs, err)
		}
		if r.Concurrency < 0 || r.Weight < 0 || r.Timeout <= 0 {
			errs = append(errs, fmt.Errorf("route %d %q: concurrency %d, weight %d must not be negative, timeout %v must be positive", i, r.Name, r.Concurrency, r.Weight, r.Timeout))
		}
		positive = positive || r.Weight > 0
	}
	if c.Mode == RouteWeighted && len(c.Routes) > 0 && !positive {
		errs = append(errs, errors.New("weighted routing with every Weight 0"))
	}
	return errors.Join(errs...)
}

// Router sends each call to one of several routes and fails over to the
// next when a call did not succeed: a 5xx, a timeout, a lost connection, a
// 429, an open breaker, or a route that refused for good (insufficient
// quota, bad credentials), which is not called again. A row is never paid
// twice: a call is only made again elsewhere when the previous one failed.
// Errors that are the row's own (bad request, content filter, prompt too
// long) are returned at once, since every route would answer the same.
//
// A Router is an llm.Provider; the Generator, given one, leaves quota
// pacing, concurrency per route and call timeouts to it. Each answer names
// its route in Response.Provider, the row's provider column. It is safe for
// concurrent use.
type Router struct {
	cfg    RouterConfig
	routes []*route
	// slotFree is closed and replaced whenever a slot of any route is
	// released, waking the calls that wait for one.
	slotFree atomic.Pointer[chan struct{}]
}

// route is a Route's runtime state.
type route struct {
	Route
	// i is the route's index in Router.routes.
	i int
	// sem holds the route's concurrency slots; nil means unbounded.
	sem chan struct{}
	// cb is nil when breakers are off (one route).
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
	// out is the refusal that took the route out of service for good.
	out atomic.Pointer[llm.Error]
	// anonymous routes leave Response.Provider as the provider set it.
	anonymous bool
}

// NewRouter returns a Router over cfg.Routes. It panics on an invalid
// config: a mistake in the wiring (the providers file is validated before
// it gets here).
func NewRouter(cfg RouterConfig) *Router {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		panic("pipeline.NewRouter: " + err.Error())
	}
	r := &Router{cfg: cfg}
	free := make(chan struct{})
	r.slotFree.Store(&free)
	for i, rt := range cfg.Routes {
		x := &route{Route: rt, i: i}
		if len(cfg.Routes) == 1 {
			// A lone route is the task's own provider: it calls the model
			// the task names (the deployment's default, or one a request
			// chose from its allow-list) and its rows record the task's
			// provider and model, so they are priced at that model. Only
			// routes among several fix their own model and name.
			x.Model, x.anonymous = "", true
		}
		if rt.Concurrency > 0 {
			x.sem = make(chan struct{}, rt.Concurrency)
		}
		if len(cfg.Routes) > 1 {
			x.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](r.breakerSettings(rt.Name))
		}
		r.routes = append(r.routes, x)
	}
	return r
}

func (r *Router) breakerSettings(name string) gobreaker.Settings {
	failures := uint32(r.cfg.BreakerFailures)
	return gobreaker.Settings{
		Name:        name,
		MaxRequests: uint32(r.cfg.BreakerProbes),
		Timeout:     r.cfg.BreakerOpen,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		// Only failures of the endpoint count: a 429 or a row the model
		// refuses shows the endpoint is up.
		IsSuccessful: func(err error) bool { return err == nil || !endpointFailure(err) },
		// A call cut short by the caller (shutdown, lost lease) says
		// nothing about the endpoint.
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(name string, from, to gobreaker.State) {
			r.cfg.Logger.Info("circuit breaker changed state", "provider", name, "from", from.String(), "to", to.String())
			r.cfg.Metrics.Add(metrics.BreakerTransitions, 1, name, to.String())
			if r.cfg.OnBreakerChange != nil {
				r.cfg.OnBreakerChange(BreakerChange{Route: name, From: from.String(), To: to.String()})
			}
		},
	}
}

// endpointFailure reports whether err means the endpoint itself is
// failing (what a breaker counts and a failover avoids).
func endpointFailure(err error) bool {
	switch llm.Classify(err).Class {
	case llm.ClassServer, llm.ClassTimeout, llm.ClassConnection:
		return true
	}
	return false
}

// BreakerState returns the state of the named route's breaker ("closed",
// "open", "half-open"), or "" when it has none.
func (r *Router) BreakerState(name string) string {
	for _, x := range r.routes {
		if x.Name == name && x.cb != nil {
			return x.cb.State().String()
		}
	}
	return ""
}

// Routes returns the routes' names, in order.
func (r *Router) Routes() []string {
	var names []string
	for _, x := range r.routes {
		names = append(names, x.Name)
	}
	return names
}

// MaxTimeout is the longest call timeout of any route: how long one call
// started now may take.
func (r *Router) MaxTimeout() time.Duration {
	var d time.Duration
	for _, x := range r.routes {
		d = max(d, x.Timeout)
	}
	return d
}

// errNotStarted means no call was made because start ended: the row was
// not attempted and stays as it was.
var errNotStarted = errors.New("no call started")

// RoutedResponse is a Router's answer with where it came from.
type RoutedResponse struct {
	llm.Response
	// Route is the name of the route that answered.
	Route string
	// Latency is the answering call's own duration (no quota wait).
	Latency time.Duration
	// Calls counts the calls made for this answer, failovers included.
	Calls int
	// Log has one entry per call made, failed ones included, for metrics.
	Log []CallRecord
}

// CallRecord is one call a Router made.
type CallRecord struct {
	// Route is the route's name; "" for the one route of a plain provider.
	Route    string
	Latency  time.Duration
	Response llm.Response
	Err      error
	// Aborted means the caller's context ended during the call.
	Aborted bool
}

// errStarved, with errNotStarted, means the call was stopped while it
// waited for its route's quota limiter (or right after the wait), not
// because the limiter failed on its own.
var errStarved = errors.New("stopped while waiting for the quota")

// Generate implements llm.Provider: quota waits end with ctx.
func (r *Router) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	resp, err := r.Route(ctx, ctx, req)
	return resp.Response, err
}

// Route is route without a stop time of its own: start alone says when no
// new call may begin.
func (r *Router) Route(ctx, start context.Context, req llm.Request) (RoutedResponse, error) {
	return r.route(ctx, start, nil, req, nil)
}

// route makes the call on the first route that can take it and fails over
// as described on Router. Waits for a slot or for quota end with start (no
// new call begins after it); calls run under ctx and their route's
// timeout. When start ended before any call, the error wraps
// errNotStarted; otherwise a failed call's error is the last route's, and
// only when every route has refused for good is it a Fatal one.
//
// mayStart, when non-nil, is asked again right before each call (after the
// quota wait, which can outlast a stop time): false stops like start's end.
// spend, when non-nil, is the task's spending cap: a call whose worst case
// does not fit is not made, and the error wraps errNotStarted and a
// *BudgetError.
func (r *Router) route(ctx, start context.Context, mayStart func() bool, req llm.Request, spend *budget) (RoutedResponse, error) {
	if mayStart == nil {
		mayStart = func() bool { return start.Err() == nil }
	}
	tried := make([]bool, len(r.routes))
	var last error
	calls := 0
	var log []CallRecord
	notStarted := func(err error) (RoutedResponse, error) {
		if last != nil {
			return RoutedResponse{Calls: calls, Log: log}, last
		}
		if err != nil {
			return RoutedResponse{}, err
		}
		return RoutedResponse{}, fmt.Errorf("%w: %w", errNotStarted, cmp.Or(start.Err(), ctx.Err(), context.Canceled))
	}
	for {
		if !mayStart() || ctx.Err() != nil {
			return notStarted(nil)
		}
		x, err := r.acquire(start, tried)
		if err != nil {
			if errors.Is(err, errNoRoute) {
				if last == nil {
					last = r.noRouteError()
				}
				return RoutedResponse{Calls: calls, Log: log}, last
			}
			return notStarted(nil)
		}
		resp, err := r.call(ctx, start, mayStart, x, req, spend)
		// A refusal for good takes the route out before its slot is
		// released: a call waiting for the slot must find it out, not make
		// one more call that the provider would refuse (and might bill).
		if err != nil && ctx.Err() == nil {
			if e := llm.Classify(err); e.Class.Fatal() && x.out.CompareAndSwap(nil, e) {
				r.cfg.Logger.Warn("provider refused for good; no more calls to it", "provider", x.Name, "error_class", string(e.Class), "error", e.Error())
			}
		}
		r.release(x)
		if errors.Is(err, errNotStarted) {
			return notStarted(err)
		}
		if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			// The breaker opened while we waited for quota: go elsewhere.
			tried[x.i] = true
			continue
		}
		calls++
		rec := CallRecord{Route: x.Name, Latency: resp.Latency, Response: resp.Response, Err: err, Aborted: ctx.Err() != nil}
		if x.anonymous {
			rec.Route = ""
		}
		log = append(log, rec)
		resp.Calls, resp.Log = calls, log
		if err == nil {
			return resp, nil
		}
		last = err
		tried[x.i] = true
		if ctx.Err() != nil {
			return RoutedResponse{Calls: calls, Log: log}, err
		}
		e := llm.Classify(err)
		switch {
		case e.Class.Fatal():
			if r.allOut() {
				return RoutedResponse{Calls: calls, Log: log}, err
			}
		case !e.Class.Retryable():
			return RoutedResponse{Calls: calls, Log: log}, err
		}
	}
}

// errNoRoute: every route is tried, out of service or open for this call.
var errNoRoute = errors.New("no route left")

// noRouteError is the error of a call that found no route it could use
// before making any call: all open, or all out of service.
func (r *Router) noRouteError() error {
	for _, x := range r.routes {
		if e := x.out.Load(); e == nil {
			return &llm.Error{Class: llm.ClassServer, Message: "every provider's circuit breaker is open after repeated failures; not sent"}
		}
	}
	return r.routes[0].out.Load()
}

// Refused returns the error with which every route refused for good
// (insufficient quota, bad credentials), or nil while one still takes
// calls: until an operator acts, no call of this process can succeed, and
// the generator fails the rows it has not sent yet instead of calling.
func (r *Router) Refused() *llm.Error {
	if !r.allOut() {
		return nil
	}
	return r.routes[0].out.Load()
}

func (r *Router) allOut() bool {
	for _, x := range r.routes {
		if x.out.Load() == nil {
			return false
		}
	}
	return true
}

// usable reports whether x may take a new call now.
func (x *route) usable() bool {
	if x.out.Load() != nil {
		return false
	}
	return x.cb == nil || x.cb.State() != gobreaker.StateOpen
}

// candidates are the routes a call may go to next: not tried for it and
// usable; the standbys (weight 0) only when no other is left.
func (r *Router) candidates(tried []bool) []*route {
	var main, standby []*route
	for i, x := range r.routes {
		if tried[i] || !x.usable() {
			continue
		}
		if x.Weight == 0 && len(r.routes) > 1 {
			standby = append(standby, x)
		} else {
			main = append(main, x)
		}
	}
	if len(main) > 0 {
		return main
	}
	return standby
}

// acquire takes a slot on the route the mode prefers among the candidates
// that have one free, or waits for the first slot to free up. It returns
// errNoRoute when there is no candidate, or start's error.
func (r *Router) acquire(start context.Context, tried []bool) (*route, error) {
	for {
		free := *r.slotFree.Load()
		cands := r.candidates(tried)
		if len(cands) == 0 {
			return nil, errNoRoute
		}
		if x := r.pick(cands); x != nil {
			return x, nil
		}
		// Every candidate is full: wait for a release anywhere (or for a
		// breaker to half-open), then choose again.
		cases := []reflect.SelectCase{
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(start.Done())},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(free)},
		}
		if chosen, _, _ := reflect.Select(cases); chosen == 0 {
			return nil, start.Err()
		}
	}
}

// pick takes a free slot on one of cands, by the routing mode, or returns
// nil if all are full.
func (r *Router) pick(cands []*route) *route {
	if r.cfg.Mode == RouteWeighted && len(cands) > 1 {
		// Draw without replacement by weight until one has a free slot.
		left := append([]*route(nil), cands...)
		for len(left) > 0 {
			total := 0
			for _, x := range left {
				total += max(x.Weight, 1)
			}
			n := rand.IntN(total)
			i := 0
			for ; i < len(left)-1; i++ {
				n -= max(left[i].Weight, 1)
				if n < 0 {
					break
				}
			}
			if left[i].tryAcquire() {
				return left[i]
			}
			left = append(left[:i], left[i+1:]...)
		}
		return nil
	}
	for _, x := range cands {
		if x.tryAcquire() {
			return x
		}
	}
	return nil
}

func (x *route) tryAcquire() bool {
	if x.sem == nil {
		return true
	}
	select {
	case x.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (r *Router) release(x *route) {
	if x.sem == nil {
		return
	}
	<-x.sem
	ch := make(chan struct{})
	old := r.slotFree.Swap(&ch)
	close(*old)
}

// call makes one call on x, holding one of its slots: the quota wait (under
// start), the breaker's permission, then the call under ctx and x.Timeout.
func (r *Router) call(ctx, start context.Context, mayStart func() bool, x *route, req llm.Request, spend *budget) (RoutedResponse, error) {
	if x.Model != "" {
		req.Model = x.Model
	}
	charged := llm.EstimateRequestTokens(req)
	if x.Limiter != nil {
		waitStart := time.Now()
		err := x.Limiter.Wait(start, charged)
		if r.cfg.OnQuotaWait != nil {
			r.cfg.OnQuotaWait(x.Name, time.Since(waitStart))
		}
		switch {
		case err != nil && start.Err() == nil:
			// The limiter failed on its own (its store): not starvation.
			return RoutedResponse{}, fmt.Errorf("%w: quota limiter: %w", errNotStarted, err)
		case err != nil || !mayStart():
			return RoutedResponse{}, fmt.Errorf("%w: %w", errNotStarted, errStarved)
		}
	}
	if !mayStart() {
		return RoutedResponse{}, fmt.Errorf("%w: %w", errNotStarted, cmp.Or(start.Err(), context.Canceled))
	}
	// The task's cap, held right before the call, at the price of the
	// route that makes it.
	label := x.Name
	if x.anonymous {
		label = ""
	}
	held := 0.0
	settle := func(llm.Usage) {}
	if spend != nil {
		h, err := spend.hold(ctx, label, req)
		if err != nil {
			return RoutedResponse{}, fmt.Errorf("%w: %w", errNotStarted, err)
		}
		held = h
		settle = func(u llm.Usage) { spend.settle(label, req, held, u) }
	}
	done := func(error) {}
	if x.cb != nil {
		d, err := x.cb.Allow()
		if err != nil {
			settle(llm.Usage{})
			return RoutedResponse{}, err
		}
		done = d
	}
	callCtx, cancel := context.WithTimeout(ctx, x.Timeout)
	defer cancel()
	began := time.Now()
	resp, err := x.Provider.Generate(callCtx, req)
	latency := time.Since(began)
	if err != nil && ctx.Err() == nil && callCtx.Err() != nil && !errors.As(err, new(*llm.Error)) {
		// The route's own timeout, whatever the provider made of it.
		err = &llm.Error{Class: llm.ClassTimeout, Message: fmt.Sprintf("no answer from provider %s within %v", x.Name, x.Timeout), Err: err}
	}
	if err != nil && ctx.Err() != nil {
		err = errors.Join(err, context.Canceled)
	}
	done(err)
	if err == nil {
		settle(resp.Usage)
	} else {
		settle(llm.Usage{}) // a failed call is not billed
	}
	if x.Limiter != nil {
		// The route's limiter learns from its own answers only.
		if err == nil {
			x.Limiter.Observe(resp.RateLimits)
			used := -1
			if resp.Usage.InputTokens+resp.Usage.OutputTokens > 0 {
				used = resp.Usage.InputTokens + resp.Usage.OutputTokens
			}
			x.Limiter.Settle(charged, used)
		} else if e := llm.Classify(err); e.Class == llm.ClassRateLimited {
			x.Limiter.Observe(e.RateLimits)
			x.Limiter.Penalize(e.RetryAfter)
		}
	}
	if err != nil {
		return RoutedResponse{Latency: latency}, err
	}
	if !x.anonymous {
		resp.Provider = x.Name
	}
	return RoutedResponse{Response: resp, Route: x.Name, Latency: latency}, nil
}
