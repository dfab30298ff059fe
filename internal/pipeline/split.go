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
	"time"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/prompt"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// DefaultBatchSize is the number of rows per batch when the spec sets none.
const DefaultBatchSize = 100

// maxBatchSize bounds a batch so one claim never holds an unreasonable
// amount of work under one lease.
const maxBatchSize = 1000

// rowChunk is how many rows go in one PutRows call.
const rowChunk = 500

// Splitter turns an input sheet into a task, its rows and batches, and the
// queue messages that reference the batches.
type Splitter struct {
	store store.Store
	queue queue.Queue
	cfg   SplitterConfig
}

// SplitterConfig names the splitter's optional collaborators; NewSplitter
// applies the defaults.
type SplitterConfig struct {
	// Clock stamps the task and batches. Defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Inputs keeps a copy of each workbook input at InputKey, for the
	// export to return the user's own workbook with the answers added.
	// Without it the result is a new workbook holding the input sheet's
	// values as text.
	Inputs blob.Store
	// Exports, when set, lets the splitter finish itself the batches whose
	// rows are all final when split (the kept rows of a result sent back
	// in), instead of sending each to a generator that would only count
	// them: it starts the task's export when that leaves nothing to do.
	// Without it every batch goes through the queue.
	Exports ExportStarter
	// EconomyBatchRows, when positive, is the fewest rows a batch of an
	// economy or auto task holds (at most the largest batch): a runtime
	// that sends each batch's rows as a provider batch of their own (the
	// AWS generators, which park between looks) then makes a tenth as
	// many provider batches of ten times the lines, which the providers'
	// job quotas and the looks at them favour. ParkedEconomyBatchRows is
	// what the AWS stack's splitter sets.
	EconomyBatchRows int
}

// ParkedEconomyBatchRows is the AWS stack's EconomyBatchRows: the largest
// batch. Fifty thousand rows make 50 provider batches rather than 500,
// each over Bedrock's 100-record minimum.
const ParkedEconomyBatchRows = maxBatchSize

func (c SplitterConfig) withDefaults() SplitterConfig {
	c.Clock = orClock(c.Clock)
	c.Logger = orLogger(c.Logger)
	return c
}

// NewSplitter returns a Splitter that writes tasks, rows and batches to st
// and enqueues the batches on q. It panics if a port is nil: a mistake in
// the wiring, caught at start-up.
func NewSplitter(st store.Store, q queue.Queue, cfg SplitterConfig) *Splitter {
	if err := errors.Join(required("Store", st), required("Queue", q)); err != nil {
		panic("pipeline.NewSplitter: " + err.Error())
	}
	return &Splitter{store: st, queue: q, cfg: cfg.withDefaults()}
}

// SplitParams describes one input to split.
type SplitParams struct {
	// TaskID is the derived id (see DeriveTaskID).
	TaskID string
	// Path is a local file holding the input.
	Path string
	// Source names the input for people (file name or object key).
	Source string
	// Owner is the principal the task belongs to (see store.Task.Owner);
	// the CLI passes LocalOwner.
	Owner string
	// Terms are the new task's (its spending cap, mode and deadline) from
	// its first batch on: no worker runs a row of it uncapped, or online
	// when it is to wait for the provider's batch API.
	Terms store.Terms
	// Spec is what to run. An empty Spec.Prompt takes the workbook's
	// "prompt" sheet (cell A1); with neither, the input is rejected.
	Spec store.TaskSpec
	// Sheet selects the input sheet; empty takes the first visible one.
	Sheet string
	// Encoding names the text encoding of a CSV input; empty detects it (see sheet.Options.Encoding).
	Encoding string
	// Limits bound the input; zero fields take sheet's defaults.
	Limits sheet.Limits
	// DefaultColumns are the output columns of an input whose request and
	// workbook declare none: the drop folder's sidecar, or the
	// deployment's.
	DefaultColumns schema.Columns
	// DefaultPrompt is the deployment's template, used when neither
	// Spec.Prompt nor the workbook has one (the order Intake resolves).
	DefaultPrompt string
	// Validated, when non-nil, is the result of Validate(p) run just
	// before, so Split does not read the input an extra time.
	Validated *Validated
	// Spool asks Validate to keep the records it reads in a temporary file
	// (in TempDir, default os.TempDir) for Split, so that the sheet is
	// opened and decoded once. The caller must Close the Validated.
	Spool   bool
	TempDir string
}

