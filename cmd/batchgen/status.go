package main

import (
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/providerfile"
	"github.com/batchgen/batchgen/internal/report"
)

// newStatusCmd shows one task: counts, rate, ETA, failures by class with
// the last few errors, tokens and cost, the encoding read, the providers
// that answered; from a data directory or, with --table, a deployed
// stack's table.
func newStatusCmd(stdout io.Writer) *cobra.Command {
	var dir, table, pricesFile, providersFile string
	cmd := &cobra.Command{
		Use:   "status TASK [flags]",
		Short: "Show one task: progress, rate, ETA, failures by class, tokens and cost, providers",
		Example: `  batchgen status TASK --data .batchgen
  batchgen status TASK --table TABLE      # a deployed stack (output TableName)`,
		Args:              taskArg("batchgen status TASK"),
		ValidArgsFunction: completeTask,
		RunE: func(cmd *cobra.Command, args []string) error {
			prices, err := loadPrices(pricesFile, providersFile)
			if err != nil {
				return err
			}
			d, err := openDeployment(cmd.Context(), dir, table, "", "")
			if err != nil {
				return err
			}
			defer d.close()
			s, err := pipeline.Status(cmd.Context(), d.store, args[0], time.Now())
			if err != nil {
				return refused(err, args[0], d.where, "batchgen tasks")
			}
			return report.WriteStatus(stdout, s, prices)
		},
	}
	fs := cmd.Flags()
	addDataFlag(fs, &dir)
	fs.StringVar(&table, "table", "", "AWS: the stack's DynamoDB table (output TableName) instead of --data")
	fs.StringVar(&pricesFile, "prices", "", "price table (YAML) overriding the built-in one, for the estimated cost")
	fs.StringVar(&providersFile, "providers", "", "the providers file the task ran with: each provider's rows at its entry's price")
	_ = cmd.MarkFlagDirname("data")
	return cmd
}

// loadPrices is the price table of the --prices and --providers flags of
// the commands that show a cost: the built-in table, --prices winning, and
// the providers file's entries' prices over both.
func loadPrices(pricesFile, providersFile string) (*pricing.Table, error) {
	prices, err := pricing.Load(pricesFile)
	if err != nil {
		return nil, report.Rejectf("--prices: %w", err)
	}
	if providersFile != "" {
		f, err := providerfile.Load(providersFile)
		if err != nil {
			return nil, report.Rejectf("--providers: %w", err)
		}
		prices = prices.FromProviders(f)
	}
	return prices, nil
}
