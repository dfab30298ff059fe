// Package metrics writes CloudWatch Embedded Metric Format (EMF) lines: JSON
// log lines that CloudWatch Logs turns into metrics, so a Lambda reports
// counts by printing to stdout instead of calling PutMetricData (no extra
// permission, no extra latency, no lost metrics when the call would fail).
//
// Every metric is written in namespace "batchgen" with one dimension, the
// stack's name (StackDimension), so two stacks in one account and region
// never add up in one metric; the template's alarms and dashboard query
// that dimension (for example the FailedRowsAlarm on RowsFailed). Without a
// stack name (local runs) the dimension set is empty. Extra fields such as
// the function name go into the line as properties: searchable in Logs
// Insights, but not dimensions, so they never split a metric the alarms
// read.
package metrics

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"

	"github.com/batchgen/batchgen/internal/clock"
)

// Namespace is the CloudWatch namespace of every batchgen metric.
const Namespace = "batchgen"

// StackDimension is the dimension naming the stack that wrote a metric. An
// Emitter whose properties set it (to the function's STACK_NAME) publishes
// every metric with it as the one dimension.
const StackDimension = "Stack"

// Metric names. The generator reports the row and call counts, the queue
// handlers the message counts, the sweeper its compensation counts.
const (
	// RowsSucceeded counts rows that got an output (cached ones included).
	RowsSucceeded = "RowsSucceeded"
	// RowsFailed counts rows that failed permanently; FailedRowsAlarm
	// watches it.
	RowsFailed = "RowsFailed"
	// RowsCached counts rows answered from the result cache.
	RowsCached = "RowsCached"
	// ModelCalls counts calls sent to the provider.
	ModelCalls = "ModelCalls"
	// RateLimited counts calls the provider answered 429.
	RateLimited = "RateLimited"
	// BatchesReleased counts batches handed back for a later delivery
	// (retryable failures or the invocation running out of time).
	BatchesReleased = "BatchesReleased"
	// MessagesFailed counts messages reported as batch item failures
	// because handling them failed (transient or poison).
	MessagesFailed = "MessagesFailed"
	// PoisonMessages counts messages that can never be processed; after
	// the queue's maximum receive count they are dead-lettered.
	PoisonMessages = "PoisonMessages"
	// TasksSplit counts inputs accepted and split into batches.
	TasksSplit = "TasksSplit"
	// TasksRejected counts inputs refused (bad sheet, bad template, too big).
	TasksRejected = "TasksRejected"
	// TasksExported counts result workbooks written.
	TasksExported = "TasksExported"
	// SweeperRequeued counts PENDING batches the sweeper enqueued again
	// because their message was lost or late.
	SweeperRequeued = "SweeperRequeued"
	// SweeperLeasesReset counts RUNNING batches whose worker died, reset
	// and enqueued again by the sweeper.
	SweeperLeasesReset = "SweeperLeasesReset"
	// SweeperExportsStarted counts exports the sweeper started.
	SweeperExportsStarted = "SweeperExportsStarted"
)

// Unit is a CloudWatch metric unit.
type Unit string

// Units used by batchgen.
const (
	Count        Unit = "Count"
	Milliseconds Unit = "Milliseconds"
)

// Value is one metric value in a line.
type Value struct {
	Name  string
	Unit  Unit
	Value float64
	// Values, when non-empty, replaces Value with up to MaxValues values
	// of a distribution (CloudWatch computes its statistics from them).
	Values []float64
}

// MaxValues is how many values one metric may carry in one EMF line.
const MaxValues = 100

// Emitter writes EMF lines to an io.Writer (os.Stdout in Lambda). It is
// safe for concurrent use; each line is one Write call.
type Emitter struct {
	w   io.Writer
	clk clock.Clock
	// props are added to every line (e.g. {"function": "generator"}).
	props map[string]string
	mu    sync.Mutex
}

// New returns an Emitter writing to w, stamping lines with clk's time, and
// adding props to every line. A nil clk means clock.Real.
func New(w io.Writer, clk clock.Clock, props map[string]string) *Emitter {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Emitter{w: w, clk: clk, props: maps.Clone(props)}
}

// reserved are top-level keys EMF or the line itself uses.
var reserved = map[string]bool{"_aws": true}