// Validated is an input that passed Validate.
type Validated struct {
	Summary sheet.Summary
	// Spec is the request's spec completed with defaults and, when the
	// request had no prompt, the workbook's prompt sheet.
	Spec store.TaskSpec
	// Notes are what a person should hear about the input before any model
	// call, though it is accepted (formulas batchgen computed).
	Notes []string
	// Rerun, for a result sent back in, says what becomes of its rows;
	// nil for any other input.
	Rerun *RerunCounts
	// spool holds the records read, when SplitParams.Spool asked for it.
	spool string
}

// Close removes the records Validate spooled, if it spooled any. It is
// safe to call more than once and on a zero Validated.
func (v *Validated) Close() error {
	if v == nil || v.spool == "" {
		return nil
	}
	err := os.Remove(v.spool)
	v.spool = ""
	return err
}

// Validate reads the whole input once and checks everything Split would
// reject, writing nothing: the sheet's limits and header, the template's
// syntax and that every placeholder names a column. Bad input returns
// *RejectedError. A result sent back in is recognised by its result columns
// (see RowKey): the template reads the columns before them, and Rerun says
// what will become of its rows.
func Validate(p SplitParams) (Validated, error) {
	opts := sheet.Options{Sheet: p.Sheet, Limits: p.Limits, DisplayName: p.Source, Encoding: p.Encoding}
	r, err := sheet.Open(p.Path, opts)
	if err != nil {
		return Validated{}, rejectIfInput(err)
	}
	defer r.Close()
	header := r.Header()
	spec, bound, specErr := bindTemplate(p, r)
	block, answers, rerun := resultBlock(header, spec.Columns)
	input, added := len(inputColumns(header, spec.Columns)), len(ResultColumnsOf(spec.Columns))
	if specErr == nil && r.Sheet() != "" && input+added > sheet.DefaultMaxColumns {
		specErr = &RejectedError{Err: fmt.Errorf("%s: sheet %q has %d columns and the result adds %d beside them, past Excel's last column %s; move the data to a narrower sheet",
			p.Source, r.Sheet(), input, added, sheet.ColumnName(sheet.DefaultMaxColumns))}
	}
	var counts *RerunCounts
	if rerun && specErr == nil {
		counts = &RerunCounts{}
	}
	var spool *spoolWriter
	if p.Spool && specErr == nil {
		if spool, err = newSpool(p.TempDir); err != nil {
			return Validated{}, err
		}
		defer func() {
			if spool != nil { // not handed over
				spool.discard()
			}
		}()
	}
	// The whole sheet is read before the template's error is told: a bad
	// cell is what the file's author must fix first.
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Validated{}, rejectIfInput(err)
		}
		if spool != nil {
			if err := spool.write(rec); err != nil {
				return Validated{}, fmt.Errorf("%s: spool the rows: %w", p.Source, err)
			}
		}
		if counts != nil {
			row := store.Row{Values: rec.Values}
			if rec.Blank {
				row.State = store.RowSkipped
			}
			rerunRow(row, block, answers, spec, bound, counts)
		}
	}
	if specErr != nil {
		return Validated{}, specErr
	}
	summary := r.Summary()
	notes, err := uncachedFormulas(p.Source, summary, bound)
	if err != nil {
		return Validated{}, err
	}
	if spec.BatchSize <= 0 {
		spec.BatchSize = DefaultBatchSize
	}
	if spec.BatchSize > maxBatchSize {
		spec.BatchSize = maxBatchSize
	}
	v := Validated{Summary: summary, Spec: spec, Notes: notes, Rerun: counts}
	if spool != nil {
		w := spool
		spool = nil
		if v.spool, err = w.finish(); err != nil {
			return Validated{}, err
		}
	}
	return v, nil
}

