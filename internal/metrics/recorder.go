package metrics

import (
	"fmt"
	"slices"
	"strings"
)

// Recorder is the metrics port of the core: the pipeline records what
// happens through it, and each runtime supplies an adapter (Counter, which
// writes EMF lines on Lambda; prom.Registry, which serves Prometheus'
// /metrics in the embedded runtime). name is one of the Catalog's names;
// labels are key, value pairs of the Def's Labels (missing ones are empty).
// Implementations must be safe for concurrent use and never block.
type Recorder interface {
	// Add adds v to a counter.
	Add(name string, v float64, labels ...string)
	// Observe records one value of a distribution (a latency, a duration)
	// in the Def's Unit.
	Observe(name string, v float64, labels ...string)
	// Set sets a gauge.
	Set(name string, v float64, labels ...string)
}

// Nop records nothing: the default of a use case given no Recorder.
type Nop struct{}

// Add does nothing.
func (Nop) Add(string, float64, ...string) {}

// Observe does nothing.
func (Nop) Observe(string, float64, ...string) {}

// Set does nothing.
func (Nop) Set(string, float64, ...string) {}

// Or returns r, or Nop when r is nil.
func Or(r Recorder) Recorder {
	if r == nil {
		return Nop{}
	}
	return r
}

// Kind is how a metric aggregates.
type Kind int

// Kinds of metric.
const (
	KindCounter Kind = iota
	KindHistogram
	KindGauge
)

// Def describes one metric for every adapter: its EMF name (Name, the
// CloudWatch metric the alarms and the dashboard read), its Prometheus
// family (Prom; several Defs may share a family, told apart by Const
// labels), its unit and its labels.
type Def struct {
	Name string
	Kind Kind
	Unit Unit
	// Prom is the Prometheus metric family; a Milliseconds unit is exported
	// in seconds there, as Prometheus names it.
	Prom string
	// Const labels are fixed for this Def within its Prom family.
	Const map[string]string
	// Labels are the labels a caller gives. EMF sums over them (its one
	// dimension is the stack), Prometheus keeps them.
	Labels []string
	// Buckets are a histogram's upper bounds in the Prometheus unit
	// (seconds); nil takes latency buckets.
	Buckets []float64
	Help    string
}

// More metric names (see the first const block for the older ones).
const (
	// Seconds is a CloudWatch unit.
	Seconds Unit = "Seconds"

	// ModelCallLatency is the duration of each model call, in milliseconds.
	ModelCallLatency = "ModelCallLatency"
	// InputTokens and OutputTokens count the tokens the provider reported.
	InputTokens  = "InputTokens"
	OutputTokens = "OutputTokens"
	// QueueDepth is how many messages wait in the work queue; QueueOldestAge
	// how long, in seconds, the oldest has waited. On AWS they are SQS's own
	// ApproximateNumberOfMessagesVisible and ApproximateAgeOfOldestMessage.
	QueueDepth     = "QueueDepth"
	QueueOldestAge = "QueueOldestAge"
	// ClaimsLost counts claims that lost the race for a batch to another
	// worker (the message is acknowledged; the winner does the work).
	ClaimsLost = "ClaimsLost"
	// LeasesExpired counts batches whose worker's lease ran out: found by
	// the sweeper, or noticed by the worker itself when a newer claim took
	// the batch over.
	LeasesExpired = "LeasesExpired"
	// ExportDuration is how long writing one result workbook took, in
	// milliseconds.
	ExportDuration = "ExportDuration"
	// TaskDuration is the time from a task's creation to its export, in
	// seconds, labelled by its final state.
	TaskDuration = "TaskDuration"
	// BreakerTransitions counts a provider's circuit breaker changing
	// state, labelled by provider and the state entered (open, half-open,
	// closed): an open breaker means rows go to the other providers.
	BreakerTransitions = "BreakerTransitions"
)

// latencyBuckets cover a model call: 50 ms to about 100 s.
var latencyBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120}

// taskBuckets cover a whole task: 1 s to about 4.5 h.
var taskBuckets = []float64{1, 5, 15, 30, 60, 150, 300, 600, 1800, 3600, 7200, 16200}

