//go:build emulator

package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/dynamostore"
)

// TestOwnerlessTaskOnAWS: a task item without an owner (written before
// tasks had owners) is nobody's through the API's rule, the drop-folder
// principal's included, yet `batchgen tasks --table` and `status --table`
// still show it, marked, beside an owned one.
func TestOwnerlessTaskOnAWS(t *testing.T) {
	ctx := context.Background()
	cfg, res := deployedStack(t, "ownerless")
	st := dynamostore.New(dynamodb.NewFromConfig(cfg), res.TableName, dynamostore.Options{})
	now := time.Now()
	spec := store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 2}
	tasks := []store.Task{
		{ID: "t-ownerless-1", State: store.TaskSucceeded, Source: "incoming/old.xlsx", RowsTotal: 2, RowsSucceeded: 2, Spec: spec, Header: []string{"a"}, CreatedAt: now.Add(-time.Minute), UpdatedAt: now},
		{ID: "t-owned-1", State: store.TaskSucceeded, Source: "incoming/new.xlsx", RowsTotal: 2, RowsSucceeded: 2, Owner: pipeline.LocalOwner, Spec: spec, Header: []string{"a"}, CreatedAt: now, UpdatedAt: now},
	}
	for _, task := range tasks {
		if err := st.CreateTask(ctx, task); err != nil {
			t.Fatal(err)
		}
	}

	for _, who := range []string{pipeline.LocalOwner, "drop", "alice"} {
		if _, err := pipeline.OwnedTask(ctx, st, who, "t-ownerless-1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("OwnedTask(%q) of the owner-less task = %v, want ErrNotFound", who, err)
		}
	}
	page, err := pipeline.ListOwnedTasks(ctx, st, pipeline.LocalOwner, store.TaskCursor{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, task := range page.Tasks {
		listed = append(listed, task.ID)
	}
	if len(listed) != 1 || listed[0] != "t-owned-1" {
		t.Errorf("%s's tasks = %v, want only t-owned-1", pipeline.LocalOwner, listed)
	}

	r := runBinary(t, ctx, "tasks", "--table", res.TableName)
	if r.code != 0 {
		t.Fatalf("tasks --table: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	lines := map[string]string{}
	for _, line := range strings.Split(r.stdout, "\n") {
		if id, _, ok := strings.Cut(line, " "); ok {
			lines[id] = line
		}
	}
	if l := lines["t-ownerless-1"]; !strings.Contains(l, "SUCCEEDED") || !strings.Contains(l, "no owner: not visible through the API") {
		t.Errorf("tasks --table shows the owner-less task as %q, want it SUCCEEDED and marked\n%s", l, r.stdout)
	}
	if l := lines["t-owned-1"]; l == "" || strings.Contains(l, "no owner") {
		t.Errorf("tasks --table shows the owned task as %q, want it listed unmarked\n%s", l, r.stdout)
	}
	if r := runBinary(t, ctx, "status", "t-ownerless-1", "--table", res.TableName); r.code != 0 || !strings.Contains(r.stdout, "t-ownerless-1  SUCCEEDED") {
		t.Errorf("status --table of the owner-less task: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
