package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awsemu/localstack"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// cmdUpload puts a file into the stack's drop folder, where a running
// batchgen-localaws finds it on its next poll: the aws CLI's
// `aws s3 cp FILE s3://BUCKET/incoming/` without needing the CLI.
func cmdUpload(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	var f stackFlags
	fs := flag.NewFlagSet("upload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, getenv)
	name := fs.String("name", "", "object name under incoming/ (default: the file's name)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: batchgen-localaws upload [--prefix P] [--name NAME] FILE")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &exitError{code: exitRejected}
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return &exitError{code: exitRejected}
	}
	path := fs.Arg(0)
	if *name == "" {
		*name = filepath.Base(path)
	}
	body, err := os.ReadFile(path)
	if err != nil {
		return &exitError{code: exitRejected, err: err}
	}
	cfg, endpoint, err := emulator(ctx)
	if err != nil {
		return err
	}
	res, err := recorded(ctx, cfg, endpoint, f)
	if err != nil {
		return err
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })
	if _, err := localstack.Upload(ctx, client, res.BucketName, cfg.Region, *name, body); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "uploaded %s to s3://%s/%s (%d bytes); the running batchgen-localaws splits it on its next poll\n",
		path, res.BucketName, localstack.IncomingKey(*name), len(body))
	return nil
}

// cmdDownload fetches a task's result.
func cmdDownload(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	var f stackFlags
	fs := flag.NewFlagSet("download", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, getenv)
	out := fs.String("out", "", "where the result goes (default: TASK.result.xlsx)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: batchgen-localaws download [--prefix P] [--out FILE] TASK")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &exitError{code: exitRejected}
	}
	if fs.NArg() != 1 || !api.ValidTaskID(fs.Arg(0)) {
		fs.Usage()
		return &exitError{code: exitRejected}
	}
	taskID := fs.Arg(0)
	if *out == "" {
		*out = taskID + ".result.xlsx"
	}
	cfg, endpoint, err := emulator(ctx)
	if err != nil {
		return err
	}
	res, err := recorded(ctx, cfg, endpoint, f)
	if err != nil {
		return err
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })
	if err := localstack.Download(ctx, client, res.BucketName, pipeline.ResultKey(taskID), *out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "downloaded s3://%s/%s to %s\n", res.BucketName, pipeline.ResultKey(taskID), *out)
	return nil
}
