package pipeline_test

import (
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TestErrorFileKey: the reason for a rejected input lands under results/,
// beside where its result would have gone, keeping its sub-path.
func TestErrorFileKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ key, want string }{
		{"incoming/a.xlsx", "results/a.xlsx.error.txt"},
		{"incoming/abc/商品 list.csv", "results/abc/商品 list.csv.error.txt"},
	}
	for _, tc := range tests {
		if got := pipeline.ErrorFileKey(tc.key); got != tc.want {
			t.Errorf("ErrorFileKey(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestIsInputKey: only sheets under the drop folder are inputs, their
// extension in any letter case.
func TestIsInputKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]bool{
		"incoming/a.xlsx": true, "incoming/A.XLSX": true, "incoming/a.Xlsx": true, "incoming/x/a.CSV": true,
		"incoming/a.csv": true, "incoming/a.xlsm": true, "incoming/a.Tsv": true,
		"incoming/a.xls": false, "incoming/a.txt": false, "incoming/a.csv/": false, "incoming/": false,
		"results/a.xlsx": false, "Incoming/a.xlsx": false, "incoming/.xlsx": false, "incoming/a.xlsx.error.txt": false,
	} {
		if got := pipeline.IsInputKey(key); got != want {
			t.Errorf("IsInputKey(%q) = %v, want %v", key, got, want)
		}
	}
}

// TestIntakeSidecarPrompt: with sidecars on, an input without a prompt
// sheet takes its template from <name>.prompt.txt beside it, before the
// deployment's default; the sidecar is part of the task's identity, so the
// same file dropped again with another sidecar is another task; without
// sidecars (the deployed splitter) the file is ignored.
func TestIntakeSidecarPrompt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	def := store.TaskSpec{Prompt: "Default {{name}}", Provider: "sim", BatchSize: 2}
	newIntake := func(sidecars bool) *pipeline.Intake {
		return pipeline.NewIntake(e.splitter, e.blobs, e.signal, pipeline.IntakeConfig{DefaultSpec: def, Sidecars: sidecars, TempDir: t.TempDir()})
	}
	put := func(key, content string) {
		t.Helper()
		if err := e.blobs.Put(ctx, key, strings.NewReader(content)); err != nil {
			t.Fatal(err)
		}
	}
	const sheetKey = "incoming/team/products.csv"
	put(sheetKey, "id,name\n1,brick\n")
	if got := pipeline.SidecarPromptKey(sheetKey); got != "incoming/team/products.prompt.txt" {
		t.Fatalf("SidecarPromptKey = %q", got)
	}
	put(pipeline.SidecarPromptKey(sheetKey), "Sidecar {{name}}\r\n")

	promptOf := func(in *pipeline.Intake, version string) (string, string) {
		t.Helper()
		res, err := in.Accept(ctx, sheetKey, version)
		if err != nil || res.Outcome != pipeline.IntakeSplit {
			t.Fatalf("Accept: %+v, %v; want split", res, err)
		}
		task, err := e.store.GetTask(ctx, res.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		return task.Spec.Prompt, task.ID
	}
	withSidecar, first := promptOf(newIntake(true), "v1")
	if withSidecar != "Sidecar {{name}}" {
		t.Errorf("prompt with a sidecar = %q, want the sidecar's", withSidecar)
	}
	without, plain := promptOf(newIntake(false), "v1")
	if without != "Default {{name}}" {
		t.Errorf("prompt with sidecars off = %q, want the default", without)
	}
	if plain == first {
		t.Errorf("the same version with and without a sidecar is one task %s; want two", first)
	}
	put(pipeline.SidecarPromptKey(sheetKey), "Other {{name}}")
	other, second := promptOf(newIntake(true), "v1")
	if other != "Other {{name}}" || second == first {
		t.Errorf("after the sidecar changed: prompt %q task %s (first %s); want the new prompt in a new task", other, second, first)
	}
	if diff := cmp.Diff("processed/team/products.csv", pipeline.ProcessedKey(sheetKey)); diff != "" {
		t.Errorf("ProcessedKey (-want +got):\n%s", diff)
	}
}

// TestIntakeMovesTaken: with MoveTaken, what Accept took goes to
// processed/ (split, rejected, a duplicate still in incoming/), a repeated
// delivery after the move finds nothing to move and is no error, and what
// it did not take (no sheet, gone) stays where it is.
func TestIntakeMovesTaken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	intake := pipeline.NewIntake(e.splitter, e.blobs, e.signal, pipeline.IntakeConfig{
		DefaultSpec: store.TaskSpec{Prompt: "Copy for {{name}}", Provider: "sim", BatchSize: 2},
		TempDir:     t.TempDir(), MoveTaken: true,
	})
	put := func(key, content string) {
		t.Helper()
		if err := e.blobs.Put(ctx, key, strings.NewReader(content)); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(key string) bool {
		_, err := e.blobs.Size(ctx, key)
		return err == nil
	}
	type got struct {
		Outcome             pipeline.IntakeOutcome
		Taken, Moved        bool
		InIncoming, InProcd bool
	}
	steps := []struct {
		name, key string
		put       string // content put under key first; "" for none
		want      got
	}{
		{"a sheet is split and moved", "incoming/team/a.csv", "id,name\n1,brick\n", got{Outcome: pipeline.IntakeSplit, Taken: true, Moved: true, InProcd: true}},
		{"the same event after the move", "incoming/team/a.csv", "", got{Taken: true, InProcd: true}},
		{"the same content dropped again", "incoming/team/a.csv", "id,name\n1,brick\n", got{Taken: true, Moved: true, InProcd: true}},
		{"a rejected sheet is moved", "incoming/empty.csv", "id,name\n", got{Outcome: pipeline.IntakeRejected, Taken: true, Moved: true, InProcd: true}},
		{"no sheet stays", "incoming/notes.txt", "notes", got{InIncoming: true}},
		{"a gone object has nothing to move", "incoming/never.csv", "", got{}},
	}
	for _, s := range steps {
		if s.put != "" {
			put(s.key, s.put)
		}
		res, err := intake.Accept(ctx, s.key, "v1")
		if err != nil {
			t.Fatalf("%s: Accept(%s): %v", s.name, s.key, err)
		}
		g := got{Outcome: res.Outcome, Taken: res.Taken, Moved: res.Moved, InIncoming: exists(s.key), InProcd: exists(pipeline.ProcessedKey(s.key))}
		if diff := cmp.Diff(s.want, g); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.name, diff)
		}
	}
	if errFile := readBlob(t, e, pipeline.ErrorFileKey("incoming/empty.csv")); !strings.Contains(errFile, "no data rows") {
		t.Errorf("error file of the moved rejected sheet = %q, want the reason", errFile)
	}
}

