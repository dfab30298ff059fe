package store_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

// TestLifecycleTable holds the transition table to the lifecycle the
// design describes, event by event.
func TestLifecycleTable(t *testing.T) {
	P, H, R, E, S, X, F, C := store.TaskPending, store.TaskHeld, store.TaskRunning, store.TaskExporting, store.TaskSucceeded, store.TaskPartial, store.TaskFailed, store.TaskCancelled
	tests := []struct {
		event   store.TaskEvent
		from    []store.TaskState
		to      store.TaskState
		nextGen bool
	}{
		{store.EventSplit, []store.TaskState{P}, R, false},
		{store.EventHold, []store.TaskState{P}, H, false},
		{store.EventStart, []store.TaskState{H}, R, false},
		{store.EventReject, []store.TaskState{P}, F, false},
		{store.EventExport, []store.TaskState{P, R}, E, false},
		{store.EventExported, []store.TaskState{E}, S, false},
		{store.EventExportedPartial, []store.TaskState{E}, X, false},
		{store.EventExportedCancelled, []store.TaskState{C}, C, false},
		{store.EventCancel, []store.TaskState{P, H, R}, C, false},
		{store.EventReexport, []store.TaskState{S, X}, E, true},
		{store.EventReopen, []store.TaskState{S, X, C}, R, true},
	}
	if len(tests) != len(store.TaskEvents) {
		t.Fatalf("%d events in the table, %d here: hold every event to its moves", len(store.TaskEvents), len(tests))
	}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range tests {
		p := tc.event.Params("t1", now)
		if !slices.Equal(p.From, tc.from) || p.To != tc.to || p.NextExportGen != tc.nextGen || p.ID != "t1" || !p.Now.Equal(now) {
			t.Errorf("%s: params %+v, want %v -> %s (next export generation %v)", tc.event, p, tc.from, tc.to, tc.nextGen)
		}
		for _, s := range store.TaskStates {
			if got, want := tc.event.Allows(s), slices.Contains(tc.from, s); got != want {
				t.Errorf("%s allows %s = %v, want %v", tc.event, s, got, want)
			}
		}
		// Params hands out a copy: a caller cannot change the table.
		p.From[0] = F
		if tc.event.From()[0] == F && tc.from[0] != F {
			t.Errorf("%s: changing the params' From changed the table", tc.event)
		}
	}
}

// TestLifecycleReachability: from PENDING every state can be reached, FAILED
// is never left, and a final state is left only by the operator events
// that start another export generation (re-export, reopen) or by the
// cancelled task's own export.
func TestLifecycleReachability(t *testing.T) {
	seen := map[store.TaskState]bool{store.TaskPending: true}
	for changed := true; changed; {
		changed = false
		for _, e := range store.TaskEvents {
			for _, s := range e.From() {
				if seen[s] && !seen[e.To()] {
					seen[e.To()], changed = true, true
				}
			}
		}
	}
	for _, s := range store.TaskStates {
		if !seen[s] {
			t.Errorf("state %s cannot be reached from PENDING", s)
		}
	}
	for _, e := range store.TaskEvents {
		for _, s := range e.From() {
			if s == store.TaskFailed {
				t.Errorf("%s leaves FAILED: a failed task is final", e)
			}
			if s.Final() && !(e == store.EventReexport || e == store.EventReopen || e == store.EventExportedCancelled) {
				t.Errorf("%s leaves the final state %s", e, s)
			}
			if s.Final() && e != store.EventExportedCancelled && !e.Params("x", time.Time{}).NextExportGen {
				t.Errorf("%s leaves the final state %s without a new export generation: its export could not be started again", e, s)
			}
		}
	}
	if store.TaskCancelled.Generating() || store.TaskExporting.Generating() || store.TaskHeld.Generating() || !store.TaskRunning.Generating() || !store.TaskPending.Generating() {
		t.Error("Generating: rows run in PENDING and RUNNING only")
	}
	for _, s := range store.TaskStates {
		if want := s == store.TaskHeld || s.Generating(); s.Sampling() != want {
			t.Errorf("Sampling(%s) = %v: a quote's sample runs in HELD and where rows run", s, !want)
		}
	}
}

func TestNeedsExport(t *testing.T) {
	tests := []struct {
		name string
		task store.Task
		want bool
	}{
		{"running, batches left", store.Task{State: store.TaskRunning, BatchesTotal: 3, BatchesDone: 2}, false},
		{"running, all done", store.Task{State: store.TaskRunning, BatchesTotal: 3, BatchesDone: 3}, true},
		{"pending, all done before the split's move", store.Task{State: store.TaskPending, BatchesTotal: 1, BatchesDone: 1}, true},
		{"pending mid-split", store.Task{State: store.TaskPending, BatchesTotal: 4}, false},
		{"exporting", store.Task{State: store.TaskExporting, BatchesTotal: 3, BatchesDone: 3}, true},
		{"succeeded", store.Task{State: store.TaskSucceeded, BatchesTotal: 3, BatchesDone: 3, ResultKey: "r"}, false},
		{"partial", store.Task{State: store.TaskPartial, BatchesTotal: 3, BatchesDone: 3, ResultKey: "r"}, false},
		{"failed (rejected input)", store.Task{State: store.TaskFailed}, false},
		{"cancelled, no result yet", store.Task{State: store.TaskCancelled, BatchesTotal: 3, BatchesDone: 1}, true},
		{"cancelled, result written", store.Task{State: store.TaskCancelled, BatchesTotal: 3, BatchesDone: 1, ResultKey: "r"}, false},
	}
	for _, tc := range tests {
		if got := tc.task.NeedsExport(); got != tc.want {
			t.Errorf("%s: NeedsExport = %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		cancelled bool
		failed    int
		want      store.TaskState
	}{{false, 0, store.TaskSucceeded}, {false, 2, store.TaskPartial}, {true, 0, store.TaskCancelled}, {true, 5, store.TaskCancelled}} {
		if got := store.ExportedEvent(tc.cancelled, tc.failed).To(); got != tc.want {
			t.Errorf("exported (cancelled %v, %d failed rows) -> %s, want %s", tc.cancelled, tc.failed, got, tc.want)
		}
	}
}

// TestOnlyTheLifecycleNamesSourceStates: no code outside lifecycle.go
// writes the source states of a move (a From list), so a move's rule lives
// once. Tests may, to drive a store into a state.
func TestOnlyTheLifecycleNamesSourceStates(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			strings.Contains(path, "storetest") || filepath.Base(path) == "lifecycle.go" && filepath.Base(filepath.Dir(path)) == "store" {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if sel, ok := lit.Type.(*ast.SelectorExpr); !ok || sel.Sel.Name != "TransitionTaskParams" {
				return true
			}
			for _, el := range lit.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if id, ok := kv.Key.(*ast.Ident); ok && (id.Name == "From" || id.Name == "To") {
						found = append(found, fset.Position(kv.Pos()).String())
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Errorf("moves written outside store/lifecycle.go (use a TaskEvent's Params):\n%s", strings.Join(found, "\n"))
	}
}
