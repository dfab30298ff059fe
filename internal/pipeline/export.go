package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/prompt"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// ErrNotReady is returned by Export for a task whose batches are not all done.
var ErrNotReady = errors.New("task is not ready for export")

// ResultColumns are the columns the export adds after the input columns
// for a task that declares no output columns: the answer, then the
// bookkeeping. A task that declares columns gets those instead of output
// (ResultColumnsOf).
//
// rerun is left empty for the user: anything typed there asks for a new
// answer when the result is sent back in. batchgen_key (hidden) is the row's
// RowKey, by which a result sent back in knows the rows it answered.
var ResultColumns = []string{"output", "status", "error", "error_class", "cached", "attempts", "latency_ms",
	"provider", "input_tokens", "output_tokens", "rerun", "batchgen_key"}

// bookkeepingColumns follow the answer columns in every result.
var bookkeepingColumns = ResultColumns[1:]

// AnswerColumns are the headers a task's result gives the columns that
// hold its answer (its declared columns, or output) beside the input
// columns header: renamed batchgen_<name> where the input has the name.
func AnswerColumns(cols schema.Columns, header []string) []string {
	return resultColumnNames(cols, header)[:len(answerColumns(cols))]
}

// AnswerTexts are a row's answer cells as its result shows them, as text
// (a preview's): the output, or a cell per declared column.
func AnswerTexts(cols schema.Columns, r store.Row) []string {
	vals := answerValues(cols, r)
	texts := make([]string, len(vals))
	for i, v := range vals {
		texts[i] = v.String()
	}
	return texts
}

// answerColumns is AnswerColumns.
func answerColumns(cols schema.Columns) []string {
	if len(cols) == 0 {
		return ResultColumns[:1]
	}
	return cols.Names()
}

// ResultColumnsOf are the columns the export adds for a task declaring
// cols, before any is renamed for an input column of the same name: the
// answer columns, then the bookkeeping.
func ResultColumnsOf(cols schema.Columns) []string {
	return append(slices.Clone(answerColumns(cols)), bookkeepingColumns...)
}

// exportPage is how many rows are read from the store at a time; the
// export's memory is bounded by one page plus the writer's buffer.
const exportPage = 500

// Exporter writes a task's result workbook.
type Exporter struct {
	store store.Store
	blobs blob.Store
	cfg   ExporterConfig
}

// ExporterConfig names the exporter's optional collaborators; NewExporter
// applies the defaults.
type ExporterConfig struct {
	// Clock stamps the task's transitions. Defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Metrics receives the use case's metrics. Defaults to recording
	// nothing.
	Metrics metrics.Recorder
	// TempDir holds the copy of the input workbook an export reads, and
	// the answers too long for a cell on their way to the overflow sheet.
	// Defaults to os.TempDir.
	TempDir string
}

func (c ExporterConfig) withDefaults() ExporterConfig {
	c.Clock = orClock(c.Clock)
	c.Logger = orLogger(c.Logger)
	c.Metrics = metrics.Or(c.Metrics)
	return c
}

// NewExporter returns an Exporter that reads results from st and writes the
// workbook to blobs. It panics if a port is nil: a mistake in the wiring,
// caught at start-up.
func NewExporter(st store.Store, blobs blob.Store, cfg ExporterConfig) *Exporter {
	if err := errors.Join(required("Store", st), required("Blobs", blobs)); err != nil {
		panic("pipeline.NewExporter: " + err.Error())
	}
	return &Exporter{store: st, blobs: blobs, cfg: cfg.withDefaults()}
}

