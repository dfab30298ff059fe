package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/store"
)

// newQuoteCmd quotes a job before it runs: a sample of its rows answered,
// then what the rest is expected to cost and take.
func newQuoteCmd(stdout, stderr io.Writer) *cobra.Command {
	var o runOptions
	sample := 20
	cmd := &cobra.Command{
		Use:   "quote [--in] FILE [flags]",
		Short: "Quote a job before running it: answer a sample of rows, then show what the rest would cost and take",
		Long: `Quote takes the flags of run. It answers a sample of the sheet's rows (--sample, 20 by
default), measures their tokens and latency, and prints what the rows left are expected to
cost and how long they would take online at the quota, each with its 90% interval. The task
keeps the sample's answers: the run that follows continues it and does not pay for them again.`,
		Example: `  batchgen quote --in skus.xlsx --prompt '为商品{{商品名称}}写一段营销文案' --provider openai --rpm 2000`,
		Args:    inputArg(&o.in),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sample < 1 {
				return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--sample %d: must be at least 1", sample)}
			}
			o.quiet = true // the quote is the output
			job, err := newRunJob(o, stderr)
			if err != nil {
				return err
			}
			defer job.close()
			return job.quote(cmd, sample, stdout)
		},
	}
	o.register(cmd.Flags())
	cmd.Flags().IntVar(&sample, "sample", sample, "rows to answer and measure (kept by the task)")
	_ = cmd.MarkFlagFilename("in", "xlsx", "csv")
	_ = cmd.MarkFlagFilename("prompt-file")
	_ = cmd.MarkFlagDirname("data")
	return cmd
}

// quote answers the sample and prints the quote.
func (j *runJob) quote(cmd *cobra.Command, sample int, stdout io.Writer) error {
	ctx := cmd.Context()
	task, _, err := j.start(ctx)
	if err != nil {
		return err
	}
	if !task.State.Final() {
		if _, err := j.engine.Generator.Sample(ctx, task.ID, sample); err != nil {
			return fmt.Errorf("answer the sample: %w", err)
		}
	}
	if task, err = j.data.Store.GetTask(ctx, task.ID); err != nil {
		return err
	}
	toCall, err := j.engine.Generator.RowsToCall(ctx, task)
	if err != nil {
		return err
	}
	q, err := pipeline.QuoteTask(ctx, j.data.Store, task, pipeline.QuoteParams{
		Prices: j.prices, RequestsPerSecond: j.set.QuotaPace(j.providers), Concurrency: j.providers.Concurrency(), RowsToCall: toCall,
	})
	if errors.Is(err, pipeline.ErrNothingMeasured) {
		return &report.ExitError{Code: report.RowsFailed, Err: fmt.Errorf("%w: the sample's rows failed or came from the cache (batchgen status %s --data %s shows why)", err, task.ID, j.data.Dir)}
	}
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, quoteText(task.ID, task.Source, q, quotePlans{batch: j.set.Router.SellsBatches(), deadline: time.Until(j.opts.parsedDeadline)}))
	return nil
}

// quotePlans are what the quote says of economy and auto: whether the
// providers sell a batch API, and the --deadline of auto (0 for none).
type quotePlans struct {
	batch    bool
	deadline time.Duration
}

// quoteText words q for people.
func quoteText(taskID, source string, q pipeline.Quote, plans quotePlans) string {
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
	for _, p := range q.Plans(plans.batch, plans.deadline) {
		if !plans.batch && p.Mode == store.ModeAuto {
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
