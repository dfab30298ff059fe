package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// uploadsOf serves upload records from a map; a missing id is not found.
type uploadsOf map[string]pipeline.Upload

func (u uploadsOf) LookupUpload(_ context.Context, id string) (pipeline.Upload, error) {
	up, ok := u[id]
	if !ok {
		return pipeline.Upload{}, blob.ErrNotFound
	}
	return up, nil
}

// TestIntakeOwners: an API upload's task belongs to its uploader, a plain
// drop-folder input (split or rejected) to the configured principal, and
// only the owner gets a task through OwnedTask and ListOwnedTasks.
func TestIntakeOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	spec := store.TaskSpec{Prompt: "Copy for {{name}}", Provider: "sim", BatchSize: 2}
	intake := pipeline.NewIntake(e.splitter, e.blobs, e.signal, pipeline.IntakeConfig{
		DefaultSpec: spec, TempDir: t.TempDir(), Owner: "ops-team",
		Uploads: uploadsOf{"upload1": {Spec: spec, Filename: "mine.csv", Owner: "alice"}},
	})
	for key, content := range map[string]string{
		"incoming/upload1/mine.csv": "id,name\n1,brick\n",
		"incoming/dropped.csv":      "id,name\n1,ball\n",
		"incoming/rejected.csv":     "id\n1\n",
	} {
		if err := e.blobs.Put(ctx, key, strings.NewReader(content)); err != nil {
			t.Fatal(err)
		}
	}
	owners := map[string]string{}
	ids := map[string]string{}
	for _, key := range []string{"incoming/upload1/mine.csv", "incoming/dropped.csv", "incoming/rejected.csv"} {
		res, err := intake.Accept(ctx, key, "v1")
		if err != nil {
			t.Fatalf("Accept(%s): %v", key, err)
		}
		task, err := e.store.GetTask(ctx, res.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		owners[key], ids[key] = task.Owner, task.ID
	}
	want := map[string]string{"incoming/upload1/mine.csv": "alice", "incoming/dropped.csv": "ops-team", "incoming/rejected.csv": "ops-team"}
	if diff := cmp.Diff(want, owners); diff != "" {
		t.Errorf("owners (-want +got):\n%s", diff)
	}

	mine := ids["incoming/upload1/mine.csv"]
	if _, err := pipeline.OwnedTask(ctx, e.store, "alice", mine); err != nil {
		t.Errorf("owner reads own task: %v", err)
	}
	for _, who := range []string{"ops-team", "", "ALICE"} {
		if _, err := pipeline.OwnedTask(ctx, e.store, who, mine); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("OwnedTask by %q = %v, want ErrNotFound", who, err)
		}
	}
	page, err := pipeline.ListOwnedTasks(ctx, e.store, "ops-team", store.TaskCursor{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Tasks) != 1 || page.Next.ID != page.Tasks[0].ID {
		t.Fatalf("first page of 1 = %d tasks, next %+v; want 1 and a cursor at it", len(page.Tasks), page.Next)
	}
	rest, err := pipeline.ListOwnedTasks(ctx, e.store, "ops-team", page.Next, 10)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{page.Tasks[0].ID}
	for _, task := range rest.Tasks {
		got = append(got, task.ID)
	}
	if rest.Next != (store.TaskCursor{}) || len(got) != 2 || got[0] == got[1] || got[0] == mine || got[1] == mine {
		t.Errorf("ops-team's tasks over two pages = %v (next %+v); want its two tasks, then no cursor", got, rest.Next)
	}
}

func TestTaskProgress(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		task store.Task
		now  time.Time
		want pipeline.Progress
	}{
		{"nothing done", store.Task{State: store.TaskRunning, RowsTotal: 10, CreatedAt: start}, start.Add(time.Minute),
			pipeline.Progress{Total: 10}},
		{"half way", store.Task{State: store.TaskRunning, RowsTotal: 100, RowsSucceeded: 40, RowsFailed: 5, RowsSkipped: 5, CreatedAt: start}, start.Add(10 * time.Second),
			pipeline.Progress{Done: 50, Total: 100, RowsPerSecond: 5, ETA: 10 * time.Second}},
		{"finished", store.Task{State: store.TaskSucceeded, RowsTotal: 30, RowsSucceeded: 30, CreatedAt: start, FinishedAt: start.Add(3 * time.Second)}, start.Add(time.Hour),
			pipeline.Progress{Done: 30, Total: 30, RowsPerSecond: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, pipeline.TaskProgress(tt.task, tt.now)); diff != "" {
				t.Errorf("progress (-want +got):\n%s", diff)
			}
		})
	}
}
