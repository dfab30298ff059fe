package pipeline

import (
	"crypto/sha256"
	"encoding/hex"
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
// The batchgen_key cell holds it after the id of the task that wrote it (resultKeyCell), so a result sent back in
// says which task it continues.
func RowKey(spec store.TaskSpec, renderedPrompt string) string {
	h := sha256.New()
	h.Write([]byte(spec.System))
	h.Write([]byte{0})
	h.Write([]byte(renderedPrompt))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// resultKeyCell is what a result row's batchgen_key cell holds: the task's id and the row's key.
func resultKeyCell(taskID, rowKey string) string { return taskID + ":" + rowKey }

// parseKeyCell splits a batchgen_key cell into the task that wrote it (empty for a key written before cells named
// their task) and the row's key.
func parseKeyCell(cell string) (taskID, rowKey string) {
	if i := strings.LastIndexByte(cell, ':'); i >= 0 {
		return cell[:i], cell[i+1:]
	}
	return "", cell
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

// RerunCounts says what became of the rows of a result sent back in (store.RerunCounts, recorded on its task).
type RerunCounts = store.RerunCounts

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
	if row.State == store.RowSkipped || sheet.IsBlank(input) {
		counts.Blank++
		row.State = store.RowSkipped
	}
	from, key := parseKeyCell(strings.TrimSpace(cell("batchgen_key")))
	if counts.From == "" && from != "" && row.State != store.RowSkipped {
		counts.From = from
	}
	switch {
	case row.State == store.RowSkipped:
	case strings.TrimSpace(cell("rerun")) != "":
		counts.Flagged++
		row.Fresh = true
	case key == "":
		counts.New++
	case key != RowKey(spec, bound.Render(input)):
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
