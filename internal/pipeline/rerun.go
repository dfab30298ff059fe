package pipeline

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/batchgen/batchgen/internal/prompt"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// A result sent back in (batchgen run --in x.result.xlsx, an upload, the drop folder) is recognised by the columns
// it ends with, ResultColumns, and continues as a task: the rows it answered keep their answers without a model
// call, and only the rows that want one are sent. Each result row carries its key (RowKey) in the hidden
// batchgen_key column, so rows are recognised by what they hold, never by where they are: rows the user inserted,
// deleted or sorted are handled alike.

// RowKey is what a result row records of the question it answered: a hash of the system prompt and the prompt
// rendered from the row's input cells. A row whose key no longer matches had its input or the template changed.
func RowKey(spec store.TaskSpec, renderedPrompt string) string {
	h := sha256.New()
	h.Write([]byte(spec.System))
	h.Write([]byte{0})
	h.Write([]byte(renderedPrompt))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// resultBlock finds the result columns a header ends with: the index of the first, and whether the header is a
// result's at all.
func resultBlock(header []string) (int, bool) {
	i := len(header) - len(ResultColumns)
	if i < 1 {
		return 0, false
	}
	return i, slices.Equal(header[i:], resultColumnNames(header[:i]))
}

// InputColumns is the part of a sheet's header a template may name: all of it, or for a result sent back in, the
// columns before the result's own.
func InputColumns(header []string) []string { return inputColumns(header) }

// inputColumns is InputColumns.
func inputColumns(header []string) []string {
	if i, ok := resultBlock(header); ok {
		return header[:i]
	}
	return header
}

// RerunCounts says what became of the rows of a result sent back in.
type RerunCounts struct {
	// Kept rows answered before, with the same input and template, keep their answer: no model call.
	Kept int `json:"kept"`
	// Changed rows had their input or the template changed; New rows were added by the user (no key).
	Changed int `json:"changed"`
	New     int `json:"new"`
	// Cleared rows had their answer deleted by the user, Flagged ones something in the rerun column: both get a
	// new answer, never the cached one.
	Cleared int `json:"cleared"`
	Flagged int `json:"flagged"`
	// Failed rows had not succeeded (failed, not_started).
	Failed int `json:"failed"`
	// Blank rows have no input; they stay skipped.
	Blank int `json:"blank"`
}

// ToRun is the number of rows that go to the model.
func (c RerunCounts) ToRun() int { return c.Changed + c.New + c.Cleared + c.Flagged + c.Failed }

// String is the summary line people read.
func (c RerunCounts) String() string {
	s := fmt.Sprintf("%d rows to run: %d kept, %d changed, %d cleared, %d flagged, %d failed", c.ToRun(), c.Kept, c.Changed, c.Cleared, c.Flagged, c.Failed)
	if c.New > 0 {
		s += fmt.Sprintf(", %d new", c.New)
	}
	return s
}

// rerunRow decides what a row of a result sent back in becomes: its place in counts, and the row to store
// (its input values; a kept row with its answer as a SUCCEEDED result, a row that wants a new answer Fresh).
// block is where the result columns start.
func rerunRow(row store.Row, block int, spec store.TaskSpec, bound *prompt.Bound, counts *RerunCounts) store.Row {
	cell := func(name string) string {
		i := slices.Index(ResultColumns, name)
		if block+i < len(row.Values) {
			return row.Values[block+i]
		}
		return ""
	}
	input := row.Values[:min(block, len(row.Values))]
	switch {
	case row.State == store.RowSkipped || sheet.IsBlank(input):
		counts.Blank++
		row.State = store.RowSkipped
	case strings.TrimSpace(cell("rerun")) != "":
		counts.Flagged++
		row.Fresh = true
	case cell("batchgen_key") == "":
		counts.New++
	case cell("batchgen_key") != RowKey(spec, bound.Render(input)):
		counts.Changed++
	case cell("status") == "succeeded" && cell("output") == "":
		counts.Cleared++
		row.Fresh = true
	case cell("status") != "succeeded":
		counts.Failed++
	default:
		counts.Kept++
		// Answered before: no call, no cost now (cached), the provider that answered then.
		row.RowResult = store.RowResult{State: store.RowSucceeded, Output: cell("output"), Cached: true, Provider: cell("provider")}
	}
	// Only the input is stored: the export rewrites the result's own columns from the row's result.
	row.Values = input
	return row
}