// Export writes the result workbook of a task whose batches are all done to
// TaskResultKey(task) and moves the task to SUCCEEDED or PARTIAL. A CANCELLED
// task gets a partial result (rows that never started are marked
// not_started) and stays CANCELLED. It is idempotent: a task already
// exported is returned as is, and an export that died halfway is simply
// written again.
func (e *Exporter) Export(ctx context.Context, taskID string) (store.Task, error) {
	// An export started by a batch's last row is the task's, not the batch's.
	ctx = logging.Without(ctx, logging.BatchNo, logging.Attempt, logging.Row)
	task, err := e.store.GetTask(ctx, taskID)
	if err != nil {
		return store.Task{}, fmt.Errorf("export %s: load task: %w", taskID, err)
	}
	cancelled := task.State == store.TaskCancelled
	if !task.NeedsExport() {
		if task.State.Final() {
			return task, nil // exported already
		}
		return task, fmt.Errorf("export %s: %d of %d batches done: %w", taskID, task.BatchesDone, task.BatchesTotal, ErrNotReady)
	}
	if store.EventExport.Allows(task.State) {
		task, err = e.store.TransitionTask(ctx, store.EventExport.Params(taskID, e.cfg.Clock.Now()))
		if isConflict(err) {
			if task, err = e.store.GetTask(ctx, taskID); err == nil && task.State.Final() {
				return task, nil
			}
		}
		if err != nil {
			return store.Task{}, fmt.Errorf("export %s: mark exporting: %w", taskID, err)
		}
	}

	key := TaskResultKey(task)
	started := e.cfg.Clock.Now()
	pr, pw := io.Pipe()
	written := make(chan exportCounts, 1)
	go func() {
		c, err := e.WriteResult(ctx, task, pw)
		pw.CloseWithError(err)
		written <- c
	}()
	if err := e.blobs.Put(ctx, key, pr); err != nil {
		pr.CloseWithError(err)
		<-written
		return task, fmt.Errorf("export %s: write %s: %w", taskID, key, err)
	}
	counts := <-written
	// A cancelled task keeps its state; its partial result marks the rows
	// that never started.
	exported := store.ExportedEvent(cancelled, counts.failed)
	final := exported.To()
	mark := exported.Params(taskID, e.cfg.Clock.Now())
	mark.ResultKey = key
	if cancelled {
		// Its batches never finished to count their rows and tokens: the
		// rows just read do.
		mark.Recount = &counts.recount
	}
	done, err := e.store.TransitionTask(ctx, mark)
	if isConflict(err) {
		return e.store.GetTask(ctx, taskID)
	}
	if err != nil {
		return task, fmt.Errorf("export %s: mark %s: %w", taskID, final, err)
	}
	now := e.cfg.Clock.Now()
	e.cfg.Metrics.Add(metrics.TasksExported, 1)
	e.cfg.Metrics.Observe(metrics.ExportDuration, float64(now.Sub(started).Microseconds())/1000)
	e.cfg.Metrics.Observe(metrics.TaskDuration, now.Sub(task.CreatedAt).Seconds(), "state", string(done.State))
	e.cfg.Logger.InfoContext(ctx, "task exported", logging.TaskID, taskID, "state", done.State, "rows", counts.rows, "failed", counts.failed, "key", key)
	return done, nil
}

// exportCounts are what an export read: its rows, those without a result,
// and what they add up to (a cancelled task's counts come from them).
type exportCounts struct {
	rows, failed int
	recount      store.TaskRecount
}

// WriteResult streams the result workbook of task to w. For a workbook input
// kept at InputKey it is the user's own workbook (sheet.AddColumns): every
// sheet, style, type and formula as sent, with ResultColumns added to the
// right of the input sheet. Otherwise (a CSV input, a task split before
// inputs were kept, a macro-enabled workbook) it is a new workbook with one
// sheet: every input column as text, then ResultColumns. A task that asked
// for a CSV result (store.ResultCSV) gets one (writeCSV). Either way there
// is one row per input row, in row order.
func (e *Exporter) WriteResult(ctx context.Context, task store.Task, w io.Writer) (exportCounts, error) {
	if task.Spec.ResultFormat == store.ResultCSV {
		return e.writeCSV(ctx, task, w)
	}
	if task.Sheet != "" {
		counts, err := e.writeOwnWorkbook(ctx, task, w)
		if !errors.Is(err, errNoOwnWorkbook) {
			return counts, err
		}
		e.cfg.Logger.InfoContext(ctx, "the result is a new workbook", logging.TaskID, task.ID, "why", err.Error())
	}
	return e.writeNewWorkbook(ctx, task, w)
}

// errNoOwnWorkbook says why a workbook input gets a new workbook as its
// result.
var errNoOwnWorkbook = errors.New("no own workbook")

