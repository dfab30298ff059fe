package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/samstack/localrun"
	"github.com/batchgen/batchgen/internal/store"
)

type runOptions struct {
	stack      stackFlags
	model      modelFlags
	template   string
	reuse      bool
	cleanup    bool
	once       string
	out        string
	timeout    time.Duration
	generators int
	poll       time.Duration
	progress   time.Duration
	sweepEvery time.Duration
	logLevel   string
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	var o runOptions
	fs := flag.NewFlagSet("batchgen-localaws", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		usage(stderr)
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	o.stack.register(fs, getenv)
	o.model.register(fs)
	fs.StringVar(&o.template, "template", "template.yaml", "the SAM template to provision from")
	fs.BoolVar(&o.reuse, "reuse", false, "use the stack an earlier run provisioned under --prefix, if it still exists")
	fs.BoolVar(&o.cleanup, "cleanup", false, "delete the resources this run provisioned when it ends")
	fs.StringVar(&o.once, "once", "", "upload `FILE`, run until its task is final, download the result and exit")
	fs.StringVar(&o.out, "out", "", "with --once, where the result goes (default: FILE's name with .result.xlsx)")
	fs.DurationVar(&o.timeout, "timeout", 0, "with --once, give up after this long (0: no limit)")
	fs.IntVar(&o.generators, "generators", 2, "generator instances the event source mapping feeds")
	fs.DurationVar(&o.poll, "poll", time.Second, "how often incoming/ is listed for new objects")
	fs.DurationVar(&o.progress, "progress", 2*time.Second, "how often task progress is checked")
	fs.DurationVar(&o.sweepEvery, "sweep-every", time.Minute, "the sweeper's schedule (template.yaml: rate(1 minute))")
	fs.StringVar(&o.logLevel, "log-level", "warn", "the handlers' JSON logs on stderr: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &report.ExitError{Code: report.Rejected}
	}
	if fs.NArg() > 0 {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("unexpected arguments %q (upload a file with: go run ./cmd/batchgen-localaws upload FILE)", fs.Args())}
	}
	if o.generators < 1 || o.poll <= 0 || o.progress <= 0 || o.sweepEvery <= 0 || o.timeout < 0 {
		return &report.ExitError{Code: report.Rejected, Err: errors.New("--generators must be >= 1; --poll, --progress, --sweep-every > 0; --timeout >= 0")}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)}
	}
	// Check the settings before provisioning anything.
	if _, err := functionEnv(&samstack.Resources{}, fs, &o.model, getenv); err != nil {
		return err
	}
	var input []byte
	if o.once != "" {
		b, err := os.ReadFile(o.once)
		if err != nil {
			return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("--once: %w", err)}
		}
		input = b
		if o.out == "" {
			o.out = strings.TrimSuffix(o.once, filepath.Ext(o.once)) + ".result.xlsx"
		}
	}
	cfg, endpoint, err := emulator(ctx)
	if err != nil {
		return err
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}

	res, how, err := provision(ctx, cfg, endpoint, o)
	if err != nil {
		return err
	}
	if how == "provisioned" && o.cleanup {
		defer func() {
			if err := res.Cleanup(context.WithoutCancel(ctx)); err != nil {
				fmt.Fprintf(stderr, "batchgen-localaws: clean up: %v\n", err)
			}
			os.Remove(o.stack.statePath())
		}()
	}
	env, err := functionEnv(res, fs, &o.model, getenv)
	if err != nil {
		return err
	}
	stack, err := localrun.New(ctx, localrun.Config{
		AWS: cfg, Resources: res, Env: env,
		Generators: o.generators,
		Log:        stderr, LogLevel: level,
		// The definition's retry intervals (5s, doubling, for a task not
		// ready to export) are for a deployment, not a developer's wait.
		IntervalScale: 0.1,
	})
	if err != nil {
		return err
	}
	banner(stdout, o, endpoint, how, res, env)

	r := &runner{stack: stack, out: stdout, tracked: map[string]string{}}
	if o.once == "" {
		if err := r.serve(ctx, o, nil); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "stopped")
		return nil
	}
	return r.once(ctx, o, input)
}