// bindTemplate completes the spec's template (the request's, else the
// workbook's prompt sheet, else the deployment's default) and binds it to
// the input's columns: for a result sent back in, the columns before the
// result's own, so that a placeholder never names an answer.
func bindTemplate(p SplitParams, r *sheet.Reader) (store.TaskSpec, *prompt.Bound, error) {
	spec := p.Spec
	if strings.TrimSpace(spec.Prompt) == "" {
		text, has := r.Prompt()
		switch {
		case has:
			spec.Prompt = text
		case strings.TrimSpace(p.DefaultPrompt) != "":
			spec.Prompt = p.DefaultPrompt
		default:
			return spec, nil, &RejectedError{Err: fmt.Errorf("%s: no prompt: pass --prompt or --prompt-file, or add a sheet named \"prompt\" with the template in cell A1", p.Source)}
		}
	}
	if len(spec.Columns) == 0 {
		// The request's columns, else the workbook's (a table below the
		// template on its prompt sheet), else the deployment's.
		cols, err := schema.ParseTable(r.PromptRows(), 2)
		if err != nil {
			return spec, nil, &RejectedError{Err: fmt.Errorf("%s: the output columns on the prompt sheet: %w", p.Source, err)}
		}
		if len(cols) == 0 {
			cols = p.DefaultColumns
		}
		spec.Columns = cols
	}
	if err := spec.Columns.Check(); err != nil {
		return spec, nil, &RejectedError{Err: fmt.Errorf("the output columns: %w", err)}
	}
	if err := checkRowsPerCall(spec.RowsPerCall); err != nil {
		return spec, nil, &RejectedError{Err: err}
	}
	tpl, err := prompt.Parse(spec.Prompt)
	if err != nil {
		return spec, nil, &RejectedError{Err: err}
	}
	bound, err := tpl.Bind(inputColumns(r.Header(), spec.Columns))
	if err != nil {
		return spec, nil, &RejectedError{Err: fmt.Errorf("%s: %w", p.Source, err)}
	}
	return spec, bound, nil
}

// uncachedFormulas judges the formulas the input holds no result for (a
// workbook a program wrote and no spreadsheet saved): one a placeholder
// needs and the reader could not compute would send a blank in its place,
// so the input is refused, naming the column; the others are said in notes.
func uncachedFormulas(source string, summary sheet.Summary, bound *prompt.Bound) ([]string, error) {
	var notes []string
	for _, c := range summary.Uncached {
		name := sheet.ColumnName(c.Column)
		if c.Column <= len(summary.Header) {
			name = fmt.Sprintf("%q (%s)", summary.Header[c.Column-1], name)
		}
		used := c.Column <= len(summary.Header) && bound.Uses(c.Column-1)
		if c.NotComputed > 0 && used {
			return nil, &RejectedError{Err: fmt.Errorf("%s: sheet %q column %s has %d formulas with no saved result, first in row %d, that batchgen cannot compute, and the prompt uses the column: "+
				"the file was written by a program and never saved by a spreadsheet; open and save it in Excel or LibreOffice, or paste the values", source, summary.Sheet, name, c.NotComputed, c.FirstNotComputed)}
		}
		switch {
		case c.NotComputed > 0:
			notes = append(notes, fmt.Sprintf("column %s: %d formulas with no saved result read as blank (batchgen cannot compute them; the prompt does not use the column)", name, c.NotComputed))
		case c.Computed > 0:
			notes = append(notes, fmt.Sprintf("column %s: %d formulas with no saved result were computed by batchgen", name, c.Computed))
		}
	}
	return notes, nil
}