// writeOwnWorkbook adds the result columns to the kept input workbook.
func (e *Exporter) writeOwnWorkbook(ctx context.Context, task store.Task, w io.Writer) (exportCounts, error) {
	var counts exportCounts
	input, err := e.keptInput(ctx, task)
	if err != nil {
		return counts, err
	}
	defer os.Remove(input.Name())
	defer input.Close()
	fi, err := input.Stat()
	if err != nil {
		return counts, fmt.Errorf("read the kept input: %w", err)
	}
	rows := newRowReader(e.store, task)
	first, err := rows.peek(ctx)
	if err != nil {
		return counts, err
	}
	keys, err := newRowKeys(task)
	if err != nil {
		return counts, err
	}
	params := sheet.AddColumnsParams{
		Sheet: task.Sheet,
		// The reader takes the first row below the header as row 1, blank
		// or not.
		HeaderRow: first.SheetRow - 1,
		Header:    resultColumnNames(task.Spec.Columns, task.Header),
		Hidden:    hiddenColumns(task.Spec.Columns),
		Dates:     hasDates(task.Spec.Columns),
		TempDir:   e.cfg.TempDir,
		// The result carries its template and columns: sent back in, they
		// are read again.
		Prompt:     task.Spec.Prompt,
		PromptRows: promptRows(task.Spec.Columns),
		Rows: func() (sheet.AddedRow, error) {
			r, err := rows.next(ctx)
			if err != nil {
				return sheet.AddedRow{}, err
			}
			return sheet.AddedRow{SheetRow: r.SheetRow, Values: resultValues(task.Spec.Columns, r, keys.of(r))}, nil
		},
	}
	if block, _, ok := resultBlock(task.Header, task.Spec.Columns); ok {
		// A result sent back in: the answers go in its own result columns,
		// replacing what they held (the reader's header starts in column A),
		// down to its last row.
		params.Header, params.At = task.Header[block:], block+1
		last, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: task.ID, FromNo: task.RowsTotal, Limit: 1})
		if err != nil {
			return counts, fmt.Errorf("read the last row: %w", err)
		}
		if len(last) == 1 {
			params.LastRow = last[0].SheetRow
		}
	}
	err = sheet.AddColumns(input, fi.Size(), w, params)
	if errors.Is(err, sheet.ErrMacroWorkbook) {
		return counts, fmt.Errorf("%w: %w", errNoOwnWorkbook, err)
	}
	if err != nil {
		return rows.counts, err
	}
	return rows.counts, rows.complete()
}

