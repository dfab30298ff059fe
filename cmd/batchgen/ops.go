package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/batchgen/batchgen/internal/awswire/opswire"
	"github.com/batchgen/batchgen/internal/embedded"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// addDataFlag registers --data, the state directory every operator command
// works on.
func addDataFlag(fs *pflag.FlagSet, dir *string) {
	fs.StringVar(dir, "data", ".batchgen", "state directory of the runs (the .batchgen folder beside the input)")
}

// taskArg checks the one TASK argument of cancel and retry.
func taskArg(usage string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("want one TASK, got %d argument(s) (usage: %s; batchgen tasks lists them)", len(args), usage)
		}
		return nil
	}
}

// completeTask offers the task ids of the --data directory for a TASK
// argument.
func completeTask(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	dir, _ := cmd.Flags().GetString("data")
	st, err := openStateReadOnly(dir)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer st.Close()
	tasks, err := st.ListTasks(cmd.Context(), 200)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	out := make([]cobra.Completion, 0, len(tasks))
	for _, t := range tasks {
		out = append(out, cobra.CompletionWithDesc(t.ID, string(t.State)+" "+t.Source))
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// openStateReadOnly opens the database of a data directory without taking
// its lock: listing and cancelling must work while a run is active (SQLite
// serializes the writes).
func openStateReadOnly(dir string) (*sqlitestore.Store, error) {
	st, err := embedded.OpenStore(dir)
	var none *embedded.NoDataError
	if errors.As(err, &none) {
		return nil, &report.ExitError{Code: report.Rejected, Err: err}
	}
	return st, err
}

// newTasksCmd lists the tasks of a data directory, or with --table those
// of a deployed stack, newest first, with what needs an operator's
// attention.
func newTasksCmd(stdout io.Writer) *cobra.Command {
	var dir, table, dlqURL, pricesFile, providersFile, states, since string
	var limit int
	cmd := &cobra.Command{
		Use:   "tasks [flags]",
		Short: "List tasks, newest first, with what needs attention",
		Example: `  batchgen tasks --data .batchgen --state partial,failed --since 24h
  batchgen tasks --table TABLE --since 2026-01-31`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			prices, err := loadPrices(pricesFile, providersFile)
			if err != nil {
				return err
			}
			f, err := pipeline.ParseTaskFilter(states, since, time.Now())
			if err != nil {
				return report.Rejectf("--%w", err)
			}
			f.Limit = limit
			return listTasks(cmd.Context(), dir, table, dlqURL, f, prices, stdout)
		},
	}
	fs := cmd.Flags()
	addDataFlag(fs, &dir)
	fs.IntVar(&limit, "limit", 50, "show at most this many tasks")
	fs.StringVar(&states, "state", "", "only tasks in these states (comma-separated: pending, running, exporting, succeeded, partial, failed, cancelled)")
	fs.StringVar(&since, "since", "", "only tasks created since then: a duration back from now (24h, 90m) or a date (2026-01-31, or RFC 3339)")
	fs.StringVar(&table, "table", "", "AWS: the stack's DynamoDB table (output TableName) instead of --data")
	fs.StringVar(&dlqURL, "dlq-url", "", "AWS: the dead-letter queue (output DlqUrl), to flag tasks with dead-lettered messages")
	fs.StringVar(&pricesFile, "prices", "", "price table (YAML) overriding the built-in one, for the COST column")
	fs.StringVar(&providersFile, "providers", "", "the providers file the tasks ran with: each provider's tokens at its entry's price")
	_ = cmd.MarkFlagDirname("data")
	return cmd
}

// deployment is what an operator command works on: the data directory
// (--data), or with --table a deployed stack through the default AWS
// configuration. Every command that reads a store opens it here, so the
// two runtimes are told apart once.
type deployment struct {
	// where names it in messages: the directory or the table.
	where string
	// store is nil for a stack whose table was not given (dlq).
	store store.Store
	// dead is its dead-letter queue, deadWhere its name in messages, and
	// back where a redrive moves the letters; dead is nil for a stack whose
	// --dlq-url was not given.
	dead            queue.DeadLetters
	deadWhere, back string
	// local is the data directory's database, nil for a stack.
	local *sqlitestore.Store
	// rerun says what to do about a task that stopped progressing.
	rerun string
}

// openDeployment opens the data directory dir, or the stack: its table
// when table is set, its dead-letter queue when dlqURL is (with queueURL,
// where a redrive moves the letters).
func openDeployment(ctx context.Context, dir, table, queueURL, dlqURL string) (*deployment, error) {
	if table == "" && queueURL == "" {
		st, err := openStateReadOnly(dir)
		if err != nil {
			return nil, err
		}
		return &deployment{where: dir, store: st, local: st, dead: embedded.DeadLetters{Store: st}, rerun: "rerun batchgen run",
			deadWhere: dir, back: "their queues; run batchgen run, retry or serve to process them"}, nil
	}
	stack, err := opswire.Open(ctx)
	if err != nil {
		return nil, err
	}
	d := &deployment{where: table, rerun: "the sweeper re-enqueues; check the alarms", deadWhere: dlqURL, back: queueURL}
	if table != "" {
		d.store = stack.Store(table)
	}
	if dlqURL != "" {
		d.dead = stack.Queue(queueURL, dlqURL)
	}
	return d, nil
}

// close releases the data directory's database.
func (d *deployment) close() {
	if d.local != nil {
		d.local.Close()
	}
}

func listTasks(ctx context.Context, dir, table, dlqURL string, f pipeline.TaskFilter, prices *pricing.Table, stdout io.Writer) error {
	d, err := openDeployment(ctx, dir, table, "", dlqURL)
	if err != nil {
		return err
	}
	defer d.close()
	tasks, err := pipeline.ListTaskOverviews(ctx, d.store, d.dead, f)
	if err != nil {
		return fmt.Errorf("%s: %w", d.where, err)
	}
	if len(tasks) == 0 {
		fmt.Fprintf(stdout, "no tasks in %s%s\n", d.where, f)
		return nil
	}
	return report.WriteTasks(stdout, tasks, d.rerun, prices)
}

// newCancelCmd cancels a task: no new rows start, rows in flight finish,
// and the partial result is written (now if no run is active, else by the
// run).
func newCancelCmd(stdout io.Writer) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:               "cancel TASK [flags]",
		Short:             "Stop a task; its partial result marks the rows that did not run not_started",
		Args:              taskArg("batchgen cancel TASK [--data DIR]"),
		ValidArgsFunction: completeTask,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cancelTask(cmd.Context(), dir, args[0], stdout)
		},
	}
	addDataFlag(cmd.Flags(), &dir)
	_ = cmd.MarkFlagDirname("data")
	return cmd
}

