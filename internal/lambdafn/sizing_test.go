package lambdafn_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/lambdafn/generatorfn"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// accountConcurrency is a new account's Lambda concurrency in a region, and
// unreservedConcurrency what Lambda keeps out of reserved concurrency.
const accountConcurrency, unreservedConcurrency = 1000, 100

// sqsNoisyInFlight is how many of its messages a tenant of an SQS fair
// queue must have in flight before SQS can take it for a noisy neighbour
// by its share of the messages in flight (the SQS Developer Guide, "How
// Amazon SQS fair queues work").
const sqsNoisyInFlight = 30

// TestGeneratorSizing checks the arithmetic behind the generator's settings
// in template.yaml (see its BatchgenSizing metadata and the README): the
// queue outlives an invocation, an invocation's work fits its time budget
// at the expected latency and at its share of the quota, and the number of
// instances is what keeps the quota busy.
func TestGeneratorSizing(t *testing.T) {
	t.Parallel()
	doc := loadTemplate(t)
	get := func(path ...string) any {
		t.Helper()
		var v any = doc
		for _, k := range path {
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("template.yaml: %v: no mapping at %q", path, k)
			}
			v = m[k]
		}
		return v
	}
	num := func(path ...string) float64 {
		t.Helper()
		switch v := get(path...).(type) {
		case int:
			return float64(v)
		case float64:
			return v
		case string:
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
		t.Fatalf("template.yaml: %v = %v, want a number", path, get(path...))
		return 0
	}
	gen := []string{"Resources", "GeneratorFunction", "Properties"}
	at := func(extra ...string) []string { return append(append([]string{}, gen...), extra...) }

	timeout := num(at("Timeout")...)
	visibility := num("Resources", "WorkQueue", "Properties", "VisibilityTimeout")
	messages := num(at("Events", "Work", "Properties", "BatchSize")...)
	rowsPerBatch := num("Parameters", "BatchSize", "Default")
	quotaRPM := num("Parameters", "QuotaRpm", "Default")
	instances := num("Parameters", "MaxConcurrency", "Default")
	latency := num("Metadata", "BatchgenSizing", "ExpectedLatencySeconds")
	perInstance := num("Metadata", "BatchgenSizing", "GeneratorConcurrency")
	if env := num(at("Environment", "Variables", "GENERATOR_CONCURRENCY")...); env != perInstance {
		t.Errorf("GENERATOR_CONCURRENCY %v, BatchgenSizing.GeneratorConcurrency %v: must agree", env, perInstance)
	}
	if ref := get(at("Events", "Work", "Properties", "ScalingConfig", "MaximumConcurrency")...); fmt.Sprint(ref) != fmt.Sprint(map[string]any{"!Ref": "MaxConcurrency"}) {
		t.Errorf("ScalingConfig.MaximumConcurrency = %v, want !Ref MaxConcurrency", ref)
	}

	// AWS: a queue feeding Lambda needs a visibility timeout of at least
	// six times the function's timeout.
	if visibility < 6*timeout {
		t.Errorf("WorkQueue VisibilityTimeout %vs < 6 x generator Timeout %vs", visibility, timeout)
	}
	// Rows start only until a call's timeout and the settling remain.
	budget := timeout - (pipeline.DefaultCallTimeout + generatorfn.DefaultHeadroom).Seconds()
	rows := messages * rowsPerBatch
	if work := rows / perInstance * latency; work > budget {
		t.Errorf("an invocation's %v rows at %v in flight and %vs each take %vs, over its %vs budget", rows, perInstance, latency, work, budget)
	}
	share := quotaRPM / 60 / instances // calls per second each instance may make
	if work := rows / share; work > budget {
		t.Errorf("an invocation's %v rows at its quota share of %.2f/s take %.0fs, over its %vs budget", rows, share, work, budget)
	}
	if want := math.Ceil(quotaRPM / 60 * latency / perInstance); instances != want {
		t.Errorf("MaxConcurrency default %v, want ceil(QuotaRpm %v / 60 x latency %vs / %v in flight) = %v", instances, quotaRPM, latency, perInstance, want)
	}
	// Batch messages carry their principal as MessageGroupId, which makes
	// the work queue an SQS fair queue: SQS takes a tenant for a noisy
	// neighbour, and delivers the others' messages first, once it holds
	// more than 10% of the messages in flight and at least 30 of its own,
	// or more than 10% of the consumers' processing time. One principal's
	// backlog can fill every instance; for the first measure to see it,
	// the instances must hold 30 messages between them.
	if inFlight := instances * messages; inFlight < sqsNoisyInFlight {
		t.Errorf("MaxConcurrency %v x %v messages an invocation = %v messages in flight, under the %d an SQS fair queue needs to see one tenant's backlog by its in-flight share", instances, messages, inFlight, sqsNoisyInFlight)
	}
	// The events function's reserved concurrency bounds the open streams,
	// so viewers cannot take the generators' concurrency; it is taken out
	// of the account's (1,000 by default, of which Lambda keeps 100
	// unreserved), and the generators' instances must still fit beside it.
	events := num("Parameters", "EventsConcurrency", "Default")
	if ref := get("Resources", "EventsFunction", "Properties", "ReservedConcurrentExecutions"); fmt.Sprint(ref) != fmt.Sprint(map[string]any{"!Ref": "EventsConcurrency"}) {
		t.Errorf("EventsFunction ReservedConcurrentExecutions = %v, want !Ref EventsConcurrency", ref)
	}
	if events+instances > accountConcurrency-unreservedConcurrency {
		t.Errorf("EventsConcurrency %v + MaxConcurrency %v generators exceed the %d a default account can give beside the %d Lambda keeps unreserved",
			events, instances, accountConcurrency-unreservedConcurrency, unreservedConcurrency)
	}
	if lease := time.Duration(num("Parameters", "LeaseSeconds", "MinValue")) * time.Second; lease <= time.Duration(timeout)*time.Second {
		t.Errorf("LeaseSeconds MinValue %v must exceed the generator Timeout %vs", lease, timeout)
	}
}
