package embedded_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/embedded"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// TestDataDirIsExclusive: one process works a data directory; a second
// Open says who holds it, and gets it once the first lets go.
func TestDataDirIsExclusive(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	first, err := embedded.Open(dir, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := embedded.Open(dir, "", 0); err == nil || !strings.Contains(err.Error(), "in use by another batchgen process") {
		first.Close()
		t.Fatalf("second Open = %v, want the directory in use", err)
	}
	first.Close()
	second, err := embedded.Open(dir, "", 0)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	second.Close()
}

// TestOpenStore: the lock-free store of a data directory, and a clear
// error for a folder that holds no batchgen data.
func TestOpenStore(t *testing.T) {
	t.Parallel()
	_, err := embedded.OpenStore(t.TempDir())
	var none *embedded.NoDataError
	if !errors.As(err, &none) || !strings.Contains(err.Error(), "no batchgen data in") {
		t.Fatalf("OpenStore of an empty folder = %v, want a NoDataError", err)
	}
	dir := t.TempDir()
	d, err := embedded.Open(dir, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st, err := embedded.OpenStore(dir) // while the lock is held
	if err != nil {
		t.Fatalf("OpenStore while a process holds the lock: %v", err)
	}
	st.Close()
}

// TestDefaultDir: .batchgen beside the input when that folder is writable.
func TestDefaultDir(t *testing.T) {
	t.Parallel()
	in := filepath.Join(t.TempDir(), "x.csv")
	if got := embedded.DefaultDir(in); got != filepath.Join(filepath.Dir(in), ".batchgen") {
		t.Errorf("DefaultDir(%s) = %s, want .batchgen beside it", in, got)
	}
}

// gated answers once the gate is open, counting the calls it started.
type gated struct {
	gate    chan struct{}
	started atomic.Int32
}

func (g *gated) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	g.started.Add(1)
	select {
	case <-g.gate:
		return llm.Response{Text: "ok " + req.Prompt}, nil
	case <-ctx.Done():
		return llm.Response{}, ctx.Err()
	}
}

// TestWorkDrains: Start works the queue; Drain starts no new row, lets the
// calls in flight finish and saves them; Wait reports when; Stop returns.
func TestWorkDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, err := embedded.Open(t.TempDir(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	q, err := sqlitequeue.New(d.Store.DB(), sqlitequeue.Config{Name: "work", Visibility: time.Minute, MaxReceive: 10})
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "in.csv")
	var b strings.Builder
	b.WriteString("id\n")
	for i := range 20 {
		b.WriteString("row-" + string(rune('a'+i)) + "\n")
	}
	if err := os.WriteFile(in, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	task, err := pipeline.NewSplitter(d.Store, q, pipeline.SplitterConfig{}).Split(ctx, pipeline.SplitParams{
		TaskID: "drain", Path: in, Source: "in.csv", Spec: store.TaskSpec{Prompt: "{{id}}", Provider: "sim", BatchSize: 10},
		Limits: sheet.Limits{},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &gated{gate: make(chan struct{})}
	exports := &pipeline.ExportSignal{}
	gen := pipeline.NewGenerator(d.Store, p, exports, pipeline.GeneratorConfig{Concurrency: 2, Owner: "test"})
	work := embedded.Start(ctx, d.Store, q, gen, embedded.WorkConfig{Workers: 1, SweepAfter: time.Minute, Exports: exports})
	deadline := time.Now().Add(10 * time.Second)
	for p.started.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the workers started no call")
		}
		time.Sleep(5 * time.Millisecond)
	}
	work.Drain()
	if work.Wait(50 * time.Millisecond) {
		t.Fatal("Wait returned true while two calls were held in flight")
	}
	close(p.gate)
	if !work.Wait(10 * time.Second) {
		t.Fatal("the drained workers did not finish once their calls answered")
	}
	work.Stop()
	if n := p.started.Load(); n != 2 {
		t.Errorf("%d calls started, want the 2 in flight at the drain and no more", n)
	}
	rows, err := d.Store.ListRows(ctx, store.ListRowsParams{TaskID: task.ID})
	if err != nil {
		t.Fatal(err)
	}
	saved := 0
	for _, r := range rows {
		if r.State == store.RowSucceeded {
			saved++
		}
	}
	if saved != 2 {
		t.Errorf("%d rows saved, want the 2 answered after the drain", saved)
	}
}