// Catalog is every metric batchgen records. Adapters build their series
// from it; the Grafana dashboard may query only these (a test checks).
var Catalog = []Def{
	{Name: RowsSucceeded, Prom: "batchgen_rows_total", Const: map[string]string{"outcome": "succeeded"}, Labels: []string{"error_class"}, Help: "Rows that reached a final state, by outcome and error class (cached rows included)."},
	{Name: RowsFailed, Prom: "batchgen_rows_total", Const: map[string]string{"outcome": "failed"}, Labels: []string{"error_class"}, Help: "Rows that reached a final state, by outcome and error class (cached rows included)."},
	{Name: RowsCached, Prom: "batchgen_cache_hits_total", Help: "Rows answered from the result cache."},
	{Name: ModelCalls, Prom: "batchgen_model_calls_total", Labels: []string{"provider", "error_class"}, Help: "Calls sent to the model provider, by provider and error class (empty: success)."},
	{Name: RateLimited, Prom: "batchgen_rate_limited_total", Labels: []string{"provider"}, Help: "Model calls the provider answered 429 (rate limited)."},
	{Name: ModelCallLatency, Kind: KindHistogram, Unit: Milliseconds, Prom: "batchgen_model_call_duration_seconds", Labels: []string{"provider"}, Help: "Duration of each model call."},
	{Name: InputTokens, Prom: "batchgen_tokens_total", Const: map[string]string{"kind": "input"}, Labels: []string{"provider"}, Help: "Tokens the provider reported, by kind."},
	{Name: OutputTokens, Prom: "batchgen_tokens_total", Const: map[string]string{"kind": "output"}, Labels: []string{"provider"}, Help: "Tokens the provider reported, by kind."},
	{Name: QueueDepth, Kind: KindGauge, Prom: "batchgen_queue_depth", Help: "Messages waiting in the work queue (visible or delayed)."},
	{Name: QueueOldestAge, Kind: KindGauge, Unit: Seconds, Prom: "batchgen_queue_oldest_age_seconds", Help: "Age of the oldest message in the work queue."},
	{Name: ClaimsLost, Prom: "batchgen_claims_lost_total", Help: "Claims that lost a batch to another worker."},
	{Name: LeasesExpired, Prom: "batchgen_leases_expired_total", Help: "Batches whose worker's lease expired."},
	{Name: SweeperRequeued, Prom: "batchgen_sweeper_actions_total", Const: map[string]string{"action": "requeued"}, Help: "What the sweeper did, by action."},
	{Name: SweeperLeasesReset, Prom: "batchgen_sweeper_actions_total", Const: map[string]string{"action": "lease_reset"}, Help: "What the sweeper did, by action."},
	{Name: SweeperExportsStarted, Prom: "batchgen_sweeper_actions_total", Const: map[string]string{"action": "export_started"}, Help: "What the sweeper did, by action."},
	{Name: PoisonMessages, Prom: "batchgen_dead_letters_total", Help: "Messages left to be dead-lettered: they can never be processed."},
	{Name: BatchesReleased, Prom: "batchgen_batches_released_total", Help: "Batches handed back for a later delivery."},
	{Name: MessagesFailed, Prom: "batchgen_messages_failed_total", Help: "Messages whose handling failed (transient or poison)."},
	{Name: TasksSplit, Prom: "batchgen_tasks_split_total", Help: "Inputs accepted and split into batches."},
	{Name: TasksRejected, Prom: "batchgen_tasks_rejected_total", Help: "Inputs refused (bad sheet, bad template, too big)."},
	{Name: TasksExported, Prom: "batchgen_tasks_exported_total", Help: "Result workbooks written."},
	{Name: ExportDuration, Kind: KindHistogram, Unit: Milliseconds, Prom: "batchgen_export_duration_seconds", Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300}, Help: "Duration of writing one result workbook."},
	{Name: TaskDuration, Kind: KindHistogram, Unit: Seconds, Prom: "batchgen_task_duration_seconds", Labels: []string{"state"}, Buckets: taskBuckets, Help: "Time from a task's creation to its export, by final state."},
	{Name: BreakerTransitions, Prom: "batchgen_breaker_transitions_total", Labels: []string{"provider", "state"}, Help: "Circuit breaker state changes of a provider, by the state entered."},
}

// Lookup returns the Def called name.
func Lookup(name string) (Def, bool) {
	i := slices.IndexFunc(Catalog, func(d Def) bool { return d.Name == name })
	if i < 0 {
		return Def{}, false
	}
	return Catalog[i], true
}

// BucketsOrDefault are d's histogram buckets.
func (d Def) BucketsOrDefault() []float64 {
	if d.Buckets != nil {
		return d.Buckets
	}
	return latencyBuckets
}

// LabelNames are the Prometheus label names of d: its Const keys, then its
// Labels, each sorted.
func (d Def) LabelNames() []string {
	names := make([]string, 0, len(d.Const)+len(d.Labels))
	for k := range d.Const {
		names = append(names, k)
	}
	slices.Sort(names)
	return append(names, d.Labels...)
}

// CheckCatalog reports Defs that cannot live together: a name given twice,
// or Defs of one Prometheus family that disagree on kind, unit or labels.
func CheckCatalog(defs []Def) error {
	var problems []string
	names := map[string]bool{}
	families := map[string]Def{}
	for _, d := range defs {
		if names[d.Name] {
			problems = append(problems, fmt.Sprintf("%s is defined twice", d.Name))
		}
		names[d.Name] = true
		if !strings.HasPrefix(d.Prom, "batchgen_") {
			problems = append(problems, fmt.Sprintf("%s: Prometheus name %q lacks the batchgen_ prefix", d.Name, d.Prom))
		}
		if f, ok := families[d.Prom]; ok {
			if f.Kind != d.Kind || f.Unit != d.Unit || !slices.Equal(f.LabelNames(), d.LabelNames()) || f.Help != d.Help {
				problems = append(problems, fmt.Sprintf("%s and %s share %s but differ in kind, unit, labels or help", f.Name, d.Name, d.Prom))
			}
			continue
		}
		families[d.Prom] = d
	}
	if len(problems) > 0 {
		return fmt.Errorf("metrics catalog: %s", strings.Join(problems, "; "))
	}
	return nil
}

// labelValue returns the value of key in key, value pairs, or "".
func labelValue(labels []string, key string) string {
	for i := 0; i+1 < len(labels); i += 2 {
		if labels[i] == key {
			return labels[i+1]
		}
	}
	return ""
}

// LabelValues returns d's label values, in LabelNames order, from the
// caller's key, value pairs.
func (d Def) LabelValues(labels []string) []string {
	names := d.LabelNames()
	out := make([]string, len(names))
	for i, n := range names {
		if v, ok := d.Const[n]; ok {
			out[i] = v
		} else {
			out[i] = labelValue(labels, n)
		}
	}
	return out
}
