//go:build emulator

package stepfn_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/stepfn"
)

// TestStartExportIdempotent starts the export of one task twice on the state
// machine provisioned from template.yaml: one execution, named after the
// task, with the documented input; the second start is a no-op.
func TestStartExportIdempotent(t *testing.T) {
	ctx := t.Context()
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatalf("emulator: %v", err)
	}
	res, err := samstack.Provision(ctx, cfg, "../../template.yaml", samstack.UniquePrefix("sfn"))
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		if err := res.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	client := sfn.NewFromConfig(cfg)
	starter := stepfn.Starter{Client: client, StateMachineARN: res.StateMachineArn}

	const task = "3f1a9c0e5b7d2a4c6e8f"
	for i := range 2 {
		if err := starter.StartExport(ctx, task, 0); err != nil {
			t.Fatalf("start #%d: %v", i+1, err)
		}
	}
	// Another task gets its own execution.
	if err := starter.StartExport(ctx, "another-task", 0); err != nil {
		t.Fatalf("start another task: %v", err)
	}

	out, err := client.ListExecutions(ctx, &sfn.ListExecutionsInput{StateMachineArn: aws.String(res.StateMachineArn)})
	if err != nil {
		t.Fatalf("list executions: %v", err)
	}
	inputs := map[string]map[string]string{}
	for _, e := range out.Executions {
		desc, err := client.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: e.ExecutionArn})
		if err != nil {
			t.Fatalf("describe execution %s: %v", aws.ToString(e.Name), err)
		}
		var in map[string]string
		if err := json.Unmarshal([]byte(aws.ToString(desc.Input)), &in); err != nil {
			t.Fatalf("execution %s input %q: %v", aws.ToString(e.Name), aws.ToString(desc.Input), err)
		}
		if _, dup := inputs[aws.ToString(e.Name)]; dup {
			t.Errorf("two executions named %s", aws.ToString(e.Name))
		}
		inputs[aws.ToString(e.Name)] = in
	}
	want := map[string]map[string]string{
		task:           {"task_id": task},
		"another-task": {"task_id": "another-task"},
	}
	if d := cmp.Diff(want, inputs); d != "" {
		t.Errorf("executions by name (-want +got):\n%s", d)
	}

	// Once the execution has closed (here it fails: the exporter function
	// is a placeholder), Step Functions refuses the name with
	// ExecutionAlreadyExists, and a start is still a no-op.
	arn := waitClosed(t, client, res.StateMachineArn, task)
	_, err = client.StartExecution(ctx, &sfn.StartExecutionInput{
		StateMachineArn: aws.String(res.StateMachineArn), Name: aws.String(task), Input: aws.String(`{"task_id":"` + task + `"}`),
	})
	var exists *types.ExecutionAlreadyExists
	if !errors.As(err, &exists) {
		t.Fatalf("raw StartExecution of a closed execution's name: error = %v, want ExecutionAlreadyExists", err)
	}
	if err := starter.StartExport(ctx, task, 0); err != nil {
		t.Errorf("start after the execution closed: %v", err)
	}
	out, err = client.ListExecutions(ctx, &sfn.ListExecutionsInput{StateMachineArn: aws.String(res.StateMachineArn)})
	if err != nil {
		t.Fatalf("list executions: %v", err)
	}
	if len(out.Executions) != 2 {
		t.Errorf("%d executions after the restart, want 2", len(out.Executions))
	}
	if got := aws.ToString(out.Executions[0].ExecutionArn) + aws.ToString(out.Executions[1].ExecutionArn); !strings.Contains(got, arn) {
		t.Errorf("executions %s do not include the original %s", got, arn)
	}

	// A retried task (export generation 1) is exported again under its own
	// name, with the same input, although the first name is taken.
	if err := starter.StartExport(ctx, task, 1); err != nil {
		t.Fatalf("start generation 1: %v", err)
	}
	out, err = client.ListExecutions(ctx, &sfn.ListExecutionsInput{StateMachineArn: aws.String(res.StateMachineArn)})
	if err != nil {
		t.Fatalf("list executions: %v", err)
	}
	var names []string
	for _, e := range out.Executions {
		names = append(names, aws.ToString(e.Name))
	}
	slices.Sort(names)
	if d := cmp.Diff([]string{task, task + "-g1", "another-task"}, names); d != "" {
		t.Errorf("executions after a re-export (-want +got):\n%s", d)
	}
}

// waitClosed polls until the execution named name is no longer RUNNING and
// returns its ARN, or fails the test.
func waitClosed(t *testing.T, client *sfn.Client, machine, name string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err := client.ListExecutions(t.Context(), &sfn.ListExecutionsInput{StateMachineArn: aws.String(machine)})
		if err != nil {
			t.Fatalf("list executions: %v", err)
		}
		for _, e := range out.Executions {
			if aws.ToString(e.Name) == name && e.Status != types.ExecutionStatusRunning {
				return aws.ToString(e.ExecutionArn)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s still running after 30s", name)
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal("test cancelled")
		}
	}
}
