package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/queue/sqsqueue"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/dynamostore"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// stuckAfter is how long an unfinished task may go without progress before
// `batchgen tasks` calls it stuck.
const stuckAfter = 10 * time.Minute

// parseOps parses an operator command's flags: --data plus extra, and
// returns the positional arguments.
func parseOps(name string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (dataDir string, rest []string, err error) {
	fs := flag.NewFlagSet("batchgen "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&dataDir, "data", ".batchgen", "state directory of the runs (the .batchgen folder beside the input)")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return "", nil, err
		}
		return "", nil, &exitError{code: exitRejected}
	}
	return dataDir, fs.Args(), nil
}

// openStateReadOnly opens the database of a data directory without taking
// its lock: listing and cancelling must work while a run is active (SQLite
// serializes the writes).
func openStateReadOnly(dir string) (*sqlitestore.Store, error) {
	db := filepath.Join(dir, "batchgen.db")
	if _, err := os.Stat(db); err != nil {
		return nil, &exitError{code: exitRejected, err: fmt.Errorf("no batchgen data in %s (pass --data, the .batchgen folder beside the input)", dir)}
	}
	st, err := sqlitestore.Open(db, sqlitestore.Options{})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", db, err)
	}
	return st, nil
}

// cmdTasks lists the tasks of a data directory, or with --table those of a
// deployed stack, newest first, with what needs an operator's attention.
func cmdTasks(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var limit int
	var table, dlqURL string
	dir, _, err := parseOps("tasks", args, stderr, func(fs *flag.FlagSet) {
		fs.IntVar(&limit, "limit", 50, "show at most this many tasks")
		fs.StringVar(&table, "table", "", "AWS: the stack's DynamoDB table (output TableName) instead of --data")
		fs.StringVar(&dlqURL, "dlq-url", "", "AWS: the dead-letter queue (output DlqUrl), to flag tasks with dead-lettered messages")
	})
	if errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if table != "" {
		return tasksAWS(ctx, table, dlqURL, limit, stdout)
	}
	st, err := openStateReadOnly(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	tasks, err := st.ListTasks(ctx, limit)
	if err != nil {
		return fmt.Errorf("list tasks: %w", err)
	}
	if len(tasks) == 0 {
		fmt.Fprintf(stdout, "no tasks in %s\n", dir)
		return nil
	}
	lines := make([]taskLine, 0, len(tasks))
	for _, t := range tasks {
		c, err := countRows(ctx, st, t.ID)
		if err != nil {
			return err
		}
		q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: queueName(t.ID), MaxReceive: maxReceive})
		if err != nil {
			return fmt.Errorf("open queue of %s: %w", t.ID, err)
		}
		dead, err := q.ListDead(ctx, 100)
		if err != nil {
			return fmt.Errorf("list dead letters of %s: %w", t.ID, err)
		}
		lines = append(lines, taskLine{task: t, succeeded: c.succeeded, failed: c.failed, dead: len(dead), rerun: "rerun batchgen run"})
	}
	return printTasks(stdout, lines)
}

// tasksAWS lists a deployed stack's tasks from its table. Row counts are the
// task's counters (finished batches), which is what the API shows too.
func tasksAWS(ctx context.Context, table, dlqURL string, limit int, stdout io.Writer) error {
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	tasks, err := dynamostore.New(dynamodb.NewFromConfig(cfg), table, dynamostore.Options{}).ListTasks(ctx, limit)
	if err != nil {
		return fmt.Errorf("list tasks in %s: %w", table, err)
	}
	if len(tasks) == 0 {
		fmt.Fprintf(stdout, "no tasks in %s\n", table)
		return nil
	}
	dead := map[string]int{}
	if dlqURL != "" {
		msgs, err := sqsqueue.New(sqs.NewFromConfig(cfg), "", sqsqueue.Options{DLQURL: dlqURL}).ListDead(ctx, 1000)
		if err != nil {
			return fmt.Errorf("list %s: %w", dlqURL, err)
		}
		for _, m := range msgs {
			if b, err := pipeline.DecodeBatchMessage(m.Body); err == nil {
				dead[b.TaskID]++
			}
		}
	}
	lines := make([]taskLine, 0, len(tasks))
	for _, t := range tasks {
		lines = append(lines, taskLine{task: t, succeeded: t.RowsSucceeded, failed: t.RowsFailed, dead: dead[t.ID], rerun: "the sweeper re-enqueues; check the alarms"})
	}
	return printTasks(stdout, lines)
}

// taskLine is one row of `batchgen tasks`.
type taskLine struct {
	task              store.Task
	succeeded, failed int
	// dead counts the task's dead-lettered messages.
	dead int
	// rerun says what to do about a task that stopped progressing.
	rerun string
}

func printTasks(w io.Writer, lines []taskLine) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tSTATE\tROWS\tSUCCEEDED\tFAILED\tSOURCE\tCREATED\tNOTE")
	for _, l := range lines {
		t := l.task
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", t.ID, t.State, t.RowsTotal, l.succeeded, l.failed,
			t.Source, t.CreatedAt.Local().Format("2006-01-02 15:04"), taskNote(l))
	}
	return tw.Flush()
}

