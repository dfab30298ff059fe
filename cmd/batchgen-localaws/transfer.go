package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awswire/opswire"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/samstack/localrun"
	"github.com/batchgen/batchgen/internal/store"
)

// cmdUpload puts a file into the stack's drop folder, where a running
// batchgen-localaws finds it on its next poll: the aws CLI's
// `aws s3 cp FILE s3://BUCKET/incoming/` without needing the CLI.
func cmdUpload(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	var name *string
	t, err := connectTransfer(ctx, "upload", "[--prefix P] [--name NAME] FILE", args, stderr, getenv,
		func(fs *flag.FlagSet) {
			name = fs.String("name", "", "object name under incoming/ (default: the file's name)")
		}, nil)
	if err != nil || t == nil {
		return err
	}
	path := t.arg
	if *name == "" {
		*name = filepath.Base(path)
	}
	body, err := os.ReadFile(path)
	if err != nil {
		return &report.ExitError{Code: report.Rejected, Err: err}
	}
	if _, err := localrun.Upload(ctx, t.client, t.bucket, t.region, *name, body); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "uploaded %s to s3://%s/%s (%d bytes); the running batchgen-localaws splits it on its next poll\n",
		path, t.bucket, localrun.IncomingKey(*name), len(body))
	return nil
}

// cmdDownload fetches a task's result.
func cmdDownload(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	var out *string
	t, err := connectTransfer(ctx, "download", "[--prefix P] [--out FILE] TASK", args, stderr, getenv,
		func(fs *flag.FlagSet) {
			out = fs.String("out", "", "where the result goes (default: TASK.result.xlsx)")
		}, api.ValidTaskID)
	if err != nil || t == nil {
		return err
	}
	taskID := t.arg
	// The task says where its result is: a dropped file's result is named
	// after the input (pipeline.TaskResultKey), an API upload's after the
	// task. An unknown task falls back to the id-based key, whose absence
	// is reported below.
	key := pipeline.ResultKey(taskID)
	task, err := (&opswire.Stack{AWS: t.cfg}).Store(t.table).GetTask(ctx, taskID)
	switch {
	case err == nil && task.ResultKey != "":
		key = task.ResultKey
	case err == nil:
		key = pipeline.TaskResultKey(task)
	case !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("look up task %s: %w", taskID, err)
	}
	if *out == "" {
		*out = taskID + ".result" + path.Ext(key) // .xlsx, or .csv for a task that asked for a CSV result
	}
	err = localrun.Download(ctx, t.client, t.bucket, key, *out)
	var missing *s3types.NoSuchKey
	if errors.As(err, &missing) {
		return &report.ExitError{Code: report.Rejected, Err: fmt.Errorf("task %s has no result in s3://%s yet: it is unknown or not finished (the running batchgen-localaws logs its progress)", taskID, t.bucket)}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "downloaded s3://%s/%s to %s\n", t.bucket, key, *out)
	return nil
}

// transfer is a parsed upload/download command connected to the recorded
// stack's bucket.
type transfer struct {
	arg            string
	bucket, region string
	table          string
	cfg            aws.Config
	client         *s3.Client
}

// connectTransfer parses a transfer command's flags (extra adds its own),
// wants exactly one argument (that valid accepts, when given) and connects
// to the stack recorded under --prefix. A nil transfer with a nil error
// means -h was answered.
func connectTransfer(ctx context.Context, name, usage string, args []string, stderr io.Writer, getenv func(string) string,
	extra func(*flag.FlagSet), valid func(string) bool) (*transfer, error) {
	var f stackFlags
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, getenv)
	extra(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: batchgen-localaws %s %s\n", name, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil
		}
		return nil, &report.ExitError{Code: report.Rejected}
	}
	if fs.NArg() != 1 || (valid != nil && !valid(fs.Arg(0))) {
		fs.Usage()
		return nil, &report.ExitError{Code: report.Rejected}
	}
	cfg, endpoint, err := emulator(ctx)
	if err != nil {
		return nil, err
	}
	res, err := recorded(ctx, cfg, endpoint, f)
	if err != nil {
		return nil, err
	}
	return &transfer{
		arg: fs.Arg(0), bucket: res.BucketName, region: cfg.Region, table: res.TableName, cfg: cfg,
		client: s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true }),
	}, nil
}