// keptInput copies the task's kept input workbook to a temporary file: the
// zip's directory is at its end, so the workbook is read from a file, never
// held in memory. errNoOwnWorkbook when there is none.
func (e *Exporter) keptInput(ctx context.Context, task store.Task) (*os.File, error) {
	key := InputKey(task.ID)
	rc, err := e.blobs.Open(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, fmt.Errorf("%w: the input was not kept at %s (split before inputs were kept)", errNoOwnWorkbook, key)
	}
	if err != nil {
		return nil, fmt.Errorf("open the kept input %s: %w", key, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(e.cfg.TempDir, "batchgen-input-*.xlsx")
	if err != nil {
		return nil, fmt.Errorf("copy the kept input: %w", err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("copy the kept input %s: %w", key, err)
	}
	return f, nil
}

// writeNewWorkbook writes a workbook of one sheet: the input columns as
// text, then ResultColumns.
func (e *Exporter) writeNewWorkbook(ctx context.Context, task store.Task, w io.Writer) (exportCounts, error) {
	sw, err := sheet.NewWriter(resultSheetName(task), newResultHeader(task))
	if err != nil {
		return exportCounts{}, fmt.Errorf("start workbook: %w", err)
	}
	defer sw.Close()
	sw.SetPrompt(task.Spec.Prompt, promptRows(task.Spec.Columns))
	var cells []sheet.Value
	counts, err := eachResultRow(ctx, e.store, task, func(input []string, added []sheet.Value) error {
		cells = cells[:0]
		for _, v := range input {
			cells = append(cells, sheet.Text(v))
		}
		return sw.WriteCells(append(cells, added...))
	})
	if err != nil {
		return counts, err
	}
	if _, err := sw.WriteTo(w); err != nil {
		return counts, fmt.Errorf("write workbook: %w", err)
	}
	return counts, nil
}

// writeCSV writes a CSV file (store.ResultCSV): the input's fields as they
// were read, then ResultColumns, in the input's delimiter (a comma for a
// workbook input).
func (e *Exporter) writeCSV(ctx context.Context, task store.Task, w io.Writer) (exportCounts, error) {
	cw, err := sheet.NewCSVWriter(w, task.Delimiter)
	if err != nil {
		return exportCounts{}, err
	}
	if err := cw.WriteRow(newResultHeader(task), nil); err != nil {
		return exportCounts{}, err
	}
	counts, err := eachResultRow(ctx, e.store, task, cw.WriteRow)
	if err != nil {
		return counts, err
	}
	return counts, cw.Flush()
}

// newResultHeader is the header of a result written anew (not into the
// user's workbook): the input columns, then ResultColumns. A result sent
// back in keeps its input columns and gets its result columns anew.
func newResultHeader(task store.Task) []string {
	input := inputColumns(task.Header, task.Spec.Columns)
	return append(slices.Clone(input), resultColumnNames(task.Spec.Columns, input)...)
}

// eachResultRow calls write with every row of task in row order: its input
// values (one per input column) and its ResultColumns cells.
func eachResultRow(ctx context.Context, st store.Store, task store.Task, write func(input []string, added []sheet.Value) error) (exportCounts, error) {
	keys, err := newRowKeys(task)
	if err != nil {
		return exportCounts{}, err
	}
	rows := newRowReader(st, task)
	input := make([]string, keys.input)
	for {
		r, err := rows.next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return rows.counts, err
		}
		for i := range input {
			input[i] = ""
			if i < len(r.Values) {
				input[i] = r.Values[i]
			}
		}
		if err := write(input, resultValues(task.Spec.Columns, r, keys.of(r))); err != nil {
			return rows.counts, fmt.Errorf("write row %d: %w", r.No, err)
		}
	}
	return rows.counts, rows.complete()
}

// rowReader reads a task's rows in row order, a page at a time, checking
// that none is missing and counting them.
type rowReader struct {
	store  store.Store
	task   store.Task
	page   []store.Row
	want   int // the row number expected next
	done   bool
	counts exportCounts
}

func newRowReader(st store.Store, task store.Task) *rowReader {
	return &rowReader{store: st, task: task, want: 1}
}

// peek returns the next row without taking it; io.EOF after the last.
func (r *rowReader) peek(ctx context.Context) (store.Row, error) {
	if len(r.page) == 0 {
		if r.done {
			return store.Row{}, io.EOF
		}
		rows, err := r.store.ListRows(ctx, store.ListRowsParams{TaskID: r.task.ID, FromNo: r.want, Limit: exportPage})
		if err != nil {
			return store.Row{}, fmt.Errorf("read rows from %d: %w", r.want, err)
		}
		r.page, r.done = rows, len(rows) < exportPage
		if len(rows) == 0 {
			return store.Row{}, io.EOF
		}
	}
	if got := r.page[0].No; got != r.want {
		return store.Row{}, fmt.Errorf("row %d is missing from the store (found %d)", r.want, got)
	}
	return r.page[0], nil
}

// next takes the next row; io.EOF after the last.
func (r *rowReader) next(ctx context.Context) (store.Row, error) {
	row, err := r.peek(ctx)
	if err != nil {
		return row, err
	}
	r.page = r.page[1:]
	r.want++
	r.counts.rows++
	if row.State != store.RowSucceeded && row.State != store.RowSkipped {
		r.counts.failed++
	}
	if row.State.Final() {
		r.counts.recount.Rows = r.counts.recount.Rows.Count(row.State)
	}
	if row.Usage != (store.Usage{}) {
		u := &r.counts.recount
		u.Total = u.Total.Add(row.Usage)
		if u.ByProvider == nil {
			u.ByProvider = map[string]store.Usage{}
		}
		u.ByProvider[row.Provider] = u.ByProvider[row.Provider].Add(row.Usage)
	}
	return row, nil
}

// complete checks that every row of the task was read.
func (r *rowReader) complete() error {
	if r.counts.rows != r.task.RowsTotal {
		return fmt.Errorf("found %d rows, the task has %d", r.counts.rows, r.task.RowsTotal)
	}
	return nil
}

// rowKeys computes the batchgen_key cell each result row records: the
// task's id and the row's RowKey (resultKeyCell).
type rowKeys struct {
	task  string
	spec  store.TaskSpec
	bound *prompt.Bound
	input int // how many of a row's values are input
}

func newRowKeys(task store.Task) (rowKeys, error) {
	tpl, err := prompt.Parse(task.Spec.Prompt)
	if err != nil {
		return rowKeys{}, fmt.Errorf("the task's template: %w", err)
	}
	input := inputColumns(task.Header, task.Spec.Columns)
	bound, err := tpl.Bind(input)
	if err != nil {
		return rowKeys{}, fmt.Errorf("the task's template: %w", err)
	}
	return rowKeys{task: task.ID, spec: task.Spec, bound: bound, input: len(input)}, nil
}

// of is the key of r; a blank row, never sent to the model, has none.
func (k rowKeys) of(r store.Row) string {
	if r.State == store.RowSkipped {
		return ""
	}
	return resultKeyCell(k.task, RowKey(k.spec, k.bound.Render(r.Values[:min(k.input, len(r.Values))])))
}

// hiddenColumns marks batchgen_key hidden among the result columns of a
// task declaring cols: it is for batchgen, not for reading.
func hiddenColumns(cols schema.Columns) []bool {
	names := ResultColumnsOf(cols)
	hidden := make([]bool, len(names))
	hidden[len(names)-1] = true // batchgen_key is last
	return hidden
}

// promptRows are what a result's added prompt sheet holds below the
// template: the declaration of cols as a table (none for a free-text
// task).
func promptRows(cols schema.Columns) [][]string {
	if len(cols) == 0 {
		return nil
	}
	return cols.Table()
}

// hasDates reports whether any of cols holds dates.
func hasDates(cols schema.Columns) bool {
	return slices.ContainsFunc(cols, func(c schema.Column) bool { return c.Type == schema.Date })
}

// resultValues are the cells a row gets in the result columns of a task
// declaring cols: its answer (the output text, or a cell of its type per
// declared column), then the bookkeeping: text for what is text, numbers
// for the counts, a boolean for cached; rerun empty for the user, and the
// row's key.
func resultValues(cols schema.Columns, r store.Row, key string) []sheet.Value {
	status, errText, class := "failed", r.Error, r.ErrorClass
	switch r.State {
	case store.RowSucceeded:
		status, errText, class = "succeeded", "", ""
	case store.RowSkipped:
		status, errText, class = "skipped", "blank row: not sent to the model", ""
	case store.RowPending:
		// Only reachable for a cancelled task: the row never ran.
		status = "not_started"
	}
	var cached, latency sheet.Value
	if r.State == store.RowSucceeded {
		cached = sheet.Bool(r.Cached)
	}
	if r.LatencyMS > 0 {
		latency = sheet.Int(r.LatencyMS)
	}
	// A succeeded row shows its tokens, 0 for a cached one (it cost
	// nothing); other rows only when a provider billed them.
	tokens := func(n int64) sheet.Value {
		if r.State == store.RowSucceeded || n > 0 {
			return sheet.Int(n)
		}
		return sheet.Value{}
	}
	return append(answerValues(cols, r), sheet.Text(status), sheet.Text(errText), sheet.Text(class), cached,
		sheet.Int(int64(r.Attempts)), latency, sheet.Text(r.Provider), tokens(r.InputTokens), tokens(r.OutputTokens),
		sheet.Value{}, sheet.Text(key))
}

// answerValues are a row's answer cells: its output as text, or for
// declared columns one cell of each column's type, empty where the answer
// left the column empty or the row has no answer. An answer that does not
// read as the columns (stored by another declaration) is written whole, as
// text, in the first column: it was paid for.
func answerValues(cols schema.Columns, r store.Row) []sheet.Value {
	if len(cols) == 0 {
		return []sheet.Value{sheet.Text(r.Output)}
	}
	vals := make([]sheet.Value, len(cols))
	if r.State != store.RowSucceeded || r.Output == "" {
		return vals
	}
	cells, err := cols.Cells(r.Output)
	if err != nil {
		vals[0] = sheet.Text(r.Output)
		return vals
	}
	for i, c := range cells {
		vals[i] = cellValue(c)
	}
	return vals
}

// cellValue is the sheet cell of one declared column's value: numbers and
// integers numeric, booleans TRUE/FALSE, dates date cells, enum, text and
// list text (never formulas).
func cellValue(v schema.Value) sheet.Value {
	if v.Empty {
		return sheet.Value{}
	}
	switch v.Type {
	case schema.Number, schema.Integer:
		return sheet.Number(v.Number)
	case schema.Boolean:
		return sheet.Bool(v.Bool)
	case schema.Date:
		return sheet.Date(v.Date)
	}
	return sheet.Text(v.Text)
}

// resultColumnNames returns the result columns of a task declaring cols
// (ResultColumnsOf), each prefixed with "batchgen_" where the input already
// has a column of that name (or an earlier result column took it), so no
// header is duplicated.
func resultColumnNames(cols schema.Columns, header []string) []string {
	taken := map[string]bool{}
	for _, h := range header {
		taken[strings.TrimSpace(h)] = true
	}
	all := ResultColumnsOf(cols)
	names := make([]string, len(all))
	for i, c := range all {
		name := c
		for taken[name] {
			name = "batchgen_" + name
		}
		taken[name] = true
		names[i] = name
	}
	return names
}

func resultSheetName(task store.Task) string {
	if task.Sheet != "" {
		return task.Sheet
	}
	return "result"
}
