package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/batchgen/batchgen/internal/embedded"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// runOptions are the flags of `batchgen run`: its input and output, and
// the settings of the task and its engine (embedded.Settings).
type runOptions struct {
	in, out   string
	sheetName string
	encoding  string
	dataDir   string
	embedded.Settings
}

func (o *runOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.in, "in", "", "input spreadsheet (.xlsx or .csv); required")
	fs.StringVar(&o.out, "out", "", "result file: .xlsx (your workbook with the answers beside the rows) or .csv (the input's fields, then the answers); default <in>.result.xlsx beside the input")
	fs.StringVar(&o.sheetName, "sheet", "", "input sheet name; default the first visible sheet not named \"prompt\"")
	fs.StringVar(&o.encoding, "encoding", "", "text encoding of a CSV input: utf-8, windows-1252 (latin1), gb18030 (gbk), big5, shift_jis, ...; default: detected")
	fs.StringVar(&o.dataDir, "data", "", "state directory (SQLite database, result blobs); default .batchgen beside the input")
	o.RegisterSpec(fs)
	o.RegisterEngine(fs)
}

func newRunCmd(stdout, stderr io.Writer) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run [--in] FILE [flags]",
		Short: "Run a job: one model call per row of FILE, the result workbook beside it",
		Long: `Run reads the sheet (.xlsx or .csv; the first row is the header), sends one model call
per row and writes the result workbook. Running the same command again continues the
same task: rows that already have a result are never sent to the model again.`,
		Example: `  batchgen run --in skus.xlsx --prompt '为商品{{商品名称}}写一段营销文案'
  batchgen run skus.csv --out copy.xlsx --prompt-file prompt.txt --provider openai --rpm 2000
  batchgen run export.csv --out export.result.csv --prompt-file prompt.txt`,
		Args: inputArg(&o.in),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, err := newRunJob(o, stderr)
			if err != nil {
				return err
			}
			defer job.Close()
			return job.run(cmd.Context(), stdout)
		},
	}
	o.register(cmd.Flags())
	_ = cmd.MarkFlagFilename("in", "xlsx", "csv")
	_ = cmd.MarkFlagFilename("out", "xlsx", "csv")
	_ = cmd.MarkFlagFilename("prompt-file")
	_ = cmd.MarkFlagFilename("schema", "json")
	_ = cmd.MarkFlagDirname("data")
	return cmd
}

// inputArg takes the input as the one argument or as --in, once: the
// argument, when given, is stored in in.
func inputArg(in *string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > 1 || (len(args) == 1 && *in != "") {
			return fmt.Errorf("unexpected arguments %q: give the input once, as --in FILE or FILE", args)
		}
		if len(args) == 1 {
			*in = args[0]
		}
		return nil
	}
}

// runJob is one `batchgen run` (or quote, or retry): the embedded job and
// what the command prints.
type runJob struct {
	*embedded.Job
	opts   runOptions
	stderr io.Writer
	spec   store.TaskSpec
}

func newRunJob(o runOptions, stderr io.Writer) (*runJob, error) {
	if o.in == "" {
		return nil, report.Rejectf("--in is required: the spreadsheet to process (.xlsx or .csv)")
	}
	if _, err := os.Stat(o.in); err != nil {
		return nil, report.Rejectf("input %s: %w", o.in, embedded.UnwrapPathError(err))
	}
	if o.out == "" {
		base := strings.TrimSuffix(o.in, filepath.Ext(o.in))
		o.out = base + ".result.xlsx"
	}
	format, ok := resultFormatOf(o.out)
	if !ok {
		return nil, report.Rejectf("--out %s: name the result .xlsx (a workbook: your own, for a workbook input) or .csv (a CSV file)", o.out)
	}
	if err := o.CheckSpec(); err != nil {
		return nil, err
	}
	j, err := newEngineJob(o, stderr)
	if err != nil {
		return nil, err
	}
	j.spec = o.TaskSpec(j.Providers)
	j.spec.ResultFormat = format
	return j, nil
}

// resultFormatOf is the result format --out asks for by its extension.
func resultFormatOf(out string) (store.ResultFormat, bool) {
	f, err := store.ParseResultFormat(strings.TrimPrefix(filepath.Ext(out), "."))
	return f, err == nil && filepath.Ext(out) != ""
}

// newEngineJob checks the flags shared by the commands that call the model
// and sets up logging.
func newEngineJob(o runOptions, stderr io.Writer) (*runJob, error) {
	job, err := embedded.NewJob(o.Settings, stderr)
	if err != nil {
		return nil, err
	}
	o.Settings = job.Settings // as checked
	return &runJob{Job: job, opts: o, stderr: stderr}, nil
}

func (j *runJob) run(ctx context.Context, stdout io.Writer) error {
	task, existed, err := j.start(ctx)
	if err != nil {
		return err
	}
	if existed && !task.State.Final() {
		if err := j.Engine.Resume(ctx, task); err != nil {
			return err
		}
	}
	return j.complete(ctx, task, stdout)
}