// slowFolder is a drop folder whose downloads of inputs take a while and
// are counted.
type slowFolder struct {
	pipeline.DropFolder
	downloads atomic.Int64
}

func (f *slowFolder) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	if pipeline.IsInputKey(key) {
		f.downloads.Add(1)
		time.Sleep(50 * time.Millisecond)
	}
	return f.DropFolder.Open(ctx, key)
}

// TestIntakeTakesAKeyOnce: two intakes of one key at once in a process
// (serve's API and its drop folder, on an API upload) split it once; the
// second finds the first's task.
func TestIntakeTakesAKeyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	folder := &slowFolder{DropFolder: e.blobs}
	intake := pipeline.NewIntake(e.splitter, folder, e.signal, pipeline.IntakeConfig{
		DefaultSpec: store.TaskSpec{Prompt: "Copy for {{name}}", Provider: "sim", BatchSize: 2}, TempDir: t.TempDir(),
	})
	if err := e.blobs.Put(ctx, "incoming/twice.csv", strings.NewReader("id,name\n1,brick\n2,ball\n3,kite\n")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outcomes := make([]pipeline.IntakeOutcome, 2)
	for i := range outcomes {
		wg.Go(func() {
			res, err := intake.Accept(ctx, "incoming/twice.csv", "v1")
			if err != nil {
				t.Errorf("Accept: %v", err)
			}
			outcomes[i] = res.Outcome
		})
	}
	wg.Wait()
	slices.Sort(outcomes)
	if n := folder.downloads.Load(); n != 1 || outcomes[0] != pipeline.IntakeIgnored || outcomes[1] != pipeline.IntakeSplit {
		t.Errorf("two intakes of one key at once: %d downloads, outcomes %v; want one split, one finding its task", n, outcomes)
	}
}