// taskNote tells an operator what needs attention: dead-lettered messages,
// no progress for a while, failed rows to retry.
func taskNote(l taskLine) string {
	t := l.task
	var notes []string
	if l.dead > 0 {
		notes = append(notes, fmt.Sprintf("stuck: %d dead-lettered message(s), see batchgen dlq list", l.dead))
	}
	if !t.State.Final() && time.Since(t.UpdatedAt) > stuckAfter {
		notes = append(notes, fmt.Sprintf("no progress for %s (%s)", time.Since(t.UpdatedAt).Round(time.Minute), l.rerun))
	}
	if t.State.Final() && l.failed > 0 {
		notes = append(notes, "batchgen retry "+t.ID+" reruns the failed rows")
	}
	return strings.Join(notes, "; ")
}

// cmdCancel cancels a task: no new rows start, rows in flight finish, and
// the partial result is written (now if no run is active, else by the run).
func cmdCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	dir, rest, err := parseOps("cancel", args, stderr, nil)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if len(rest) != 1 {
		return &exitError{code: exitRejected, err: errors.New("usage: batchgen cancel [--data DIR] TASK (batchgen tasks lists them)")}
	}
	id := rest[0]
	st, err := openStateReadOnly(dir)
	if err != nil {
		return err
	}
	task, err := st.TransitionTask(ctx, store.TransitionTaskParams{
		ID: id, From: []store.TaskState{store.TaskPending, store.TaskRunning}, To: store.TaskCancelled,
		Error: "cancelled by operator", Now: time.Now(),
	})
	st.Close()
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &exitError{code: exitRejected, err: fmt.Errorf("no task %s in %s", id, dir)}
	case errors.Is(err, store.ErrConflict):
		return &exitError{code: exitRejected, err: fmt.Errorf("task %s cannot be cancelled: %v", id, err)}
	case err != nil:
		return fmt.Errorf("cancel %s: %w", id, err)
	}
	// With the lock free no run is working the task: write the partial
	// result now. Otherwise the run sees the cancel and writes it.
	data, err := openDataDir(dir, "")
	if err != nil {
		fmt.Fprintf(stdout, "task %s cancelled; the running batchgen finishes the rows in flight and writes the partial result\n", id)
		return nil
	}
	defer data.close()
	exporter := &pipeline.Exporter{Store: data.store, Blobs: data.blobs}
	task, err = exporter.Export(ctx, task.ID)
	if err != nil {
		return fmt.Errorf("task %s cancelled, but exporting the partial result failed: %w", id, err)
	}
	path, _ := data.blobs.Path(task.ResultKey)
	fmt.Fprintf(stdout, "task %s cancelled; partial result: %s\n", id, path)
	return nil
}

// cmdRetry reruns the failed rows of a finished task and writes a new result.
func cmdRetry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o runOptions
	var errorClass string
	dir, rest, err := parseOps("retry", args, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&o.out, "out", "", "result workbook; default <source>.result.xlsx beside the data directory")
		fs.StringVar(&errorClass, "error-class", "", "only rows that failed with this class (e.g. content_filter, retry_exhausted, insufficient_quota)")
		o.registerEngine(fs)
	})
	if errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if len(rest) != 1 {
		return &exitError{code: exitRejected, err: errors.New("usage: batchgen retry [--data DIR] [--out FILE] [--error-class CLASS] [provider flags] TASK")}
	}
	id := rest[0]
	j, err := newEngineJob(o, stderr)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "batchgen.db")); err != nil {
		return &exitError{code: exitRejected, err: fmt.Errorf("no batchgen data in %s (pass --data, the .batchgen folder beside the input)", dir)}
	}
	j.opts.dataDir = dir
	if j.data, err = openDataDir(dir, ""); err != nil {
		return err
	}
	defer j.close()
	task, err := j.data.store.GetTask(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return &exitError{code: exitRejected, err: fmt.Errorf("no task %s in %s (batchgen tasks --data %s lists them)", id, dir, dir)}
	} else if err != nil {
		return fmt.Errorf("read task %s: %w", id, err)
	}
	if task.Spec.Provider != o.provider.name || task.Spec.Model != o.provider.modelName() {
		return &exitError{code: exitRejected, err: fmt.Errorf("task %s ran with --provider %s --model %s; retry with the same (the endpoint and key may differ)", id, task.Spec.Provider, task.Spec.Model)}
	}
	if j.opts.out == "" {
		j.opts.out = filepath.Join(filepath.Dir(filepath.Clean(dir)), strings.TrimSuffix(task.Source, filepath.Ext(task.Source))+".result.xlsx")
	}
	if !strings.EqualFold(filepath.Ext(j.opts.out), ".xlsx") {
		return &exitError{code: exitRejected, err: fmt.Errorf("--out %s: use a name ending in .xlsx", j.opts.out)}
	}
	if err := j.openEngine(id); err != nil {
		return err
	}
	if !task.State.Final() {
		// A run died midway: retry just continues it.
		if err := j.recover(ctx, task); err != nil {
			return err
		}
	} else {
		reopened, n, err := pipeline.Reopen(ctx, j.data.store, j.queue, id, errorClass, time.Now())
		if errors.Is(err, store.ErrConflict) {
			return &exitError{code: exitRejected, err: err}
		}
		if err != nil {
			return err
		}
		if n == 0 {
			fmt.Fprintf(stderr, "batchgen: task %s has no failed rows%s to retry; writing its result again\n", id, classSuffix(errorClass))
		} else if !o.quiet {
			fmt.Fprintf(stderr, "batchgen: retrying task %s: %d batch(es) with failed rows%s\n", id, n, classSuffix(errorClass))
		}
		task = reopened
	}
	return j.complete(ctx, task, stdout)
}

