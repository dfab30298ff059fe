package report

import (
	"fmt"
	"time"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// QuotePlans are what a quote says of economy and auto: whether the
// providers sell a batch API (Batch), and the deadline of auto (0 for
// none).
type QuotePlans struct {
	Batch    bool
	Deadline time.Duration
}

// QuoteText words q (batchgen quote) for people.
func QuoteText(taskID, source string, q pipeline.Quote, plans QuotePlans) string {
	usd := func(v float64) string { return pricing.Estimate{Cost: v, Known: true}.String() }
	span := func(d time.Duration) string { return d.Round(time.Second).String() }
	out := fmt.Sprintf("task      %s  (%s)\n", taskID, source)
	out += fmt.Sprintf("rows      %d: %d left to run", q.Rows, q.Left)
	if q.ToCall < q.Left {
		out += fmt.Sprintf(", %d of them to call (the others ask what the cache holds)", q.ToCall)
	}
	out += fmt.Sprintf("; measured on %d answered", q.Measured)
	if q.CostKnown {
		out += fmt.Sprintf(" (they cost %s, kept by the task)", usd(q.Spent))
	}
	out += "\n"
	out += fmt.Sprintf("tokens    per row: input %.0f (%.0f-%.0f), output %.0f (%.0f-%.0f)\n",
		q.InputTokens.Mid, q.InputTokens.Low, q.InputTokens.High, q.OutputTokens.Mid, q.OutputTokens.Low, q.OutputTokens.High)
	for _, p := range q.Plans(plans.Batch, plans.Deadline) {
		if !plans.Batch && p.Mode == store.ModeAuto {
			continue // economy's line says why neither runs
		}
		out += fmt.Sprintf("%-9s %s\n", p.Mode.String(), planText(q, p, usd, span))
	}
	out += "intervals 90%, of the mean per row over the rows left; batchgen run with the same flags continues this task\n"
	return out
}

// planText words one plan of the quote; "" for a plan not worth a line
// (auto where economy is not offered).
func planText(q pipeline.Quote, p pipeline.Plan, usd func(float64) string, span func(time.Duration) string) string {
	cost := "cost unknown"
	if q.CostKnown {
		cost = fmt.Sprintf("%s (%s-%s)", usd(p.Cost.Mid), usd(p.Cost.Low), usd(p.Cost.High))
	}
	switch {
	case p.Mode == store.ModeEconomy && !p.Offered:
		return "not offered: " + p.Why
	case p.Mode == store.ModeEconomy:
		return cost + ", " + p.Why
	case p.Mode == store.ModeAuto && p.NeedsDeadline:
		return "give --deadline: economy until the deadline leaves the time the rest needs online"
	case p.Mode == store.ModeAuto && (!p.Offered || p.AllOnline):
		return p.Why
	case p.Mode == store.ModeAuto:
		if q.CostKnown {
			cost = fmt.Sprintf("%s to %s", usd(p.Cost.Low), usd(p.Cost.High))
		}
		return fmt.Sprintf("%s, done within %s: %s", cost, span(p.Duration[2]), p.Why)
	}
	if !q.CostKnown {
		cost = "cost unknown (no price for a provider that answered: --prices, or the providers file's price)"
	}
	took := "time unknown"
	if p.Duration[1] > 0 {
		took = fmt.Sprintf("about %s (%s-%s)", span(p.Duration[1]), span(p.Duration[0]), span(p.Duration[2]))
		if !q.QuotaKnown {
			took += " if the quota does not bind (it is not known: --rpm)"
		}
	}
	return cost + ", " + took
}