func cancelTask(ctx context.Context, dir, id string, stdout io.Writer) error {
	st, err := openStateReadOnly(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	// With the lock free no run is working the task: the partial result is
	// written now. Otherwise the run sees the cancel and writes it.
	var exports pipeline.ExportStarter
	data, lockErr := embedded.Open(dir, "", 0)
	if lockErr == nil {
		defer data.Close()
		exports = pipeline.NewExporter(data.Store, data.Blobs, pipeline.ExporterConfig{})
	}
	task, err := pipeline.Cancel(ctx, st, pipeline.CancelParams{TaskID: id, Reason: "cancelled by operator", Now: time.Now(), Exports: exports})
	if export := (*pipeline.ExportNotStartedError)(nil); errors.As(err, &export) {
		return fmt.Errorf("%w; the task stays cancelled: run batchgen cancel again, or batchgen retry %s", export, id)
	}
	if err != nil {
		return refused(err, id, dir, "batchgen tasks --data "+dir)
	}
	if exports == nil {
		fmt.Fprintf(stdout, "task %s cancelled; the running batchgen finishes the rows in flight and writes the partial result\n", id)
		return nil
	}
	path, _ := data.Blobs.Path(pipeline.TaskResultKey(task))
	fmt.Fprintf(stdout, "task %s cancelled; partial result: %s\n", id, path)
	return nil
}

// newRetryCmd reruns the failed rows of a finished task (or continues an
// unfinished one) and writes a new result.
func newRetryCmd(stdout, stderr io.Writer) *cobra.Command {
	var o runOptions
	var dir, errorClass, table, queueURL string
	cmd := &cobra.Command{
		Use:   "retry TASK [flags]",
		Short: "Rerun the failed rows of a task and write a new result",
		Long: `Retry reruns only the failed rows of a finished task (all of them, or those of one
--error-class) with a new attempt budget; succeeded rows are never billed again. A task
whose run stopped midway is continued. Use the provider and model the task ran with.

With --table and --queue-url (the stack outputs TableName and QueueUrl) it retries a task
of the deployed AWS stack instead: the failed rows go back to the queue, the stack's
generators rerun them, and the task is exported again under its next export generation.`,
		Example: `  batchgen retry TASK --data .batchgen --error-class content_filter
  batchgen retry TASK --table TABLE --queue-url QUEUE_URL --error-class retry_exhausted`,
		Args:              taskArg("batchgen retry TASK [--data DIR] [--out FILE] [--error-class CLASS] [provider flags]"),
		ValidArgsFunction: completeTask,
		RunE: func(cmd *cobra.Command, args []string) error {
			if table != "" || queueURL != "" {
				if table == "" || queueURL == "" {
					return &report.ExitError{Code: report.Rejected, Err: errors.New("--table and --queue-url go together (the stack outputs TableName and QueueUrl)")}
				}
				return retryAWS(cmd.Context(), table, queueURL, args[0], errorClass, stdout)
			}
			return retryTask(cmd.Context(), o, dir, args[0], errorClass, stdout, stderr)
		},
	}
	fs := cmd.Flags()
	addDataFlag(fs, &dir)
	fs.StringVar(&o.out, "out", "", "result workbook; default <source>.result.xlsx beside the data directory")
	fs.StringVar(&errorClass, "error-class", "", "only rows that failed with this class (e.g. content_filter, retry_exhausted, insufficient_quota)")
	fs.StringVar(&table, "table", "", "AWS: the stack's DynamoDB table (output TableName); with --queue-url, retries on the stack instead of --data")
	fs.StringVar(&queueURL, "queue-url", "", "AWS: the work queue (output QueueUrl)")
	o.RegisterEngine(fs)
	_ = cmd.MarkFlagDirname("data")
	_ = cmd.MarkFlagFilename("out", "xlsx")
	return cmd
}

func retryTask(ctx context.Context, o runOptions, dir, id, errorClass string, stdout, stderr io.Writer) error {
	j, err := newEngineJob(o, stderr)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "batchgen.db")); err != nil {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("no batchgen data in %s (pass --data, the .batchgen folder beside the input)", dir)}
	}
	j.opts.dataDir = dir
	if err := j.OpenData(dir, ""); err != nil {
		return err
	}
	defer j.Close()
	if err := j.openEngine(id); err != nil {
		return err
	}
	// The result is written again in the format the task asked for, so
	// --out must name a file of that kind.
	if t, err := j.Data.Store.GetTask(ctx, id); err == nil && j.opts.out != "" {
		if f, ok := resultFormatOf(j.opts.out); !ok || f != t.Spec.ResultFormat {
			return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--out %s: task %s writes its result as %s; use a name ending in %s", j.opts.out, id, t.Spec.ResultFormat.Ext(), t.Spec.ResultFormat.Ext())}
		}
	}
	if t, err := j.Data.Store.GetTask(ctx, id); err == nil {
		if _, err := j.ApplyTerms(ctx, t); err != nil {
			return err
		}
	}
	spec := j.Providers.Spec(store.TaskSpec{})
	// This process holds the data directory's lock: the task's only
	// workers are its own.
	retrier := pipeline.Retrier{Store: j.Data.Store, Queue: j.Engine.Queue, OwnsWorkers: true}
	outcome, err := retrier.Retry(ctx, pipeline.RetryParams{
		TaskID: id, ErrorClass: errorClass, Provider: spec.Provider, Model: spec.Model, Now: time.Now(),
	})
	if err != nil {
		return refused(err, id, dir, "batchgen tasks --data "+dir)
	}
	task := outcome.Task
	if j.opts.out == "" {
		j.opts.out = filepath.Join(filepath.Dir(filepath.Clean(dir)), strings.TrimSuffix(task.Source, filepath.Ext(task.Source))+".result"+task.Spec.ResultFormat.Ext())
	}
	switch {
	case outcome.Resumed:
		if !o.Quiet {
			fmt.Fprintf(stderr, "batchgen: task %s was stopped midway; continuing it\n", id)
		}
	case outcome.Batches == 0:
		fmt.Fprintf(stderr, "batchgen: task %s has no failed rows%s to retry; writing its result again\n", id, classSuffix(errorClass))
	case !o.Quiet:
		fmt.Fprintf(stderr, "batchgen: retrying task %s: %d batch(es) with failed rows%s\n", id, outcome.Batches, classSuffix(errorClass))
	}
	return j.complete(ctx, task, stdout)
}

