package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/clock"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var start = time.Date(2025, 3, 14, 15, 9, 26, 535_000_000, time.UTC)

func TestEmitGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		props  map[string]string
		values []Value
		call   map[string]string
	}{
		{
			name:  "generator",
			props: map[string]string{"function": "generator"},
			values: []Value{
				{Name: RowsSucceeded, Value: 97},
				{Name: RowsFailed, Unit: Count, Value: 3},
				{Name: ModelCalls, Value: 104},
				{Name: "BatchDuration", Unit: Milliseconds, Value: 1234.5},
			},
			call: map[string]string{"request_id": "c6af9ac6-7b61-11e6-9a41-93e812345678"},
		},
		{
			name:   "no properties",
			values: []Value{{Name: SweeperRequeued, Value: 0}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			e := New(&buf, clock.NewFake(start), tc.props)
			if err := e.Emit(tc.values, tc.call); err != nil {
				t.Fatalf("Emit: %v", err)
			}
			golden := filepath.Join("testdata", strings.ReplaceAll(tc.name, " ", "_")+".golden")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden file (run with -update to create): %v", err)
			}
			if diff := cmp.Diff(string(want), buf.String()); diff != "" {
				t.Errorf("EMF line mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// emfLine is the part of an EMF document CloudWatch reads.
type emfLine struct {
	AWS struct {
		Timestamp         int64
		CloudWatchMetrics []struct {
			Namespace  string
			Dimensions [][]string
			Metrics    []struct{ Name, Unit string }
		}
	} `json:"_aws"`
}

// TestEmitMatchesFailedRowsAlarm checks the contract the FailedRowsAlarm
// relies on: namespace batchgen, metric RowsFailed, one dimension set
// holding only Stack (an alarm sees a metric only under exactly the
// dimensions it names).
func TestEmitMatchesFailedRowsAlarm(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	e := New(&buf, clock.NewFake(start), map[string]string{"function": "generator", StackDimension: "batchgen-prod"})
	if err := e.Emit([]Value{{Name: RowsFailed, Value: 5}}, nil); err != nil {
		t.Fatalf("Emit: %v", err)
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.HasSuffix(buf.String(), "\n") {
		t.Fatalf("want exactly one newline-terminated line, got %q", buf.String())
	}
	var doc emfLine
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("line is not JSON: %v", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	type directive struct {
		Namespace  string
		Dimensions [][]string
		Metrics    []string
	}
	var got []directive
	for _, d := range doc.AWS.CloudWatchMetrics {
		g := directive{Namespace: d.Namespace, Dimensions: d.Dimensions}
		for _, m := range d.Metrics {
			g.Metrics = append(g.Metrics, m.Name+"/"+m.Unit)
		}
		got = append(got, g)
	}
	want := []directive{{Namespace: "batchgen", Dimensions: [][]string{{"Stack"}}, Metrics: []string{"RowsFailed/Count"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("EMF directive mismatch (-want +got):\n%s", diff)
	}
	if raw["Stack"] != "batchgen-prod" {
		t.Errorf("Stack = %v, want the stack name as the dimension's value", raw["Stack"])
	}
	if raw["RowsFailed"] != 5.0 {
		t.Errorf("RowsFailed value = %v, want 5", raw["RowsFailed"])
	}
	if doc.AWS.Timestamp != start.UnixMilli() {
		t.Errorf("Timestamp = %d, want %d", doc.AWS.Timestamp, start.UnixMilli())
	}
}

func TestEmitRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		props  map[string]string
		values []Value
	}{
		{"empty name", nil, []Value{{Name: "", Value: 1}}},
		{"duplicate metric", nil, []Value{{Name: RowsFailed, Value: 1}, {Name: RowsFailed, Value: 2}}},
		{"metric clashes with property", map[string]string{RowsFailed: "x"}, []Value{{Name: RowsFailed, Value: 1}}},
		{"reserved property", map[string]string{"_aws": "x"}, []Value{{Name: RowsFailed, Value: 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			e := New(&buf, clock.NewFake(start), nil)
			if err := e.Emit(tc.values, tc.props); err == nil {
				t.Fatal("Emit succeeded, want an error")
			}
			if buf.Len() != 0 {
				t.Errorf("a rejected line was written: %q", buf.String())
			}
		})
	}
}

func TestEmitNothing(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := New(&buf, nil, nil).Emit(nil, nil); err != nil {
		t.Fatalf("Emit(nil): %v", err)
	}
	if buf.Len() != 0 {
		t.Errorf("empty Emit wrote %q", buf.String())
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("stdout closed") }

func TestEmitWriteError(t *testing.T) {
	t.Parallel()
	err := New(failingWriter{}, nil, nil).Emit([]Value{{Name: RowsFailed, Value: 1}}, nil)
	if err == nil || !strings.Contains(err.Error(), "stdout closed") {
		t.Fatalf("Emit error = %v, want the write error", err)
	}
}

func TestCounterFlush(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	e := New(&buf, clock.NewFake(start), nil)
	c := NewCounter(RowsSucceeded, RowsFailed)
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Add(RowsSucceeded, 2)
			c.Add(ModelCalls, 1)
		}()
	}
	wg.Wait()
	if err := c.Flush(e, map[string]string{"function": "generator"}); err != nil {
		t.Fatalf("first Flush: %v", err)
	}
	if err := c.Flush(e, nil); err != nil {
		t.Fatalf("second Flush: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), buf.String())
	}
	values := func(line string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line is not JSON: %v", err)
		}
		delete(m, "_aws")
		return m
	}
	wantFirst := map[string]any{"RowsSucceeded": 100.0, "RowsFailed": 0.0, "ModelCalls": 50.0, "function": "generator"}
	if diff := cmp.Diff(wantFirst, values(lines[0])); diff != "" {
		t.Errorf("first flush mismatch (-want +got):\n%s", diff)
	}
	// The second flush reports the registered names at zero and forgets
	// the ad-hoc ModelCalls.
	wantSecond := map[string]any{"RowsSucceeded": 0.0, "RowsFailed": 0.0}
	if diff := cmp.Diff(wantSecond, values(lines[1])); diff != "" {
		t.Errorf("second flush mismatch (-want +got):\n%s", diff)
	}
}
