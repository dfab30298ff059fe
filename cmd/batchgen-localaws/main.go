// Command batchgen-localaws runs the whole AWS stack against a local
// emulator by hand: it provisions template.yaml's resources on the emulator
// at AWS_ENDPOINT_URL and runs the splitter, generator, exporter and
// sweeper handlers in-process, standing in for what the emulator does not
// do (S3 notifications, the SQS event source mapping, Step Functions
// calling a Go Lambda, the sweeper's schedule); see internal/samstack/localrun.
//
//	eval "$(infra/emulator/start.sh)"; export AWS_ENDPOINT_URL
//	go run ./cmd/batchgen-localaws --once examples/skus.xlsx --out /tmp/skus.result.xlsx
//	go run ./cmd/batchgen-localaws                       # until Ctrl-C; in another terminal:
//	go run ./cmd/batchgen-localaws upload examples/skus.xlsx
//
// Exit codes, as batchgen run's: 0 every row succeeded; 3 finished with
// some rows failed; 2 input rejected or bad usage (AWS_ENDPOINT_URL unset
// included); 1 anything else; 130 interrupted in --once mode.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/batchgen/batchgen/internal/report"
)

func usage(w io.Writer) {
	fmt.Fprint(w, `batchgen-localaws runs the batchgen AWS stack on a local emulator (AWS_ENDPOINT_URL),
with the Lambda handlers in-process.

Usage:
  batchgen-localaws [flags]                        provision (or --reuse) the stack, run it until Ctrl-C
  batchgen-localaws --once FILE [--out FILE] [flags]
                                                   upload FILE, run until its task is final, download the result
  batchgen-localaws upload [--prefix P] FILE       put FILE into incoming/ of the stack
  batchgen-localaws download [--prefix P] [--out FILE] TASK
                                                   fetch TASK's result (a dropped FILE.xlsx's is results/FILE.result.xlsx)
Start the emulator first:
  eval "$(infra/emulator/start.sh)"; export AWS_ENDPOINT_URL

Run "batchgen-localaws -h" or "batchgen-localaws upload -h" for the flags.
`)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// runMain dispatches a command line and returns the process exit code.
// getenv reads the Lambda-style settings (MODEL_PROVIDER and the like).
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	var err error
	switch {
	case len(args) > 0 && args[0] == "upload":
		err = cmdUpload(ctx, args[1:], stdout, stderr, getenv)
	case len(args) > 0 && args[0] == "download":
		err = cmdDownload(ctx, args[1:], stdout, stderr, getenv)
	case len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help"):
		usage(stdout)
		return report.OK
	default:
		err = cmdRun(ctx, args, stdout, stderr, getenv)
	}
	code, msg := report.Exit(err)
	if msg != "" {
		fmt.Fprintf(stderr, "batchgen-localaws: %s\n", msg)
	}
	return code
}