// retryAWS reopens the failed rows of a deployed stack's task through the
// default AWS configuration (AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL for an
// emulator) and enqueues their batches; the stack does the rest.
func retryAWS(ctx context.Context, table, queueURL, id, errorClass string, stdout io.Writer) error {
	stack, err := opswire.Open(ctx)
	if err != nil {
		return err
	}
	r := pipeline.Retrier{Store: stack.Store(table), Queue: stack.Queue(queueURL, "")}
	out, err := r.Retry(ctx, pipeline.RetryParams{TaskID: id, ErrorClass: errorClass, Now: time.Now()})
	task, n := out.Task, out.Batches
	if err != nil && task.ID != "" {
		fmt.Fprintf(stdout, "task %s reopened, but enqueueing failed (%v); the stack's sweeper re-enqueues its batches within minutes\n", id, err)
		return nil
	}
	if err != nil {
		return refused(err, id, table, "batchgen tasks --table "+table)
	}
	if n == 0 {
		fmt.Fprintf(stdout, "task %s has no failed rows%s; nothing to retry\n", id, classSuffix(errorClass))
		return nil
	}
	fmt.Fprintf(stdout, "task %s: %d batch(es) with failed rows%s re-enqueued; the stack exports it again when they finish (export generation %d)\n",
		id, n, classSuffix(errorClass), task.ExportGen)
	return nil
}

