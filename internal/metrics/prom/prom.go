// Package prom is the Prometheus adapter of the metrics port: a registry
// holding every metric of metrics.Catalog, and the http.Handler that
// `batchgen serve` mounts at /metrics. It lives apart from package metrics
// so that the Lambda functions, which report through EMF, never link the
// Prometheus client.
package prom

import (
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/batchgen/batchgen/internal/metrics"
)

// Registry records batchgen's metrics for Prometheus. The zero value is not
// usable; call New.
type Registry struct {
	reg        *prometheus.Registry
	counters   map[string]*prometheus.CounterVec
	histograms map[string]*prometheus.HistogramVec
	gauges     map[string]*prometheus.GaugeVec
	defs       map[string]metrics.Def
	log        *slog.Logger
}

var _ metrics.Recorder = (*Registry)(nil)

// New returns a Registry with every metric of metrics.Catalog registered
// (series appear once recorded), plus the Go runtime and process
// collectors. Unknown names given to its methods are reported to log (nil:
// discarded) and otherwise ignored: a metric is never worth a failed row.
func New(log *slog.Logger) *Registry {
	if err := metrics.CheckCatalog(metrics.Catalog); err != nil {
		panic("prom.New: " + err.Error()) // a programming error, caught by the package tests
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{
		reg:        prometheus.NewRegistry(),
		counters:   map[string]*prometheus.CounterVec{},
		histograms: map[string]*prometheus.HistogramVec{},
		gauges:     map[string]*prometheus.GaugeVec{},
		defs:       map[string]metrics.Def{},
		log:        log,
	}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, d := range metrics.Catalog {
		r.defs[d.Name] = d
		labels := d.LabelNames()
		switch d.Kind {
		case metrics.KindCounter:
			if _, ok := r.counters[d.Prom]; !ok {
				r.counters[d.Prom] = prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.Prom, Help: d.Help}, labels)
				r.reg.MustRegister(r.counters[d.Prom])
			}
		case metrics.KindHistogram:
			if _, ok := r.histograms[d.Prom]; !ok {
				r.histograms[d.Prom] = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: d.Prom, Help: d.Help, Buckets: d.BucketsOrDefault()}, labels)
				r.reg.MustRegister(r.histograms[d.Prom])
			}
		case metrics.KindGauge:
			if _, ok := r.gauges[d.Prom]; !ok {
				r.gauges[d.Prom] = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: d.Prom, Help: d.Help}, labels)
				r.reg.MustRegister(r.gauges[d.Prom])
			}
		}
		if len(d.Labels) == 0 {
			// A series without caller labels exists from the start, so a
			// quiet counter reads 0 rather than missing.
			switch d.Kind {
			case metrics.KindCounter:
				r.counters[d.Prom].WithLabelValues(d.LabelValues(nil)...)
			case metrics.KindHistogram:
				r.histograms[d.Prom].WithLabelValues(d.LabelValues(nil)...)
			case metrics.KindGauge:
				r.gauges[d.Prom].WithLabelValues(d.LabelValues(nil)...)
			}
		}
	}
	return r
}

// Gatherer is the underlying registry, for tests and for other collectors.
func (r *Registry) Gatherer() prometheus.Gatherer { return r.reg }

// Handler serves the registry in the Prometheus exposition format: what
// `batchgen serve` mounts at /metrics.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg})
}

func (r *Registry) def(name string, kind metrics.Kind) (metrics.Def, bool) {
	d, ok := r.defs[name]
	if !ok || d.Kind != kind {
		r.log.Warn("metric not in the catalog; not recorded", "metric", name)
		return metrics.Def{}, false
	}
	return d, true
}

// toProm converts v from d's unit to Prometheus' base unit.
func toProm(d metrics.Def, v float64) float64 {
	if d.Unit == metrics.Milliseconds {
		return v / 1000
	}
	return v
}

// Add adds v to the counter name.
func (r *Registry) Add(name string, v float64, labels ...string) {
	if d, ok := r.def(name, metrics.KindCounter); ok && v >= 0 {
		r.counters[d.Prom].WithLabelValues(d.LabelValues(labels)...).Add(v)
	}
}

// Observe records v in the histogram name.
func (r *Registry) Observe(name string, v float64, labels ...string) {
	if d, ok := r.def(name, metrics.KindHistogram); ok {
		r.histograms[d.Prom].WithLabelValues(d.LabelValues(labels)...).Observe(toProm(d, v))
	}
}

// Set sets the gauge name.
func (r *Registry) Set(name string, v float64, labels ...string) {
	if d, ok := r.def(name, metrics.KindGauge); ok {
		r.gauges[d.Prom].WithLabelValues(d.LabelValues(labels)...).Set(toProm(d, v))
	}
}