// Split validates the input completely, then creates the task and writes
// its rows, batches and messages. It is idempotent and resumable: when the
// task exists and is still PENDING (a split died halfway) it writes what is
// missing; when it is past PENDING it returns the task unchanged.
// Bad input returns *RejectedError and writes nothing.
func (s *Splitter) Split(ctx context.Context, p SplitParams) (store.Task, error) {
	if existing, err := s.store.GetTask(ctx, p.TaskID); err == nil && existing.State != store.TaskPending {
		return existing, nil
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return store.Task{}, fmt.Errorf("split %s: look up task: %w", p.TaskID, err)
	}

	opts := sheet.Options{Sheet: p.Sheet, Limits: p.Limits, DisplayName: p.Source, Encoding: p.Encoding}
	v := p.Validated
	if v == nil {
		checked, err := Validate(p)
		if err != nil {
			return store.Task{}, err
		}
		v = &checked
	}
	summary, spec := v.Summary, v.Spec
	if p.Terms.Mode.Batched() && spec.BatchSize < s.cfg.EconomyBatchRows {
		spec.BatchSize = min(s.cfg.EconomyBatchRows, maxBatchSize)
	}
	for _, note := range v.Notes {
		s.cfg.Logger.InfoContext(ctx, "input note", logging.TaskID, p.TaskID, "source", p.Source, "note", note)
	}

	if err := s.keepInput(ctx, p, summary); err != nil {
		return store.Task{}, err
	}

	now := s.cfg.Clock.Now()
	batches := (summary.Rows + spec.BatchSize - 1) / spec.BatchSize
	task := store.Task{
		ID:           p.TaskID,
		State:        store.TaskPending,
		Spec:         spec,
		Owner:        p.Owner,
		Source:       p.Source,
		Sheet:        summary.Sheet,
		Encoding:     summary.Encoding,
		Delimiter:    summary.Delimiter,
		Header:       summary.Header,
		Rerun:        v.Rerun,
		Terms:        p.Terms,
		RowsTotal:    summary.Rows,
		BatchesTotal: batches,
		CreatedAt:    now,
		UpdatedAt:    now,
	}
	resumed := false
	if err := s.store.CreateTask(ctx, task); isConflict(err) {
		resumed = true // an earlier split of this input died halfway
	} else if err != nil {
		return store.Task{}, fmt.Errorf("split %s: create task: %w", p.TaskID, err)
	}

	tallies, err := s.writeRows(ctx, p, opts, task)
	if err != nil {
		return store.Task{}, err
	}
	if task.Sample > 0 {
		return s.hold(ctx, task, resumed)
	}
	toSend, err := s.unsent(ctx, task.ID, batches, resumed)
	if err != nil {
		return store.Task{}, err
	}
	var settled []int // batches whose rows are all final: the splitter finishes them
	if s.cfg.Exports != nil {
		toSend = slices.DeleteFunc(toSend, func(no int) bool {
			if tallies[no-1].pending == 0 {
				settled = append(settled, no)
				return true
			}
			return false
		})
	}
	if err := s.enqueue(ctx, task, toSend); err != nil {
		return store.Task{}, err
	}
	t, err := s.store.TransitionTask(ctx, store.EventSplit.Params(task.ID, s.cfg.Clock.Now()))
	if isConflict(err) {
		return s.store.GetTask(ctx, task.ID)
	}
	if err != nil {
		return store.Task{}, fmt.Errorf("split %s: start task: %w", task.ID, err)
	}
	if len(settled) > 0 {
		if t, err = s.finishSettled(ctx, t, settled, tallies); err != nil {
			return store.Task{}, err
		}
	}
	s.cfg.Logger.InfoContext(ctx, "task split", logging.TaskID, t.ID, "source", t.Source, "encoding", t.Encoding, "rows", t.RowsTotal, "batches", t.BatchesTotal,
		"finished_at_split", len(settled))
	return t, nil
}

