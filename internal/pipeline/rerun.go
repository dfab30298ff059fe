package pipeline

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"github.com/batchgen/batchgen/internal/prompt"
	"github.com/batchgen/batchgen/internal/schema"
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
//
// A task with declared columns adds them to the hash: an answer of one shape is not an answer to a question asked in
// another. Without columns the key is what it always was, so results written before columns existed still match.
func RowKey(spec store.TaskSpec, renderedPrompt string) string {
	h := sha256.New()
	h.Write([]byte(spec.System))
	h.Write([]byte{0})
	h.Write([]byte(renderedPrompt))
	if len(spec.Columns) > 0 {
		h.Write([]byte{0})
		h.Write(spec.Columns.JSONSchema())
	}
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

// resultBlock finds the result columns a header ends with, for a task declaring cols: the index of the first, how
// many of them hold the answer, and whether the header is a result's at all. A result of the one text answer is
// recognised when columns are declared now, too (its rows' keys then differ: every row is asked again).
func resultBlock(header []string, cols schema.Columns) (block, answers int, ok bool) {
	for _, answer := range [][]string{answerColumns(cols), answerColumns(nil)} {
		names := append(slices.Clone(answer), bookkeepingColumns...)
		i := len(header) - len(names)
		if i < 1 {
			continue
		}
		if slices.Equal(header[i:], resultColumnNames(answerSet(answer), header[:i])) {
			return i, len(answer), true
		}
	}
	return 0, 0, false
}

// answerSet is a declaration of the given answer columns, for their names: nil for the one text answer.
func answerSet(names []string) schema.Columns {
	if slices.Equal(names, answerColumns(nil)) {
		return nil
	}
	cols := make(schema.Columns, len(names))
	for i, n := range names {
		cols[i].Name = n
	}
	return cols
}

// InputColumns is the part of a sheet's header a template may name, for a task declaring cols: all of it, or for
// a result sent back in, the columns before the result's own.
func InputColumns(header []string, cols schema.Columns) []string { return inputColumns(header, cols) }

// inputColumns is InputColumns.
func inputColumns(header []string, cols schema.Columns) []string {
	if i, _, ok := resultBlock(header, cols); ok {
		return header[:i]
	}
	return header
}

// RerunCounts says what became of the rows of a result sent back in (store.RerunCounts, recorded on its task).
type RerunCounts = store.RerunCounts

// rerunRow decides what a row of a result sent back in becomes: its place in counts, and the row to store
// (its input values; a kept row with its answer as a SUCCEEDED result, a row that wants a new answer Fresh).
// block is where the result columns start, answers how many of them hold the answer.
func rerunRow(row store.Row, block, answers int, spec store.TaskSpec, bound *prompt.Bound, counts *RerunCounts) store.Row {
	at := func(i int) string {
		if i < len(row.Values) {
			return row.Values[i]
		}
		return ""
	}
	cell := func(name string) string { return at(block + answers + slices.Index(bookkeepingColumns, name)) }
	input := row.Values[:min(block, len(row.Values))]
	if row.State == store.RowSkipped || sheet.IsBlank(input) {
		counts.Blank++
		row.State = store.RowSkipped
	}
	from, key := parseKeyCell(strings.TrimSpace(cell("batchgen_key")))
	if counts.From == "" && from != "" && row.State != store.RowSkipped {
		counts.From = from
	}
	var output string
	var fits bool
	if key == RowKey(spec, bound.Render(input)) && cell("status") == "succeeded" {
		output, fits = keptAnswer(spec.Columns, row.Values[min(block, len(row.Values)):], answers)
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
	case cell("status") == "succeeded" && !fits:
		// Cleared (or edited into something that does not fit the columns): asks for a new answer.
		counts.Cleared++
		row.Fresh = true
	case cell("status") != "succeeded":
		counts.Failed++
	default:
		counts.Kept++
		// Answered before: no call, no cost now (cached), the provider that answered then.
		row.RowResult = store.RowResult{State: store.RowSucceeded, Output: output, Cached: true, Provider: cell("provider")}
	}
	// Only the input is stored: the export rewrites the result's own columns from the row's result.
	row.Values = input
	return row
}

// keptAnswer reads the answer a result row holds in its answer cells (the first answers of cells) as the task's
// output: the text of output, or for declared columns their cells as a normalised answer (schema.Columns.Validate:
// a number, TRUE/FALSE, an ISO date and a list joined with "; " read back as what they were written from). ok is
// false for an answer that is blank, or that no longer fits the columns (edited by hand): it is asked again.
func keptAnswer(cols schema.Columns, cells []string, answers int) (string, bool) {
	at := func(i int) string {
		if i < len(cells) {
			return cells[i]
		}
		return ""
	}
	if len(cols) == 0 {
		out := at(0)
		return out, out != ""
	}
	if answers != len(cols) {
		return "", false
	}
	obj := make(map[string]any, len(cols))
	blank := true
	for i, c := range cols {
		v := at(i)
		blank = blank && strings.TrimSpace(v) == ""
		switch {
		case strings.TrimSpace(v) == "":
			obj[c.Name] = nil
		case c.Type == schema.List:
			obj[c.Name] = strings.Split(v, schema.ListSeparator)
		default:
			obj[c.Name] = v
		}
	}
	if blank {
		return "", false
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return "", false
	}
	out, err := cols.Validate(string(b))
	return out, err == nil
}