// Emit writes one line holding values, plus the Emitter's and the call's
// properties. Values are listed in name order so lines are reproducible.
// A property may not share a metric's name: CloudWatch would read it as the
// metric's value.
func (e *Emitter) Emit(values []Value, props map[string]string) error {
	if len(values) == 0 {
		return nil
	}
	line := map[string]any{}
	all := maps.Clone(e.props)
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, props)
	for k, v := range all {
		if reserved[k] {
			return fmt.Errorf("emit metrics: property %q is reserved", k)
		}
		line[k] = v
	}
	dims := []string{}
	if all[StackDimension] != "" {
		dims = []string{StackDimension}
	}
	sorted := slices.Clone(values)
	slices.SortFunc(sorted, func(a, b Value) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	defs := make([]metricDef, 0, len(sorted))
	for i, v := range sorted {
		if v.Name == "" {
			return errors.New("emit metrics: empty metric name")
		}
		if i > 0 && sorted[i-1].Name == v.Name {
			return fmt.Errorf("emit metrics: metric %q given twice", v.Name)
		}
		if _, clash := all[v.Name]; clash || reserved[v.Name] {
			return fmt.Errorf("emit metrics: metric %q clashes with a property", v.Name)
		}
		unit := v.Unit
		if unit == "" {
			unit = Count
		}
		defs = append(defs, metricDef{Name: v.Name, Unit: unit})
		if len(v.Values) > MaxValues {
			return fmt.Errorf("emit metrics: metric %q has %d values; at most %d fit a line", v.Name, len(v.Values), MaxValues)
		}
		if len(v.Values) > 0 {
			line[v.Name] = v.Values
		} else {
			line[v.Name] = v.Value
		}
	}
	line["_aws"] = awsMeta{
		Timestamp: e.clk.Now().UnixMilli(),
		CloudWatchMetrics: []directive{{
			Namespace: Namespace,
			// One dimension set: the stack, which is what the alarms
			// and the dashboard query.
			Dimensions: [][]string{dims},
			Metrics:    defs,
		}},
	}
	b, err := json.Marshal(line)
	if err != nil {
		return fmt.Errorf("emit metrics: encode: %w", err)
	}
	b = append(b, '\n')
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.w.Write(b); err != nil {
		return fmt.Errorf("emit metrics: write: %w", err)
	}
	return nil
}

type awsMeta struct {
	Timestamp         int64       `json:"Timestamp"`
	CloudWatchMetrics []directive `json:"CloudWatchMetrics"`
}

type directive struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []metricDef `json:"Metrics"`
}

type metricDef struct {
	Name string `json:"Name"`
	Unit Unit   `json:"Unit"`
}

// Counter accumulates the metrics of one invocation and writes them when
// flushed, so a busy generator prints one metrics line per invocation
// rather than one per row. It is the Recorder of the Lambda runtime: labels
// are dropped (the stack is the one dimension), distributions are kept as
// values. It is safe for concurrent use.
type Counter struct {
	mu sync.Mutex
	// names are always reported, zeros included, so dashboards show a
	// quiet period as 0 rather than as missing data.
	names  []string
	counts map[string]float64
	values map[string][]float64
	gauges map[string]float64
}

var _ Recorder = (*Counter)(nil)

// NewCounter returns a Counter that always reports names.
func NewCounter(names ...string) *Counter {
	c := &Counter{names: slices.Clone(names)}
	c.reset()
	return c
}

func (c *Counter) reset() {
	c.counts, c.values, c.gauges = map[string]float64{}, map[string][]float64{}, map[string]float64{}
	for _, n := range c.names {
		c.counts[n] = 0
	}
}

// Add adds n to the count called name, which need not be one of the names
// given to NewCounter. Labels are dropped.
func (c *Counter) Add(name string, n float64, _ ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[name] += n
}

// Observe keeps v as one value of the distribution called name.
func (c *Counter) Observe(name string, v float64, _ ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.values[name] = append(c.values[name], v)
}

// Set keeps v as the latest value of the gauge called name.
func (c *Counter) Set(name string, v float64, _ ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gauges[name] = v
}

// Snapshot returns the current counts.
func (c *Counter) Snapshot() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// Flush writes the counts, gauges and distributions through e and resets
// them. A distribution of more than MaxValues values continues on further
// lines. Everything is reset even if a write fails: a metric lost is
// better than one counted twice.
func (c *Counter) Flush(e *Emitter, props map[string]string) error {
	c.mu.Lock()
	counts, values, gauges := c.counts, c.values, c.gauges
	c.reset()
	c.mu.Unlock()
	unit := func(name string) Unit {
		if d, ok := Lookup(name); ok && d.Unit != "" {
			return d.Unit
		}
		return Count
	}
	line := make([]Value, 0, len(counts)+len(gauges)+len(values))
	for name, n := range counts {
		line = append(line, Value{Name: name, Unit: unit(name), Value: n})
	}
	for name, v := range gauges {
		line = append(line, Value{Name: name, Unit: unit(name), Value: v})
	}
	var errs []error
	for len(values) > 0 {
		for name, vs := range values {
			n := min(len(vs), MaxValues)
			line = append(line, Value{Name: name, Unit: unit(name), Values: vs[:n]})
			if n == len(vs) {
				delete(values, name)
			} else {
				values[name] = vs[n:]
			}
		}
		errs = append(errs, e.Emit(line, props))
		line = line[:0]
	}
	if len(line) > 0 {
		errs = append(errs, e.Emit(line, props))
	}
	return errors.Join(errs...)
}