// provision returns the stack's resources: the recorded ones under --reuse
// if they still exist, else new ones from the template (recorded for
// --reuse, upload and download). how says which.
func provision(ctx context.Context, cfg aws.Config, endpoint string, o runOptions) (*samstack.Resources, string, error) {
	path := o.stack.statePath()
	res, err := loadState(path, endpoint)
	if err == nil {
		if err := stackExists(ctx, cfg, res); err != nil {
			res = nil // the emulator restarted since
		}
	} else if !errors.Is(err, errNoState) {
		return nil, "", err
	}
	switch {
	case res != nil && o.reuse:
		return res, "reused", nil
	case res != nil:
		return nil, "", &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("a stack %q from an earlier run is on %s; pass --reuse to use it, or --prefix NAME for a new one", o.stack.prefix, endpoint)}
	}
	if _, err := os.Stat(o.template); err != nil {
		return nil, "", &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("template: %w (run from the repository root or pass --template)", err)}
	}
	res, err = samstack.Provision(ctx, cfg, o.template, o.stack.prefix)
	if err != nil {
		return nil, "", err
	}
	if err := saveState(path, stackState{Endpoint: endpoint, Resources: res}); err != nil {
		return nil, "", errors.Join(err, res.Cleanup(context.WithoutCancel(ctx)))
	}
	return res, "provisioned", nil
}

// banner prints where things are and how to use them.
func banner(w io.Writer, o runOptions, endpoint, how string, res *samstack.Resources, env awswire.Env) {
	p := prefixArg(o.stack.prefix)
	fmt.Fprintf(w, "stack %q %s on %s\n", o.stack.prefix, how, endpoint)
	fmt.Fprintf(w, "  bucket         %s\n", res.BucketName)
	fmt.Fprintf(w, "  queue          %s\n", res.QueueURL)
	fmt.Fprintf(w, "  dead letters   %s\n", res.DLQURL)
	fmt.Fprintf(w, "  table          %s\n", res.TableName)
	fmt.Fprintf(w, "  state machine  %s\n", res.StateMachineArn)
	fmt.Fprintf(w, "  model          %s, %d rows a batch\n", describeModel(env), env.BatchSize)
	if o.once != "" {
		return
	}
	fmt.Fprintf(w, `Drop a sheet (a workbook whose "prompt" sheet holds the template) into s3://%s/%s:
  go run ./cmd/batchgen-localaws upload%s FILE
Results land in s3://%s/results/<name>.result.xlsx (rejected inputs: results/<name>.<ext>.error.txt):
  go run ./cmd/batchgen-localaws download%s --out FILE TASK
Ctrl-C stops. go run ./cmd/batchgen-localaws --reuse%s carries on; batches the stopped
run held come back when their lease and the message's visibility timeout run out.
`, res.BucketName, pipeline.IncomingPrefix, p, res.BucketName, p, p)
}

// runner runs the stack's loops and reports progress.
type runner struct {
	stack *localrun.Stack
	out   io.Writer

	mu sync.Mutex
	// tracked maps each task seen to its last progress line.
	tracked map[string]string
	order   []string
}

