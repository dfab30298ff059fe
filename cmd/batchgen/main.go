// Command batchgen runs LLM batch jobs over spreadsheets: one model call per
// row, the sheet back with the generated text beside every row.
//
//	batchgen run --in skus.xlsx --prompt '为商品{{商品名称}}写一段营销文案'
//	batchgen mock-llm --addr 127.0.0.1:8089
//
// Exit codes: 0 every row succeeded; 3 finished with some rows failed (the
// result is still written); 2 input rejected; 1 anything else.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit codes, a contract with scripts that call batchgen.
const (
	exitOK         = 0
	exitFailure    = 1
	exitRejected   = 2
	exitRowsFailed = 3
	exitSignal     = 130
)

// exitError carries an exit code with the message printed for it.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func usage(w io.Writer) {
	fmt.Fprint(w, `batchgen runs an LLM batch job over a spreadsheet: one model call per row.

Usage:
  batchgen run --in FILE [--out FILE] [--prompt TEXT | --prompt-file FILE] [flags]
  batchgen tasks [--data DIR]                      list tasks, with what needs attention
  batchgen cancel [--data DIR] TASK                stop a task; its partial result marks unstarted rows
  batchgen retry [--data DIR] [--out FILE] [--error-class CLASS] [provider flags] TASK
                                                   rerun the failed rows of a task
  batchgen dlq list|redrive [--data DIR]           dead-lettered messages
  batchgen mock-llm [--addr HOST:PORT] [flags]     OpenAI-compatible test server
  batchgen help [command]

Run "batchgen <command> -h" for a command's flags.
`)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runMain dispatches a command line and returns the process exit code.
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitRejected
	}
	var err error
	switch args[0] {
	case "run":
		err = cmdRun(ctx, args[1:], stdout, stderr)
	case "mock-llm":
		err = cmdMockLLM(ctx, args[1:], stdout, stderr)
	case "tasks":
		err = cmdTasks(ctx, args[1:], stdout, stderr)
	case "cancel":
		err = cmdCancel(ctx, args[1:], stdout, stderr)
	case "retry":
		err = cmdRetry(ctx, args[1:], stdout, stderr)
	case "dlq":
		err = cmdDLQ(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	default:
		fmt.Fprintf(stderr, "batchgen: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitRejected
	}
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "batchgen: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(stderr, "batchgen: %v\n", err)
	return exitFailure
}
