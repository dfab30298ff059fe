package pipeline

import (
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/store"
)

// recordCall records one model call: its count by provider and error
// class, its latency, a 429, and the tokens the provider reported. A call
// cut short by shutdown (aborted) counts as a call but not as a latency.
func (g *Generator) recordCall(provider string, latency time.Duration, resp llm.Response, err error, aborted bool) {
	m := g.cfg.Metrics
	class := ""
	if err != nil {
		class = string(llm.Classify(err).Class)
	}
	m.Add(metrics.ModelCalls, 1, "provider", provider, "error_class", class)
	if aborted {
		return
	}
	m.Observe(metrics.ModelCallLatency, float64(latency.Microseconds())/1000, "provider", provider)
	if class == string(llm.ClassRateLimited) {
		m.Add(metrics.RateLimited, 1, "provider", provider)
	}
	if err == nil {
		m.Add(metrics.InputTokens, float64(resp.Usage.InputTokens), "provider", provider)
		m.Add(metrics.OutputTokens, float64(resp.Usage.OutputTokens), "provider", provider)
	}
}

// recordRow records a row that reached a final state (once its result is
// saved), by outcome and error class, and a cache hit.
func recordRow(m metrics.Recorder, e Event) {
	switch e.State {
	case store.RowSucceeded:
		m.Add(metrics.RowsSucceeded, 1)
		if e.Cached {
			m.Add(metrics.RowsCached, 1)
		}
	case store.RowFailed:
		m.Add(metrics.RowsFailed, 1, "error_class", e.ErrorClass)
	}
}

// RecordSettlement counts what became of a processed message; every
// runtime that settles messages calls it.
func RecordSettlement(m metrics.Recorder, s Settlement) {
	switch {
	case s.Action == SettleDeadLetter:
		m.Add(metrics.MessagesFailed, 1)
		m.Add(metrics.PoisonMessages, 1)
	case s.Err != nil:
		m.Add(metrics.MessagesFailed, 1)
	case s.Action == SettleRetry, s.Action == SettleResend:
		m.Add(metrics.BatchesReleased, 1)
	}
}