// serve runs the drop-folder watch, the event source mapping, the sweeper
// and the progress report until ctx ends, or until until (if non-nil)
// reports true. It returns an error only when the drop folder cannot be
// listed.
func (r *runner) serve(ctx context.Context, o runOptions, until func(context.Context) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var watchErr error
	logErr := func(what string) func(error) {
		return func(err error) { r.printf("%s: %v", what, err) }
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		err := r.stack.Watch(ctx, o.poll, func(s localrun.Split) {
			if s.Err != nil {
				r.printf("split %s: %v (retrying)", s.Key, s.Err)
				return
			}
			r.track(s.TaskID, s.Key)
		})
		if err != nil {
			watchErr = err
			cancel()
		}
	})
	wg.Go(func() { r.stack.SweepEvery(ctx, o.sweepEvery, logErr("sweep")) })
	wg.Go(func() {
		tick := time.NewTicker(o.progress)
		defer tick.Stop()
		for {
			r.report(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	onErr := func(err error) error {
		r.printf("%v (the messages come back after their visibility timeout)", err)
		return nil
	}
	_ = r.stack.Pump(ctx, until, onErr) // onErr never stops it
	cancel()
	wg.Wait()
	r.report(context.WithoutCancel(ctx))
	return watchErr
}

func (r *runner) printf(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.out, time.Now().Format("15:04:05 ")+format+"\n", a...)
}

// track adds a task to the progress report.
func (r *runner) track(taskID, key string) {
	r.mu.Lock()
	_, ok := r.tracked[taskID]
	if !ok {
		r.tracked[taskID] = ""
		r.order = append(r.order, taskID)
	}
	r.mu.Unlock()
	if !ok {
		r.printf("task %s  %s handed to the splitter", taskID, key)
	}
}

// report prints a line for every tracked task whose progress changed.
func (r *runner) report(ctx context.Context) {
	r.mu.Lock()
	ids := slices.Clone(r.order)
	r.mu.Unlock()
	for _, id := range ids {
		t, err := r.stack.Store.GetTask(ctx, id)
		if err != nil {
			continue // not split yet
		}
		line := progressLine(t, r.stack.Resources.BucketName)
		r.mu.Lock()
		changed := r.tracked[id] != line
		r.tracked[id] = line
		r.mu.Unlock()
		if changed {
			r.printf("%s", line)
		}
	}
}

// progressLine is one task's state for people.
func progressLine(t store.Task, bucket string) string {
	done := t.RowsSucceeded + t.RowsFailed + t.RowsSkipped
	line := fmt.Sprintf("task %s  %-9s rows %d/%d done (%d failed), batches %d/%d", t.ID, t.State, done, t.RowsTotal, t.RowsFailed, t.BatchesDone, t.BatchesTotal)
	if t.ResultKey != "" {
		line += fmt.Sprintf("  result s3://%s/%s", bucket, t.ResultKey)
	}
	if t.Error != "" {
		line += "  error: " + t.Error
	}
	return line
}

// once uploads the input, runs until its task is final, downloads the
// result and prints the summary.
func (r *runner) once(ctx context.Context, o runOptions, input []byte) error {
	started := time.Now()
	ev, err := r.stack.Upload(ctx, filepath.Base(o.once), input)
	if err != nil {
		return err
	}
	taskID, err := r.stack.TaskID(ev)
	if err != nil {
		return err
	}
	r.printf("uploaded %s to s3://%s/%s", o.once, r.stack.Resources.BucketName, localrun.IncomingKey(filepath.Base(o.once)))
	if err := r.serve(ctx, o, func(ctx context.Context) bool { return r.stack.TaskFinal(ctx, taskID) }); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("task %s is not final after --timeout %v", taskID, o.timeout)
		}
		return &report.ExitError{Code: report.Interrupted, Err: fmt.Errorf("interrupted; task %s goes on with: go run ./cmd/batchgen-localaws --reuse%s", taskID, prefixArg(o.stack.prefix))}
	}
	task, err := r.stack.Store.GetTask(ctx, taskID)
	if err != nil {
		return fmt.Errorf("read task %s: %w", taskID, err)
	}
	if !task.State.Final() {
		return fmt.Errorf("task %s stopped %s", taskID, task.State)
	}
	out := ""
	if task.ResultKey != "" {
		if err := r.stack.Download(ctx, task.ResultKey, o.out); err != nil {
			return err
		}
		out = o.out
	}
	fmt.Fprint(r.out, summary(task, time.Since(started), out))
	return exitFor(task)
}

// summary is what --once prints at the end, in batchgen run's layout.
func summary(t store.Task, elapsed time.Duration, out string) string {
	return report.Summary{
		Task:    t,
		Rows:    report.Rows{Total: t.RowsTotal, Succeeded: t.RowsSucceeded, Failed: t.RowsFailed, Skipped: t.RowsSkipped},
		Elapsed: elapsed,
		Result:  out,
	}.String()
}

// exitFor maps a final task to the exit code batchgen run would give.
func exitFor(t store.Task) error { return report.ForTask(t, t.RowsFailed) }
