package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/batchgen/batchgen/internal/pipeline"
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
			o.Quiet = true // the quote is the output
			job, err := newRunJob(o, stderr)
			if err != nil {
				return err
			}
			defer job.Close()
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
		if _, err := j.Engine.Generator.Sample(ctx, task.ID, sample); err != nil {
			return fmt.Errorf("answer the sample: %w", err)
		}
	}
	if task, err = j.Data.Store.GetTask(ctx, task.ID); err != nil {
		return err
	}
	toCall, err := j.Engine.Generator.RowsToCall(ctx, task)
	if err != nil {
		return err
	}
	q, err := pipeline.QuoteTask(ctx, j.Data.Store, task, pipeline.QuoteParams{
		Prices: j.Prices, RequestsPerSecond: j.Set.QuotaPace(j.Providers), Concurrency: j.Providers.Concurrency(), RowsToCall: toCall,
	})
	if errors.Is(err, pipeline.ErrNothingMeasured) {
		return &report.ExitError{Code: report.RowsFailed, Err: fmt.Errorf("%w: the sample's rows failed or came from the cache (batchgen status %s --data %s shows why)", err, task.ID, j.Data.Dir)}
	}
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, report.QuoteText(task.ID, task.Source, q, report.QuotePlans{Batch: j.Set.Router.SellsBatches(), Deadline: time.Until(j.opts.ParsedDeadline)}))
	return nil
}