// start reads the input, opens the data directory and the engine, and
// splits the input into its task, or finds the task an earlier run made
// of it (existed), with the cap --max-cost asks for.
func (j *runJob) start(ctx context.Context) (task store.Task, existed bool, err error) {
	o := j.opts
	identity, err := embedded.FileIdentity(o.in)
	if err != nil {
		return task, false, &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("input %s: %w", o.in, err)}
	}
	identity += "|sheet=" + o.sheetName + "|max-rows=" + fmt.Sprint(o.MaxRows)
	if o.encoding != "" {
		identity += "|encoding=" + strings.ToLower(o.encoding) // another reading of the same bytes is another task
	}
	taskID := pipeline.DeriveTaskID(identity, j.spec)

	params := pipeline.SplitParams{
		TaskID: taskID, Path: o.in, Source: filepath.Base(o.in), Owner: pipeline.LocalOwner, Spec: j.spec, Sheet: o.sheetName,
		Encoding: o.encoding, Limits: sheet.Limits{MaxRows: o.MaxRows}, Spool: true,
	}
	params.Terms = j.opts.Terms(store.Terms{}) // a new task has its terms from its creation
	// Validate before touching the data directory: rejected input writes
	// nothing but the error. The rows it reads are spooled for the split,
	// which then does not decode the sheet again.
	validated, err := pipeline.Validate(params)
	var rejected *pipeline.RejectedError
	if errors.As(err, &rejected) {
		return task, false, &report.ExitError{Code: report.Rejected, Err: rejected}
	}
	if err != nil {
		return task, false, fmt.Errorf("read %s: %w", o.in, err)
	}
	defer validated.Close()
	params.Validated = &validated
	if !o.Quiet {
		if validated.Rerun != nil {
			fmt.Fprintf(j.stderr, "batchgen: %s is a result sent back in: %s\n", filepath.Base(o.in), validated.Rerun)
		}
		for _, note := range validated.Notes {
			fmt.Fprintf(j.stderr, "batchgen: note: %s: %s\n", filepath.Base(o.in), note)
		}
	}

	if err := j.OpenData(o.dataDir, o.in); err != nil {
		return task, false, err
	}
	if err := j.openEngine(taskID); err != nil {
		return task, false, err
	}

	if t, err := j.Data.Store.GetTask(ctx, taskID); err == nil {
		existed = true
		j.Logger.Info("continuing task", "task_id", taskID, "state", t.State)
	} else if !errors.Is(err, store.ErrNotFound) {
		return task, false, fmt.Errorf("read task %s: %w", taskID, err)
	}

	splitter := pipeline.NewSplitter(j.Data.Store, j.Engine.Queue, pipeline.SplitterConfig{Logger: j.Logger, Inputs: j.Data.Blobs, Exports: j.Engine.Exports})
	task, err = splitter.Split(ctx, params)
	if errors.As(err, &rejected) {
		return task, existed, &report.ExitError{Code: report.Rejected, Err: rejected}
	}
	if err != nil {
		return task, existed, fmt.Errorf("split %s: %w", o.in, err)
	}
	if task, err = j.ApplyTerms(ctx, task); err != nil {
		return task, existed, err
	}
	if !o.Quiet {
		verb := "started"
		if existed {
			verb = "continuing"
		}
		read := ""
		if task.Encoding != "" {
			read = ", read as " + task.Encoding
		}
		fmt.Fprintf(j.stderr, "batchgen: %s task %s: %d rows in %d batches%s (data: %s)\n", verb, task.ID, task.RowsTotal, task.BatchesTotal, read, j.Data.Dir)
	}
	return task, existed, nil
}

// openEngine builds the engine of one task over the opened data
// directory: the task's own queue, and exports signalled to this command,
// which waits for them.
func (j *runJob) openEngine(taskID string) error {
	return j.OpenEngine(embedded.EngineConfig{Queue: embedded.TaskQueue(taskID)})
}

// complete drives an unfinished task to the end, writes the result to
// --out, prints the summary and turns the outcome into the exit code.
func (j *runJob) complete(ctx context.Context, task store.Task, stdout io.Writer) error {
	if !task.State.Final() {
		if err := j.process(ctx, task); err != nil {
			return err
		}
	}
	task, summary, failed, err := j.Finish(ctx, task.ID, j.opts.out)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, summary.String())
	return report.ForTask(task, failed)
}

// process works the task to its end (embedded.Engine.RunTask) with the
// progress line. Interrupted runs return exit code 130 and can be
// continued.
func (j *runJob) process(ctx context.Context, task store.Task) error {
	o := j.opts
	// A continued run's progress starts where the last one stopped.
	counts, err := pipeline.LiveCounts(ctx, j.Data.Store, task)
	if err != nil {
		return err
	}
	pc := report.ProgressConfig{Total: task.RowsTotal, Done: counts.Counts().Done(), Quiet: o.Quiet, Interval: o.ProgressInterval, RPM: j.Providers.RPM(), Counts: j.Stats.ProgressCounts}
	if task.Mode.Batched() {
		pc.Waiting = func() string {
			s, _ := j.Engine.Generator.EconomyStatus(task.ID)
			return s.String()
		}
	}
	progress := report.NewProgress(j.stderr, pc)
	defer progress.Finish()
	err = j.Engine.RunTask(ctx, task, embedded.TaskRun{
		Workers: pipeline.BatchesInFlight(j.Providers.Concurrency(), task.Spec.BatchSize), SweepAfter: o.SweepAfter,
		Tick: progress.Update,
		Cancelled: func() {
			if !o.Quiet {
				fmt.Fprintf(j.stderr, "batchgen: task %s was cancelled; finishing the rows in flight\n", task.ID)
			}
		},
	})
	if errors.Is(err, embedded.ErrInterrupted) {
		return &report.ExitError{Code: report.Interrupted, Err: fmt.Errorf("interrupted; finished rows are saved in %s: run the same command again to continue", j.Data.Dir)}
	}
	if err == nil {
		progress.Complete()
	}
	return err
}
