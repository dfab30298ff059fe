package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/batchgen/batchgen/internal/clip"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/store"
)

// WriteStatus lays out a task's status (batchgen status) for people, its
// cost at prices.
func WriteStatus(w io.Writer, s pipeline.TaskStatus, prices *pricing.Table) error {
	t := s.Task
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(label, format string, a ...any) {
		fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{label}, a...)...)
	}
	line("task", "%s  %s", t.ID, t.State)
	source := t.Source
	if t.Encoding != "" {
		source += "  (read as " + t.Encoding + ")"
	}
	line("source", "%s", source)
	r := s.Rows
	line("rows", "%d  (succeeded %d, failed %d, skipped %d, pending %d; cached %d)", r.Total, r.Succeeded, r.Failed, r.Skipped, r.Pending, r.Cached)
	if t.Rerun != nil {
		line("sent back", "a result sent back in: %s", t.Rerun)
	}
	switch t.Mode {
	case store.ModeEconomy:
		line("mode", "economy: the rows go to the provider's batch API, at the batch price")
	case store.ModeAuto:
		line("mode", "auto: economy until the deadline %s needs the rest online", t.Deadline.Local().Format(time.RFC3339))
	}
	if s.WaitingOn != "" {
		line("provider", "%s", s.WaitingOn)
	}
	done := r.Succeeded + r.Failed + r.Skipped
	pct := 100 * float64(done) / float64(max(r.Total, 1))
	progress := fmt.Sprintf("%.0f%% in %s  (%.1f rows/s)", pct, s.Elapsed.Round(100*time.Millisecond), s.Rate)
	switch {
	case s.ETAKnown:
		progress += fmt.Sprintf(", ETA %s", s.ETA)
	case !t.State.Final():
		progress += ", ETA unknown"
	}
	line("progress", "%s", progress)
	if t.Error != "" {
		line("reason", "%s", t.Error)
	}
	if len(s.FailedByClass) > 0 {
		var parts []string
		for _, c := range slices.Sorted(maps.Keys(s.FailedByClass)) {
			parts = append(parts, fmt.Sprintf("%s %d", cmpOr(c, "unclassified"), s.FailedByClass[c]))
		}
		line("failures", "%s", strings.Join(parts, ", "))
		for i, f := range s.LastFailures {
			label := ""
			if i == 0 {
				label = "last"
			}
			line(label, "row %d (sheet row %d)  %s: %s", f.No, f.SheetRow, cmpOr(f.Class, "unclassified"), oneLine(f.Error, 100))
		}
	}
	if len(s.Providers) > 0 {
		var parts []string
		for _, p := range slices.Sorted(maps.Keys(s.Providers)) {
			parts = append(parts, fmt.Sprintf("%s %d", p, s.Providers[p]))
		}
		line("answered", "%s", strings.Join(parts, ", "))
	}
	// The task's sums (its finished batches), each provider's tokens at
	// its own price: what tasks and the API show too.
	u := t.Usage
	line("tokens", "input %d, output %d, cached input %d  (estimated cost %s)", u.InputTokens, u.OutputTokens, u.CachedInputTokens, prices.Task(t))
	if t.ResultKey != "" {
		line("result", "%s", t.ResultKey)
	}
	if t.State.Final() && r.Failed > 0 {
		line("next", "batchgen retry %s reruns the failed rows (--error-class CLASS for one class)", t.ID)
	}
	return tw.Flush()
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// oneLine shortens an error message to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > n {
		return clip.Runes(s, n-1)
	}
	return s
}