// refused turns the core's refusals of an operation on task id (no such
// task in where, a state that does not allow it, a mismatch with how it
// ran, a concurrent change) into a rejection (exit 2) that says what lists
// the tasks; any other error is returned as it is.
func refused(err error, id, where, list string) error {
	var state *pipeline.StateError
	var mismatch *pipeline.MismatchError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return report.Rejectf("no task %s in %s (%s lists them)", id, where, list)
	case errors.As(err, &state), errors.As(err, &mismatch), errors.Is(err, store.ErrConflict):
		return &report.ExitError{Code: report.Rejected, Err: err}
	}
	return err
}

func classSuffix(class string) string {
	if class == "" {
		return ""
	}
	return " of class " + class
}

// newDLQCmd lists or redrives dead-lettered messages: those of an embedded
// data directory, or, with --queue-url and --dlq-url, of the deployed SQS
// dead-letter queue (redrive uses SQS's message-move task).
func newDLQCmd(stdout io.Writer) *cobra.Command {
	var dir, queueURL, dlqURL string
	cmd := &cobra.Command{
		Use:   "dlq list|redrive [flags]",
		Short: "List or redrive dead-lettered messages",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageErr("give a subcommand: batchgen dlq list or batchgen dlq redrive")
		},
	}
	fs := cmd.PersistentFlags()
	addDataFlag(fs, &dir)
	fs.StringVar(&queueURL, "queue-url", "", "AWS: the work queue (stack output QueueUrl); with --dlq-url, works SQS instead of --data")
	fs.StringVar(&dlqURL, "dlq-url", "", "AWS: the dead-letter queue (stack output DlqUrl)")
	_ = cmd.MarkPersistentFlagDirname("data")
	for _, verb := range []struct{ name, short string }{
		{"list", "List dead-lettered messages"},
		{"redrive", "Move dead-lettered messages back to their queue"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:   verb.name + " [flags]",
			Short: verb.short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if (queueURL == "") != (dlqURL == "") {
					return &report.ExitError{Code: report.Rejected, Err: errors.New("--queue-url and --dlq-url go together (the stack outputs QueueUrl and DlqUrl)")}
				}
				return dlq(cmd.Context(), verb.name, dir, queueURL, dlqURL, stdout)
			},
		})
	}
	return cmd
}

// dlq lists or redrives the dead letters of the data directory dir, or
// with queueURL and dlqURL of the deployed queues (redrive uses SQS's
// message-move task).
func dlq(ctx context.Context, verb, dir, queueURL, dlqURL string, stdout io.Writer) error {
	d, err := openDeployment(ctx, dir, "", queueURL, dlqURL)
	if err != nil {
		return err
	}
	defer d.close()
	dead, where := d.dead, d.deadWhere
	if verb == "redrive" {
		n, err := dead.Redrive(ctx)
		if err != nil {
			return fmt.Errorf("redrive %s: %w", where, err)
		}
		if n == 0 {
			fmt.Fprintf(stdout, "no dead-lettered messages in %s\n", where)
		} else {
			fmt.Fprintf(stdout, "%d message(s) moved back to %s\n", n, d.back)
		}
		// A letter someone received stays hidden until its visibility
		// timeout ends, and no redrive moves it before: say so, or the
		// operator believes the queue is empty.
		if h, ok := dead.(queue.HiddenDeadLetters); ok {
			if hidden, err := h.HiddenDead(ctx); err == nil && hidden > 0 {
				fmt.Fprintf(stdout, "%d more dead-lettered message(s) hidden for now (received by a reader such as dlq list, not visible again yet): run batchgen dlq redrive again once they are\n", hidden)
			}
		}
		return nil
	}
	ds, err := pipeline.ListDeadLetters(ctx, dead, 1000)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if len(ds) == 0 {
		fmt.Fprintf(stdout, "no dead-lettered messages in %s\n", where)
		return nil
	}
	return report.WriteDeadLetters(stdout, ds)
}
