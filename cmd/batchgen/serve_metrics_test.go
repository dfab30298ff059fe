package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestServeMetricsAndLogs: `batchgen serve` answers /metrics on its address
// in Prometheus' format, with the rows and the export of a dropped file
// counted, and logs JSON lines that name the task.
func TestServeMetricsAndLogs(t *testing.T) {
	t.Parallel()
	mock := httptest.NewServer(mockserver.New(mockserver.Config{Latency: time.Millisecond}))
	t.Cleanup(mock.Close)
	data := t.TempDir()
	srv := startServe(t, data, mock, "--prompt", "Copy for {{name}}", "--log-level", "info")
	dropCSV(t, data, "m.csv", rowsCSV(12, "m"))
	waitFor(t, "the result of m.csv", func() bool { return exists(filepath.Join(data, "results", "m.result.xlsx")) })

	// The result file appears before the exporter's counters move (the
	// file is the export's last write, the metric follows it), so scrape
	// until the export is counted, then hold every family to the job.
	var fams map[string]*dto.MetricFamily
	scrape := func() map[string]*dto.MetricFamily {
		resp, err := http.Get(srv.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics: %s", resp.Status)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		got, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatalf("parse /metrics: %v", err)
		}
		return got
	}
	sum := func(family string) float64 {
		var v float64
		for _, m := range fams[family].GetMetric() {
			v += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
		return v
	}
	waitFor(t, "the export counted in /metrics", func() bool {
		fams = scrape()
		return sum("batchgen_task_duration_seconds") >= 1 && sum("batchgen_tasks_exported_total") >= 1
	})
	for family, want := range map[string]float64{
		"batchgen_rows_total": 12, "batchgen_model_calls_total": 12, "batchgen_model_call_duration_seconds": 12,
		"batchgen_tasks_exported_total": 1, "batchgen_task_duration_seconds": 1,
	} {
		if got := sum(family); got != want {
			t.Errorf("%s = %v, want %v", family, got, want)
		}
	}
	srv.stop()

	taskLines := 0
	for _, line := range strings.Split(strings.TrimSpace(srv.stderr()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Errorf("serve log line is not JSON: %q", line)
			continue
		}
		if l["msg"] == "batch done" || l["msg"] == "task exported" {
			if id, _ := l["task_id"].(string); len(id) != 20 {
				t.Errorf("line without task_id: %q", line)
			}
			taskLines++
		}
		if _, ok := l["batch_no"]; ok && l["msg"] == "task exported" {
			t.Errorf("the export line names a batch: %q", line)
		}
	}
	if taskLines < 2 {
		t.Errorf("%d batch/export lines in the serve log, want at least 2:\n%s", taskLines, srv.stderr())
	}
}
