package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// ErrNotReady is returned by Export for a task whose batches are not all done.
var ErrNotReady = errors.New("task is not ready for export")

// ResultColumns are the columns the export adds after the input columns.
var ResultColumns = []string{"output", "status", "error", "error_class", "cached", "attempts", "latency_ms",
	"provider", "input_tokens", "output_tokens"}

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

type exportCounts struct{ rows, failed int }

// WriteResult streams the result workbook of task to w: every input column
// in input order, then ResultColumns, one row per input row in row order.
func (e *Exporter) WriteResult(ctx context.Context, task store.Task, w io.Writer) (exportCounts, error) {
	var counts exportCounts
	header := append(slices.Clone(task.Header), resultColumnNames(task.Header)...)
	sw, err := sheet.NewWriter(resultSheetName(task), header)
	if err != nil {
		return counts, fmt.Errorf("start workbook: %w", err)
	}
	defer sw.Close()
	next := 1
	for {
		rows, err := e.store.ListRows(ctx, store.ListRowsParams{TaskID: task.ID, FromNo: next, Limit: exportPage})
		if err != nil {
			return counts, fmt.Errorf("read rows from %d: %w", next, err)
		}
		for _, r := range rows {
			if r.No != next {
				return counts, fmt.Errorf("row %d is missing from the store (found %d)", next, r.No)
			}
			if err := sw.WriteRow(resultRow(task, r)); err != nil {
				return counts, fmt.Errorf("write row %d: %w", r.No, err)
			}
			counts.rows++
			if r.State != store.RowSucceeded && r.State != store.RowSkipped {
				counts.failed++
			}
			next++
		}
		if len(rows) < exportPage {
			break
		}
	}
	if counts.rows != task.RowsTotal {
		return counts, fmt.Errorf("found %d rows, the task has %d", counts.rows, task.RowsTotal)
	}
	if _, err := sw.WriteTo(w); err != nil {
		return counts, fmt.Errorf("write workbook: %w", err)
	}
	return counts, nil
}

func resultRow(task store.Task, r store.Row) []string {
	values := make([]string, 0, len(task.Header)+len(ResultColumns))
	values = append(values, r.Values...)
	for len(values) < len(task.Header) {
		values = append(values, "")
	}
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
	cached := ""
	if r.State == store.RowSucceeded {
		cached = strconv.FormatBool(r.Cached)
	}
	latency := ""
	if r.LatencyMS > 0 {
		latency = strconv.FormatInt(r.LatencyMS, 10)
	}
	// A succeeded row shows its tokens, 0 for a cached one (it cost
	// nothing); other rows only when a provider billed them.
	tokens := func(n int64) string {
		if r.State == store.RowSucceeded || n > 0 {
			return strconv.FormatInt(n, 10)
		}
		return ""
	}
	return append(values, r.Output, status, errText, class, cached, strconv.Itoa(r.Attempts), latency,
		r.Provider, tokens(r.InputTokens), tokens(r.OutputTokens))
}

// resultColumnNames returns ResultColumns, prefixed with "batchgen_" where
// the input already has a column of that name, so no header is duplicated.
func resultColumnNames(header []string) []string {
	taken := map[string]bool{}
	for _, h := range header {
		taken[strings.TrimSpace(h)] = true
	}
	names := make([]string, len(ResultColumns))
	for i, c := range ResultColumns {
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