// hold ends the split of a task that asks for a quote first: it sends its
// sample's messages instead of its batches' and holds it (EventHold) until
// its owner starts it (Starter.Start), which sends the batches. A split
// resumed after it died sends the sample again: rows already answered are
// not asked again, so a sample sent twice answers at most twice its size.
// Batches whose rows are all final at the split are finished when the
// task starts, as any batch (the generator makes no call for them).
func (s *Splitter) hold(ctx context.Context, task store.Task, resumed bool) (store.Task, error) {
	if msgs := SampleMessages(task, task.Sample); len(msgs) > 0 {
		if err := s.queue.Send(ctx, msgs); err != nil {
			return store.Task{}, fmt.Errorf("split %s: send the sample of %d rows: %w", task.ID, task.Sample, err)
		}
	}
	t, err := s.store.TransitionTask(ctx, store.EventHold.Params(task.ID, s.cfg.Clock.Now()))
	if isConflict(err) {
		return s.store.GetTask(ctx, task.ID)
	}
	if err != nil {
		return store.Task{}, fmt.Errorf("split %s: hold task: %w", task.ID, err)
	}
	s.cfg.Logger.InfoContext(ctx, "task split and held for a quote", logging.TaskID, t.ID, "source", t.Source, "rows", t.RowsTotal,
		"batches", t.BatchesTotal, "sample", t.Sample, "resumed", resumed)
	return t, nil
}

// finishSettled finishes the batches whose rows were all final when split,
// through the one end of a batch (finishBatch), which starts the export
// when it was the last. A batch someone else claimed meanwhile (a sweeper
// that found it waiting) is theirs to finish. A failure leaves the rest
// PENDING and never sent: the sweeper sends them, as any batch whose
// message was lost.
func (s *Splitter) finishSettled(ctx context.Context, t store.Task, settled []int, tallies []batchTally) (store.Task, error) {
	once := func(f func() error) error { return f() }
	for _, no := range settled {
		now := s.cfg.Clock.Now()
		b, err := s.store.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: t.ID, BatchNo: no, Owner: "splitter", Now: now, LeaseUntil: now.Add(time.Minute)})
		if isConflict(err) {
			continue
		}
		if err != nil {
			return t, fmt.Errorf("split %s: claim batch %d to finish it: %w", t.ID, no, err)
		}
		done, err := finishBatch(ctx, s.store, s.cfg.Exports, b, tallies[no-1], now, once)
		if isConflict(err) {
			continue
		}
		if done.ID != "" {
			t = done
		}
		if err != nil {
			return t, fmt.Errorf("split %s: %w", t.ID, err)
		}
	}
	return t, nil
}

// keepInput copies a workbook input to InputKey before the task exists, so
// that every export of the task finds it. A resumed split copies it again
// (the same bytes).
func (s *Splitter) keepInput(ctx context.Context, p SplitParams, summary sheet.Summary) error {
	if s.cfg.Inputs == nil || summary.Sheet == "" {
		return nil
	}
	f, err := os.Open(p.Path)
	if err != nil {
		return fmt.Errorf("split %s: keep the input: %w", p.TaskID, err)
	}
	defer f.Close()
	if err := s.cfg.Inputs.Put(ctx, InputKey(p.TaskID), f); err != nil {
		return fmt.Errorf("split %s: keep the input at %s: %w", p.TaskID, InputKey(p.TaskID), err)
	}
	return nil
}

// records is what writeRows reads rows from: the sheet itself, or the
// records Validate spooled.
type records interface {
	Next() (sheet.Record, error)
	Close() error
}

