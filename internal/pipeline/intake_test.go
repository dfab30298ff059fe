package pipeline_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// TestIntake drops files into a folder and hands each key to Intake, as the
// splitter Lambda and a local drop folder do: sheets are split once,
// anything else is ignored, and bad input becomes a FAILED task with an
// error file.
func TestIntake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	spec := store.TaskSpec{Prompt: "Copy for {{name}}", Provider: "sim", BatchSize: 2}
	intake := pipeline.NewIntake(e.splitter, e.blobs, e.signal, pipeline.IntakeConfig{
		DefaultSpec: spec, Limits: sheet.Limits{MaxFileBytes: 200}, TempDir: t.TempDir(),
	})
	put := func(key, content string) {
		t.Helper()
		if err := e.blobs.Put(ctx, key, strings.NewReader(content)); err != nil {
			t.Fatal(err)
		}
	}
	put("incoming/products.csv", "id,name\n1,brick\n2,ball\n3,kite\n")
	put("incoming/notes.txt", "not a sheet")
	put("incoming/bad.csv", "id,name\n1,brick\n")
	put("incoming/big.CSV", "id,name\n"+strings.Repeat("1,"+strings.Repeat("x", 50)+"\n", 5))
	put("incoming/empty.csv", "id,name\n")

	type got struct {
		Outcome pipeline.IntakeOutcome
		State   store.TaskState
		Error   string
	}
	accept := func(key, version string) got {
		t.Helper()
		res, err := intake.Accept(ctx, key, version)
		if err != nil {
			t.Fatalf("Accept(%s): %v", key, err)
		}
		g := got{Outcome: res.Outcome}
		if res.TaskID != "" {
			task, err := e.store.GetTask(ctx, res.TaskID)
			if err != nil {
				t.Fatalf("task of %s: %v", key, err)
			}
			g.State, g.Error = task.State, task.Error
		}
		return g
	}
	if diff := cmp.Diff(got{Outcome: pipeline.IntakeSplit, State: store.TaskRunning}, accept("incoming/products.csv", "v1")); diff != "" {
		t.Errorf("a sheet (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(got{Outcome: pipeline.IntakeIgnored, State: store.TaskRunning}, accept("incoming/products.csv", "v1")); diff != "" {
		t.Errorf("the same version again (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(got{Outcome: pipeline.IntakeIgnored}, accept("incoming/notes.txt", "v1")); diff != "" {
		t.Errorf("not a sheet (-want +got):\n%s", diff)
	}
	if got := accept("incoming/big.CSV", "v1"); got.Outcome != pipeline.IntakeRejected || got.State != store.TaskFailed || !strings.Contains(got.Error, "big.CSV: the file is") {
		t.Errorf("a file over the limit: %+v, want a FAILED task naming the file and the limit", got)
	}
	if errFile := readBlob(t, e, pipeline.ErrorFileKey("incoming/big.CSV")); !strings.Contains(errFile, "the limit is 200 bytes") {
		t.Errorf("error file = %q, want the reason", errFile)
	}
	// The default spec's prompt names a column the sheet lacks.
	other := pipeline.NewIntake(e.splitter, e.blobs, e.signal, pipeline.IntakeConfig{
		DefaultSpec: store.TaskSpec{Prompt: "{{price}}", Provider: "sim"}, TempDir: t.TempDir(),
	})
	res, err := other.Accept(ctx, "incoming/bad.csv", "v1")
	if err != nil || res.Outcome != pipeline.IntakeRejected {
		t.Fatalf("unknown placeholder: %+v, %v; want rejected", res, err)
	}
	if errFile := readBlob(t, e, "results/bad.csv.error.txt"); !strings.Contains(errFile, "price") {
		t.Errorf("error file = %q, want the unknown placeholder named", errFile)
	}
	if got := accept("incoming/empty.csv", "v1"); got.Outcome != pipeline.IntakeRejected || !strings.Contains(got.Error, "no data rows") {
		t.Errorf("a sheet with no rows: %+v, want rejected", got)
	}
}

func readBlob(t *testing.T, e *env, key string) string {
	t.Helper()
	rc, err := e.blobs.Open(context.Background(), key)
	if err != nil {
		t.Fatalf("open %s: %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
