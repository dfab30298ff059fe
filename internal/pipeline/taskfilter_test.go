package pipeline_test

import (
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/pipeline"
)

// TestTaskFilter: the states and since an operator's listing is filtered
// by, as the filter describes itself, or the error naming the bad part.
func TestTaskFilter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.Local)
	tests := []struct {
		states, since string
		want          string // the filter's description, or the error
	}{
		{"", "", ""},
		{"partial,FAILED", "", " in state PARTIAL or FAILED"},
		{"", "24h", " created since 2026-02-28 12:00"},
		{"running", "2026-02-01", " in state RUNNING, created since 2026-02-01 00:00"},
		{"done", "", `state "done": not a task state; use pending, running, exporting, succeeded, partial, failed or cancelled`},
		{"", "yesterday", `since "yesterday": give a duration back from now (24h, 90m) or a date (2026-01-31, 2026-01-31 08:00, RFC 3339)`},
	}
	for _, tt := range tests {
		f, err := pipeline.ParseTaskFilter(tt.states, tt.since, now)
		got := f.String()
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("ParseTaskFilter(%q, %q) = %q, want %q", tt.states, tt.since, got, tt.want)
		}
	}
}