// writeRows writes the task's rows and batches, and returns each batch's
// tally of its rows as split (index batch number - 1).
func (s *Splitter) writeRows(ctx context.Context, p SplitParams, opts sheet.Options, task store.Task) ([]batchTally, error) {
	var r records
	if p.Validated != nil && p.Validated.spool != "" {
		sp, err := openSpool(p.Validated.spool)
		if err != nil {
			return nil, err
		}
		r = sp
	} else {
		sr, err := sheet.Open(p.Path, opts)
		if err != nil {
			return nil, rejectIfInput(err)
		}
		r = sr
	}
	defer r.Close()
	block, answers, rerun := resultBlock(task.Header, task.Spec.Columns)
	var (
		bound  *prompt.Bound
		counts RerunCounts
	)
	if rerun {
		tpl, err := prompt.Parse(task.Spec.Prompt)
		if err == nil {
			bound, err = tpl.Bind(inputColumns(task.Header, task.Spec.Columns))
		}
		if err != nil {
			return nil, &RejectedError{Err: fmt.Errorf("%s: %w", p.Source, err)}
		}
	}

	size := task.Spec.BatchSize
	tallies := make([]batchTally, task.BatchesTotal)
	rows := make([]store.Row, 0, rowChunk)
	var batches []store.Batch
	no := 0
	flush := func() error {
		if len(rows) == 0 {
			return nil
		}
		if err := store.Retry(ctx, s.cfg.Clock, s.cfg.Logger, func() error { return s.store.PutRows(ctx, rows) }); err != nil {
			return fmt.Errorf("split %s: write rows %d-%d: %w", task.ID, rows[0].No, rows[len(rows)-1].No, err)
		}
		rows = rows[:0]
		return nil
	}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, rejectIfInput(err)
		}
		no++
		row := store.Row{TaskID: task.ID, No: no, SheetRow: rec.SheetRow, Values: rec.Values}
		if rec.Blank {
			row.State = store.RowSkipped
		}
		if rerun {
			row = rerunRow(row, block, answers, task.Spec, bound, &counts)
		}
		if b := (no - 1) / size; b < len(tallies) {
			tallies[b].add(row.RowResult)
		}
		rows = append(rows, row)
		if len(rows) == cap(rows) {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if no != task.RowsTotal {
		return nil, fmt.Errorf("split %s: input changed while reading: %d rows, validated %d", task.ID, no, task.RowsTotal)
	}
	now := s.cfg.Clock.Now()
	for b := 1; b <= task.BatchesTotal; b++ {
		first := (b-1)*size + 1
		count := size
		if first+count-1 > no {
			count = no - first + 1
		}
		batches = append(batches, store.Batch{
			TaskID: task.ID, No: b, FirstRow: first, RowCount: count, State: store.BatchPending,
			Saved: tallies[b-1].RowCounts, CreatedAt: now, UpdatedAt: now,
		})
	}
	for start := 0; start < len(batches); start += rowChunk {
		end := min(start+rowChunk, len(batches))
		if err := store.Retry(ctx, s.cfg.Clock, s.cfg.Logger, func() error { return s.store.PutBatches(ctx, batches[start:end]) }); err != nil {
			return nil, fmt.Errorf("split %s: write batches %d-%d: %w", task.ID, start+1, end, err)
		}
	}
	if rerun {
		s.cfg.Logger.InfoContext(ctx, "a result sent back in: "+counts.String(), logging.TaskID, task.ID, "kept", counts.Kept,
			"changed", counts.Changed, "new", counts.New, "cleared", counts.Cleared, "flagged", counts.Flagged, "failed", counts.Failed)
	}
	return tallies, nil
}

// unsent lists the batches that need a message. A fresh split sends one per
// batch. A resumed one skips batches a worker has already claimed or
// finished: their message evidently arrived. (A batch whose message was sent
// but not yet claimed when the split died gets a second one; the
// conditional claim makes that harmless.)
func (s *Splitter) unsent(ctx context.Context, taskID string, batches int, resumed bool) ([]int, error) {
	if !resumed {
		all := make([]int, batches)
		for i := range all {
			all[i] = i + 1
		}
		return all, nil
	}
	pending, err := s.store.ListBatches(ctx, store.ListBatchesParams{TaskID: taskID, States: []store.BatchState{store.BatchPending}})
	if err != nil {
		return nil, fmt.Errorf("split %s: list batches to enqueue: %w", taskID, err)
	}
	var out []int
	for _, b := range pending {
		if b.Attempt == 0 {
			out = append(out, b.No)
		}
	}
	return out, nil
}

func (s *Splitter) enqueue(ctx context.Context, task store.Task, batches []int) error {
	if len(batches) == 0 {
		return nil
	}
	// One Send: the queue adapters split it as their backend needs.
	if err := s.queue.Send(ctx, BatchMessages(task, batches)); err != nil {
		return fmt.Errorf("split %s: enqueue %d batches: %w", task.ID, len(batches), err)
	}
	return nil
}

// rejectIfInput wraps sheet input errors as *RejectedError and passes other
// errors (I/O) through.
func rejectIfInput(err error) error {
	var ie *sheet.InputError
	if errors.As(err, &ie) {
		return &RejectedError{Err: err}
	}
	return err
}
