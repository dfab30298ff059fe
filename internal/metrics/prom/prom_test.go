package prom_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	openai "github.com/batchgen/batchgen/internal/llm/openai"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/metrics/prom"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

func TestCatalogIsConsistent(t *testing.T) {
	t.Parallel()
	if err := metrics.CheckCatalog(metrics.Catalog); err != nil {
		t.Fatal(err)
	}
	bad := []metrics.Def{
		{Name: "A", Prom: "batchgen_a_total", Labels: []string{"x"}, Help: "h"},
		{Name: "B", Prom: "batchgen_a_total", Labels: []string{"y"}, Help: "h"},
		{Name: "A", Prom: "a_total"},
	}
	err := metrics.CheckCatalog(bad)
	for _, want := range []string{"A is defined twice", "A and B share batchgen_a_total", `"a_total" lacks the batchgen_ prefix`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckCatalog(bad) = %v, want it to say %q", err, want)
		}
	}
}

// scrape fetches url and parses it as Prometheus' text format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	return fams
}

// value sums the samples of family whose labels include want (a counter's
// or gauge's value, a histogram's count).
func value(fams map[string]*dto.MetricFamily, family string, want map[string]string) float64 {
	f, ok := fams[family]
	if !ok {
		return -1
	}
	var sum float64
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// gate lets the first open calls of the model through and holds the rest
// until released.
type gate struct {
	next    http.Handler
	open    int64
	calls   atomic.Int64
	release chan struct{}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.calls.Add(1) > g.open {
		select {
		case <-g.release:
		case <-r.Context().Done():
			return
		}
	}
	g.next.ServeHTTP(w, r)
}

// TestScrapeDuringJob runs a known job on the embedded runtime (SQLite
// store and queue, the OpenAI provider against the mock server over HTTP)
// and scrapes /metrics while it runs and after: the counters move with the
// rows, the failed rows carry their error class, and the export and task
// durations appear once the task is exported.
func TestScrapeDuringJob(t *testing.T) {
	t.Parallel()
	const rows, open = 40, 15
	mock := mockserver.New(mockserver.Config{Latency: time.Millisecond})
	g := &gate{next: mock, open: open, release: make(chan struct{})}
	llmServer := httptest.NewServer(g)
	defer llmServer.Close()
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(g.release) }) }
	defer release()

	reg := prom.New(nil)
	srv := httptest.NewServer(reg.Handler())
	defer srv.Close()

	dir := t.TempDir()
	st, err := sqlitestore.Open(filepath.Join(dir, "db.sqlite"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: "batches", Visibility: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := fileblob.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	provider, err := openai.New(openai.Config{Conn: llm.Conn{BaseURL: llmServer.URL + "/v1", Model: "gpt-test"}})
	if err != nil {
		t.Fatal(err)
	}
	signal := &pipeline.ExportSignal{}
	gen := pipeline.NewGenerator(st, provider, signal, pipeline.GeneratorConfig{Metrics: reg, Concurrency: 4, FlushInterval: pipeline.FlushAtOnce})
	exporter := pipeline.NewExporter(st, blobs, pipeline.ExporterConfig{Metrics: reg})
	var csv strings.Builder
	csv.WriteString("id,name\n")
	for i := 1; i <= rows; i++ {
		marker := ""
		if i%10 == 0 {
			marker = " [[filter]]" // answered with a content filter: a failed row
		}
		fmt.Fprintf(&csv, "SKU-%03d,item %d%s\n", i, i, marker)
	}
	path := filepath.Join(dir, "in.csv")
	if err := os.WriteFile(path, []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := store.TaskSpec{Prompt: "copy for {{name}}", Provider: "openai", Model: "gpt-test", BatchSize: 10}
	params := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID("scrape", spec), Source: "in.csv", Path: path, Spec: spec}
	if _, err := pipeline.NewSplitter(st, q, pipeline.SplitterConfig{}).Split(t.Context(), params); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	workers := pipeline.NewLocalWorkers(q, gen, pipeline.LocalWorkersConfig{Workers: 2, PollInterval: 5 * time.Millisecond, Metrics: reg})
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = workers.Run(wctx) }()
	defer func() { stop(); wg.Wait() }()

	// While the job runs: poll the scrape until the rows let through are
	// counted; the rest are held at the model.
	var during map[string]*dto.MetricFamily
	for {
		during = scrape(t, srv.URL)
		if value(during, "batchgen_rows_total", nil) >= open-2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("rows never showed in the scrape; last:\n%v", during["batchgen_rows_total"])
		case <-time.After(10 * time.Millisecond):
		}
	}
	if task, err := st.GetTask(ctx, params.TaskID); err != nil || task.State.Final() || task.State == store.TaskExporting {
		t.Fatalf("task %+v, %v: want it still running at the first scrape", task, err)
	}
	if got := value(during, "batchgen_rows_total", nil); got > open {
		t.Errorf("rows during the job = %v, want at most the %d let through", got, open)
	}
	if got := value(during, "batchgen_model_calls_total", map[string]string{"provider": "openai/gpt-test"}); got < open-2 {
		t.Errorf("model calls during the job = %v, want at least %d", got, open-2)
	}
	if got := value(during, "batchgen_model_call_duration_seconds", nil); got < open-2 {
		t.Errorf("latency observations during the job = %v, want at least %d", got, open-2)
	}
	if got := value(during, "batchgen_tasks_exported_total", nil); got != 0 {
		t.Errorf("tasks exported during the job = %v, want 0", got)
	}

	release()
	select {
	case <-signal.C():
	case <-ctx.Done():
		t.Fatal("the task never finished")
	}
	stop()
	wg.Wait()
	if _, err := exporter.Export(ctx, params.TaskID); err != nil {
		t.Fatal(err)
	}
	after := scrape(t, srv.URL)
	got := map[string]float64{
		"rows succeeded":          value(after, "batchgen_rows_total", map[string]string{"outcome": "succeeded"}),
		"rows failed by filter":   value(after, "batchgen_rows_total", map[string]string{"outcome": "failed", "error_class": "content_filter"}),
		"model calls":             value(after, "batchgen_model_calls_total", nil),
		"filtered calls":          value(after, "batchgen_model_calls_total", map[string]string{"error_class": "content_filter"}),
		"latency observations":    value(after, "batchgen_model_call_duration_seconds", nil),
		"tasks exported":          value(after, "batchgen_tasks_exported_total", nil),
		"export durations":        value(after, "batchgen_export_duration_seconds", nil),
		"task durations, PARTIAL": value(after, "batchgen_task_duration_seconds", map[string]string{"state": "PARTIAL"}),
		"dead letters":            value(after, "batchgen_dead_letters_total", nil),
	}
	want := map[string]float64{
		"rows succeeded": rows - rows/10, "rows failed by filter": rows / 10,
		"model calls": rows, "filtered calls": rows / 10, "latency observations": rows,
		"tasks exported": 1, "export durations": 1, "task durations, PARTIAL": 1,
		"dead letters": 0, // a series without labels reads 0 from the start
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics after the job (-want +got):\n%s", diff)
	}
	if value(after, "batchgen_tokens_total", map[string]string{"kind": "output"}) <= 0 {
		t.Errorf("no output tokens counted: %v", after["batchgen_tokens_total"])
	}
	if _, ok := after["batchgen_queue_depth"]; !ok {
		t.Errorf("no queue depth gauge in the scrape")
	}
}

// TestUnknownMetricIsIgnored: a name outside the catalog is logged, not
// recorded, and never panics.
func TestUnknownMetricIsIgnored(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	reg := prom.New(newLogger(&logs))
	reg.Add("NoSuchMetric", 1)
	reg.Observe(metrics.RowsSucceeded, 1) // a counter observed as a histogram
	srv := httptest.NewServer(reg.Handler())
	defer srv.Close()
	fams := scrape(t, srv.URL)
	for name := range fams {
		if strings.Contains(strings.ToLower(name), "nosuch") {
			t.Errorf("unknown metric exported as %s", name)
		}
	}
	if strings.Count(logs.String(), "not in the catalog") != 2 {
		t.Errorf("logs = %q, want two warnings", logs.String())
	}
}

func newLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
