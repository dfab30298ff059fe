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
		Prices: j.prices, RequestsPerSecond: j.quotaPace(), Concurrency: j.providers.Concurrency(), RowsToCall: toCall,
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

// quotaPace is the requests a second the providers' quotas allow: the
// configured ones, or what the limiters learnt during the sample; 0 when
// a provider's is not known.
func (j *runJob) quotaPace() float64 {
	if rpm := j.providers.RPM(); rpm > 0 {
		return float64(rpm) / 60
	}
	total := 0.0
	for _, p := range j.providers.Providers {
		l, ok := j.set.Limiter(p.Name).(interface{ Rate() float64 })
		if !ok || l.Rate() <= 0 {
			return 0
		}
		total += l.Rate()
	}
	return total
}

// quotePlans are what the quote says of economy and auto: whether the
// providers sell a batch API, and the --deadline of auto (0 for none).
type quotePlans struct {
	batch    bool
	deadline time.Duration
}

// batchWindow is what a provider batch takes, as the providers sell it.
const batchWindow = "within the provider's batch window (often minutes to a few hours, at most 24h)"

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
	cost := "cost unknown (no price for a provider that answered: --prices, or the providers file's price)"
	if q.CostKnown {
		cost = fmt.Sprintf("%s (%s-%s)", usd(q.Cost.Mid), usd(q.Cost.Low), usd(q.Cost.High))
	}
	took := "time unknown"
	if q.Duration[1] > 0 {
		took = fmt.Sprintf("about %s (%s-%s)", span(q.Duration[1]), span(q.Duration[0]), span(q.Duration[2]))
		if !q.QuotaKnown {
			took += " if the quota does not bind (it is not known: --rpm)"
		}
	}
	out += fmt.Sprintf("online    %s, %s\n", cost, took)
	out += economyQuote(q, plans, usd, span)
	out += "intervals 90%, of the mean per row over the rows left; batchgen run with the same flags continues this task\n"
	return out
}

// economyQuote is the quote's economy and auto lines.
func economyQuote(q pipeline.Quote, plans quotePlans, usd func(float64) string, span func(time.Duration) string) string {
	if !plans.batch {
		return "economy   not offered: no provider here sells a batch API (openai, anthropic and the simulator do)\n"
	}
	eco := "cost unknown"
	if q.CostKnown {
		eco = fmt.Sprintf("%s (%s-%s)", usd(q.Economy.Mid), usd(q.Economy.Low), usd(q.Economy.High))
	}
	out := fmt.Sprintf("economy   %s, %s\n", eco, batchWindow)
	if plans.deadline <= 0 {
		return out + "auto      give --deadline: economy until the deadline leaves the time the rest needs online\n"
	}
	// As the lane cuts over: the rows' online time, a tenth more, and a
	// margin.
	need := q.Duration[1]*11/10 + 30*time.Second
	switch {
	case q.Duration[1] == 0:
		out += "auto      time online unknown, so the switch to online cannot be placed\n"
	case need >= plans.deadline:
		out += fmt.Sprintf("auto      all online at once: the rows need about %s online, the deadline is %s away\n", span(need), span(plans.deadline))
	default:
		cost := "cost unknown"
		if q.CostKnown {
			cost = fmt.Sprintf("%s to %s", usd(q.Economy.Mid), usd(q.Cost.Mid))
		}
		out += fmt.Sprintf("auto      %s, done within %s: economy for up to %s, then the rows left online\n", cost, span(plans.deadline), span(plans.deadline-need))
	}
	return out
}
