//go:build emulator

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/report"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/store/dynamostore"
)

// The --once mode against the emulator (AWS_ENDPOINT_URL; start it with
// infra/emulator/start.sh): upload, split, generate, export through the
// export state machine's definition, download.
//
//	go test -tags emulator ./cmd/batchgen-localaws/

const onceRows = 30

var onceHeader = []string{"商品名称", "类目"}

func onceRow(i int, filtered []int) []string {
	name := fmt.Sprintf("商品 %02d", i)
	if slices.Contains(filtered, i) {
		name += " [[filter]]"
	}
	return []string{name, []string{"玩具", "文具"}[i%2]}
}

// writeSheet writes a workbook of onceRows rows with a prompt sheet.
func writeSheet(t *testing.T, path string, filtered []int) {
	t.Helper()
	f := excelize.NewFile()
	defer f.Close()
	set := func(sheet string, r int, values []string) {
		for c, v := range values {
			cell, err := excelize.CoordinatesToCellName(c+1, r)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.SetCellStr(sheet, cell, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	set("Sheet1", 1, onceHeader)
	for i := 1; i <= onceRows; i++ {
		set("Sheet1", i+1, onceRow(i, filtered))
	}
	if _, err := f.NewSheet("prompt"); err != nil {
		t.Fatal(err)
	}
	set("prompt", 1, []string{"为{{商品名称}}写文案"})
	if err := f.SaveAs(path); err != nil {
		t.Fatal(err)
	}
}

// readResult returns the downloaded workbook's rows, each padded to the
// header's width.
func readResult(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := excelize.OpenFile(path)
	if err != nil {
		t.Fatalf("the result is not a workbook: %v", err)
	}
	defer f.Close()
	rows, err := f.GetRows(f.GetSheetList()[0])
	if err != nil {
		t.Fatal(err)
	}
	wantHeader := append(slices.Clone(onceHeader), pipeline.ResultColumns...)
	if len(rows) == 0 {
		t.Fatal("the result is empty")
	}
	if diff := cmp.Diff(wantHeader, rows[0]); diff != "" {
		t.Errorf("result header mismatch (-want +got):\n%s", diff)
	}
	for i := range rows {
		for len(rows[i]) < len(wantHeader) {
			rows[i] = append(rows[i], "")
		}
	}
	return rows
}

// TestOnce provisions a stack (deleted again by --cleanup), runs a sheet
// through it on the simulator and checks every row came back in order.
func TestOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "skus.xlsx"), filepath.Join(dir, "skus.result.xlsx")
	writeSheet(t, in, nil)
	stateDir := filepath.Join(dir, "state")
	prefix := samstack.UniquePrefix("lclaws")
	var stdout, stderr bytes.Buffer
	code := runMain(t.Context(), []string{
		"--once", in, "--out", out, "--prefix", prefix, "--template", "../../template.yaml", "--state-dir", stateDir,
		"--cleanup", "--sim-latency", "1ms", "--batch-size", "7", "--timeout", "3m",
	}, &stdout, &stderr, noenv)
	if code != report.OK {
		t.Fatalf("exit code = %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{fmt.Sprintf("stack %q provisioned", prefix), "SUCCEEDED", "rows      30  (succeeded 30, failed 0, skipped 0)", "result    " + out} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	rows := readResult(t, out)
	if len(rows) != onceRows+1 {
		t.Fatalf("result has %d data rows, want %d", len(rows)-1, onceRows)
	}
	for i := 1; i <= onceRows; i++ {
		in := onceRow(i, nil)
		got := []string{rows[i][0], rows[i][1], rows[i][3]}
		if diff := cmp.Diff([]string{in[0], in[1], "succeeded"}, got); diff != "" {
			t.Errorf("result row %d mismatch (-want +got):\n%s", i, diff)
		}
		if prompt := "为" + in[0] + "写文案"; !strings.Contains(rows[i][2], prompt) {
			t.Errorf("result row %d output %q does not quote its prompt %q", i, rows[i][2], prompt)
		}
	}
	if _, err := os.Stat(filepath.Join(stateDir, "localaws-"+prefix+".json")); !os.IsNotExist(err) {
		t.Errorf("--cleanup left the stack recorded: %v", err)
	}
	cfg, err := samstack.Config(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stackExists(t.Context(), cfg, &samstack.Resources{TableName: prefix + "-table", QueueURL: "x", DLQURL: "x", BucketName: prefix + "-bucket", StateMachineArn: "x"}); err == nil {
		t.Error("--cleanup left the stack on the emulator")
	}
}

// TestOnceReuse runs a sheet on a stack recorded by an earlier run
// (--reuse), with the model behind batchgen's mock server (--base-url); a
// row the provider refuses makes the task PARTIAL and the exit code 3.
func TestOnceReuse(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	prefix := samstack.UniquePrefix("lclaws")
	res, err := samstack.Provision(ctx, cfg, "../../template.yaml", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := res.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	sf := stackFlags{prefix: prefix, stateDir: stateDir}
	if err := saveState(sf.statePath(), stackState{Endpoint: os.Getenv(samstack.EndpointEnv), Resources: res}); err != nil {
		t.Fatal(err)
	}

	mock := mockserver.New(mockserver.Config{Seed: 1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srvCtx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- mock.Serve(srvCtx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("mock server: %v", err)
		}
	})

	filtered := []int{4}
	in, out := filepath.Join(dir, "list.xlsx"), filepath.Join(dir, "list.out.xlsx")
	writeSheet(t, in, filtered)
	var stdout, stderr bytes.Buffer
	code := runMain(ctx, []string{
		"--once", in, "--out", out, "--prefix", prefix, "--reuse", "--state-dir", stateDir, "--template", "no-such-template.yaml",
		"--base-url", "http://" + ln.Addr().String() + "/v1", "--timeout", "3m",
	}, &stdout, &stderr, noenv)
	if code != report.RowsFailed {
		t.Fatalf("exit code = %d, want %d\nstdout:\n%s\nstderr:\n%s", code, report.RowsFailed, stdout.String(), stderr.String())
	}
	for _, want := range []string{fmt.Sprintf("stack %q reused", prefix), "PARTIAL", "rows      30  (succeeded 29, failed 1, skipped 0)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	rows := readResult(t, out)
	if len(rows) != onceRows+1 {
		t.Fatalf("result has %d data rows, want %d", len(rows)-1, onceRows)
	}
	for i := 1; i <= onceRows; i++ {
		in := onceRow(i, filtered)
		want := []string{in[0], in[1], "Copy for: 为" + in[0] + "写文案", "succeeded", ""}
		if slices.Contains(filtered, i) {
			want = []string{in[0], in[1], "", "failed", "content_filter"}
		}
		got := []string{rows[i][0], rows[i][1], rows[i][2], rows[i][3], rows[i][5]}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("result row %d mismatch (-want +got):\n%s", i, diff)
		}
	}
	// The dropped file's result is named after it, and download TASK finds
	// it there through the task (pipeline.TaskResultKey).
	tasks, err := dynamostore.New(dynamodb.NewFromConfig(cfg), res.TableName, dynamostore.Options{}).ListTasks(ctx, 10)
	if err != nil || len(tasks) != 1 {
		t.Fatalf("tasks = %+v, %v; want the one task", tasks, err)
	}
	if want := "results/list.result.xlsx"; tasks[0].ResultKey != want {
		t.Errorf("result key = %q, want %q", tasks[0].ResultKey, want)
	}
	again := filepath.Join(dir, "downloaded.xlsx")
	stdout.Reset()
	stderr.Reset()
	code = runMain(ctx, []string{"download", "--prefix", prefix, "--state-dir", stateDir, "--out", again, tasks[0].ID}, &stdout, &stderr, noenv)
	if code != report.OK {
		t.Fatalf("download exit code = %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	if want := fmt.Sprintf("downloaded s3://%s/results/list.result.xlsx to %s", res.BucketName, again); !strings.Contains(stdout.String(), want) {
		t.Errorf("download stdout = %q, want %q", stdout.String(), want)
	}
	first, _ := os.ReadFile(out)
	second, err := os.ReadFile(again)
	if err != nil || !bytes.Equal(first, second) {
		t.Errorf("download wrote %d bytes (%v), want the %d-byte result --once wrote", len(second), err, len(first))
	}
}