func classSuffix(class string) string {
	if class == "" {
		return ""
	}
	return " of class " + class
}

// cmdDLQ lists or redrives dead-lettered messages: those of an embedded data
// directory, or, with --dlq-url, of the deployed SQS dead-letter queue
// (redrive uses SQS's message-move task).
func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "redrive") {
		return &exitError{code: exitRejected, err: errors.New("usage: batchgen dlq list|redrive [--data DIR | --queue-url URL --dlq-url URL]")}
	}
	verb := args[0]
	var queueURL, dlqURL string
	dir, _, err := parseOps("dlq "+verb, args[1:], stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&queueURL, "queue-url", "", "AWS: the work queue (stack output QueueUrl); with --dlq-url, works SQS instead of --data")
		fs.StringVar(&dlqURL, "dlq-url", "", "AWS: the dead-letter queue (stack output DlqUrl)")
	})
	if errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if queueURL != "" || dlqURL != "" {
		if queueURL == "" || dlqURL == "" {
			return &exitError{code: exitRejected, err: errors.New("--queue-url and --dlq-url go together (the stack outputs QueueUrl and DlqUrl)")}
		}
		return dlqSQS(ctx, verb, queueURL, dlqURL, stdout)
	}
	return dlqLocal(ctx, verb, dir, stdout)
}

// dlqSQS works the deployed queues through the default AWS configuration
// (AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL for an emulator).
func dlqSQS(ctx context.Context, verb, queueURL, dlqURL string, stdout io.Writer) error {
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	q := sqsqueue.New(sqs.NewFromConfig(cfg), queueURL, sqsqueue.Options{DLQURL: dlqURL})
	if verb == "redrive" {
		n, err := q.Redrive(ctx)
		if err != nil {
			return fmt.Errorf("redrive %s: %w", dlqURL, err)
		}
		fmt.Fprintf(stdout, "%d message(s) moved back to %s\n", n, queueURL)
		return nil
	}
	dead, err := q.ListDead(ctx, 1000)
	if err != nil {
		return fmt.Errorf("list %s: %w", dlqURL, err)
	}
	if len(dead) == 0 {
		fmt.Fprintf(stdout, "no dead-lettered messages in %s\n", dlqURL)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tBATCH\tRECEIVES\tMESSAGE\tBODY")
	for _, d := range dead {
		task, batch := "?", "?"
		if m, err := pipeline.DecodeBatchMessage(d.Body); err == nil {
			task, batch = m.TaskID, fmt.Sprint(m.BatchNo)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.60q\n", task, batch, d.ReceiveCount, d.ID, d.Body)
	}
	return tw.Flush()
}

func dlqLocal(ctx context.Context, verb, dir string, stdout io.Writer) error {
	st, err := openStateReadOnly(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	tasks, err := st.ListTasks(ctx, 0)
	if err != nil {
		return fmt.Errorf("list tasks: %w", err)
	}
	total := 0
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if verb == "list" {
		fmt.Fprintln(tw, "TASK\tBATCH\tRECEIVES\tMESSAGE\tBODY")
	}
	for _, t := range tasks {
		q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: queueName(t.ID), MaxReceive: maxReceive})
		if err != nil {
			return fmt.Errorf("open queue of %s: %w", t.ID, err)
		}
		if verb == "redrive" {
			n, err := q.Redrive(ctx)
			if err != nil {
				return fmt.Errorf("redrive dead letters of %s: %w", t.ID, err)
			}
			if n > 0 {
				fmt.Fprintf(stdout, "task %s: %d message(s) moved back to the queue; run batchgen run (or retry) to process them\n", t.ID, n)
			}
			total += n
			continue
		}
		dead, err := q.ListDead(ctx, 1000)
		if err != nil {
			return fmt.Errorf("list dead letters of %s: %w", t.ID, err)
		}
		for _, d := range dead {
			batch := "?"
			if m, err := pipeline.DecodeBatchMessage(d.Body); err == nil {
				batch = fmt.Sprint(m.BatchNo)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.60q\n", t.ID, batch, d.ReceiveCount, d.ID, d.Body)
			total++
		}
	}
	if verb == "list" {
		if total == 0 {
			fmt.Fprintf(stdout, "no dead-lettered messages in %s\n", dir)
			return nil
		}
		return tw.Flush()
	}
	if total == 0 {
		fmt.Fprintf(stdout, "no dead-lettered messages in %s\n", dir)
	}
	return nil
}
