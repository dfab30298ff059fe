// Command batchgen runs LLM batch jobs over spreadsheets: one model call per
// row, the sheet back with the generated text beside every row.
//
//	batchgen run --in skus.xlsx --prompt '为商品{{商品名称}}写一段营销文案'
//	batchgen mock-llm --addr 127.0.0.1:8089
//
// Exit codes: 0 every row succeeded; 3 finished with some rows failed (the
// result is still written); 2 input rejected or bad usage; 1 anything else;
// 130 interrupted.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/batchgen/batchgen/internal/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	setMemoryLimit(os.Getenv)
	stopProfile := startProfiles(os.Stderr)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stopProfile()
	stop()
	os.Exit(code)
}

// runMain runs a command line and returns the process exit code. Anything
// cobra refuses before a command runs (an unknown command or flag, a
// missing or extra argument) is a usage error: exit 2 with the command's
// help hint.
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var ran bool
	root := newRootCmd(stdout, stderr, &ran)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return report.OK
	}
	if !ran {
		// Refused before any command ran: a usage error.
		var ee *report.ExitError
		if !errors.As(err, &ee) {
			if cmd == nil {
				cmd = root
			}
			fmt.Fprintf(stderr, "batchgen: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
			return report.Rejected
		}
	}
	code, msg := report.Exit(err)
	if msg != "" {
		fmt.Fprintf(stderr, "batchgen: %s\n", msg)
	}
	return code
}

// newRootCmd builds the command tree. ran is set once a command's own code
// starts, so runMain can tell usage errors from failures.
func newRootCmd(stdout, stderr io.Writer, ran *bool) *cobra.Command {
	root := &cobra.Command{
		Use:   "batchgen",
		Short: "Run an LLM over every row of a spreadsheet",
		Long: `batchgen runs an LLM batch job over a spreadsheet: one model call per row, the sheet
back with the generated text beside every row. Flags go before or after the arguments.

Exit codes: 0 every row succeeded; 3 finished with some rows failed (the result is
written with them marked); 2 input rejected or bad usage; 1 anything else; 130 interrupted.`,
		Example: `  batchgen run --in skus.xlsx --prompt '为商品{{商品名称}}写一段营销文案'
  batchgen tasks --data .batchgen
  batchgen retry TASK --data .batchgen --error-class content_filter
  batchgen completion bash > /etc/bash_completion.d/batchgen`,
		SilenceErrors: true,
		SilenceUsage:  true,
		// No command: the help on stderr and a usage error, as before.
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(stderr)
			_ = cmd.Help()
			return &report.ExitError{Code: report.Rejected}
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	for _, c := range []*cobra.Command{
		newRunCmd(stdout, stderr),
		newQuoteCmd(stdout, stderr),
		newServeCmd(stdout, stderr),
		newTasksCmd(stdout),
		newStatusCmd(stdout),
		newCancelCmd(stdout),
		newRetryCmd(stdout, stderr),
		newDLQCmd(stdout),
		newMockLLMCmd(stdout),
	} {
		markRan(c, ran)
		root.AddCommand(c)
	}
	return root
}

// markRan wraps the RunE of c and its subcommands so that ran is set when
// their code starts.
func markRan(c *cobra.Command, ran *bool) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			*ran = true
			return run(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		markRan(sub, ran)
	}
}

// usageErr is a usage error found by a command's own argument check.
func usageErr(format string, a ...any) error {
	return report.Rejectf(format, a...)
}
