package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func decode(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestContextAttributes(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := NewJSON(&buf, slog.LevelInfo)
	ctx := With(context.Background(), TaskID, "t1", BatchNo, 3, Attempt, 1)
	ctx = With(ctx, Row, 7, Attempt, 2) // a row refines its batch's attempt
	log.InfoContext(ctx, "row done", "provider", "sim")
	log.With(TaskID, "from-logger").InfoContext(ctx, "explicit wins")
	log.InfoContext(context.Background(), "no context", TaskID, "own")
	log.DebugContext(ctx, "dropped")

	lines := decode(t, buf.Bytes())
	for _, l := range lines {
		delete(l, "time")
	}
	want := []map[string]any{
		{"level": "INFO", "msg": "row done", "provider": "sim", TaskID: "t1", BatchNo: 3.0, Row: 7.0, Attempt: 2.0},
		{"level": "INFO", "msg": "explicit wins", TaskID: "from-logger", BatchNo: 3.0, Row: 7.0, Attempt: 2.0},
		{"level": "INFO", "msg": "no context", TaskID: "own"},
	}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
}

func TestParseLevel(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, " warn ": slog.LevelWarn, "error": slog.LevelError} {
		got, err := ParseLevel(in)
		if err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseLevel("loud"); err == nil || !strings.Contains(err.Error(), `"loud"`) {
		t.Errorf("ParseLevel(loud) error %v, want one naming the value", err)
	}
}

func TestTextCarriesContext(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	NewText(&buf, slog.LevelInfo).InfoContext(With(context.Background(), TaskID, "abc"), "sweep")
	if !strings.Contains(buf.String(), "task_id=abc") {
		t.Errorf("text line %q lacks task_id=abc", buf.String())
	}
}

func TestWithout(t *testing.T) {
	t.Parallel()
	ctx := With(context.Background(), TaskID, "t1", BatchNo, 2, Attempt, 1)
	got := []string{}
	for _, a := range Attrs(Without(ctx, BatchNo, Attempt, Row)) {
		got = append(got, a.Key)
	}
	if diff := cmp.Diff([]string{TaskID}, got); diff != "" {
		t.Errorf("attributes left (-want +got):\n%s", diff)
	}
	if len(Attrs(ctx)) != 3 {
		t.Errorf("Without changed the parent context")
	}
}
