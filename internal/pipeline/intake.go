package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"sync"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/logging"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// IncomingPrefix is the drop folder: objects created under it are inputs.
const IncomingPrefix = "incoming/"

// IsInputKey reports whether the object key (decoded) is an input: a sheet
// (.xlsx, .xlsm, .csv or .tsv, the extension in any letter case) under the
// drop folder. The bucket notification filters on the prefix only, because
// S3 suffix filters are case-sensitive and cannot list every spelling of an
// extension; this decides the rest, for the deployed stack and the local
// drop-folder watch alike.
func IsInputKey(key string) bool {
	return strings.HasPrefix(key, IncomingPrefix) && !strings.HasSuffix(key, "/") && sheet.IsSheetName(key)
}

// DefaultMaxInputBytes is the largest input Intake downloads.
const DefaultMaxInputBytes = 100 << 20

// DropFolder is the blob store inputs are dropped into: it must tell an
// object's size without downloading it (S3 HeadObject).
type DropFolder interface {
	blob.Store
	// Size returns the object's size in bytes, or an error wrapping
	// blob.ErrNotFound.
	Size(ctx context.Context, key string) (int64, error)
}

// Upload is what an API upload record says about its input.
type Upload struct {
	Spec     store.TaskSpec
	Filename string
	// Owner is the principal that created the upload; the task is theirs.
	Owner string
	// Encoding names the text encoding of a CSV input; empty detects it.
	Encoding string
	// Terms are the task's cap, mode and deadline.
	Terms store.Terms
}

// UploadRecords finds the records of inputs uploaded through the API.
type UploadRecords interface {
	// LookupUpload returns the upload of task taskID, or an error wrapping
	// blob.ErrNotFound when there is none (a plain drop-folder input, or
	// an id that cannot name a task).
	LookupUpload(ctx context.Context, taskID string) (Upload, error)
}

// IntakeConfig tunes Intake and names its optional collaborators.
type IntakeConfig struct {
	// DefaultSpec is the deployment's spec for drop-folder inputs; its
	// Prompt applies when the workbook has no "prompt" sheet.
	DefaultSpec store.TaskSpec
	// Limits bound the input; MaxFileBytes also bounds the download.
	// Zero fields take sheet's defaults, and MaxFileBytes defaults to
	// DefaultMaxInputBytes.
	Limits sheet.Limits
	// Uploads, when non-nil, supplies the spec and owner of inputs
	// uploaded through the API (incoming/<task id>/<name>).
	Uploads UploadRecords
	// Owner is the principal drop-folder inputs belong to (API uploads
	// belong to their uploader). Defaults to LocalOwner.
	Owner string
	// Sidecars, when set, makes a drop-folder input's sidecar prompt file
	// (SidecarPromptKey) its template when the workbook has no "prompt"
	// sheet. The local drop folder and the deployed splitter set it (the
	// splitter may list the bucket, so S3 answers a missing sidecar with
	// 404, not 403).
	Sidecars bool
	// BatchModes, when set, lets a settings sidecar ask for economy or
	// auto: the runtime runs provider batches (both runtimes do).
	// Without it such a sidecar rejects its input, saying why.
	BatchModes bool
	// MoveTaken, when set, makes Accept move a taken input (see
	// IntakeResult.Taken) from incoming/ to ProcessedKey once its intake
	// is done, through the DropFolder's Move. The deployed splitter sets
	// it; the local drop folder (dropdir) renames its files itself after
	// Accept returns, by the same rule.
	MoveTaken bool
	// TempDir receives the downloaded input and the rows Validate spools
	// for the split. Defaults to os.TempDir().
	TempDir string
	// Clock stamps rejected tasks. Defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
}

func (c IntakeConfig) withDefaults() IntakeConfig {
	if c.Limits.MaxFileBytes <= 0 {
		c.Limits.MaxFileBytes = DefaultMaxInputBytes
	}
	if c.TempDir == "" {
		c.TempDir = os.TempDir()
	}
	if c.Owner == "" {
		c.Owner = LocalOwner
	}
	c.Clock = orClock(c.Clock)
	c.Logger = orLogger(c.Logger)
	return c
}

// Intake turns a file dropped into the drop folder into a task: it picks
// the inputs out of the folder's keys, names the task (an API upload's id,
// or one derived from the object's version so a duplicate event continues
// the same task and a new upload to the same key starts a new one),
// downloads the file within the size limit, resolves the prompt, validates
// and splits. A rejected input becomes a FAILED task with the reason and an
// error file beside where the result would have gone (ErrorFileKey). The
// splitter Lambda and a local drop folder only wire it to their events.
type Intake struct {
	split   *Splitter
	objects DropFolder
	exports ExportStarter
	cfg     IntakeConfig
	// taking serializes the intakes of one key within this process:
	// `batchgen serve` takes an API upload twice (its API at once, its drop
	// folder when it sees the file), and the second must find the first's
	// task rather than split the same input beside it. Across processes
	// (two deliveries of one S3 event) the split is safe side by side,
	// only wasteful.
	taking keyedMutex
}

// keyedMutex is a mutex per key, held only while in use.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	users int
}

// lock takes key's lock and returns its unlock.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// NewIntake returns an Intake that reads inputs from objects, splits them
// with split and starts the export of a task with no batches through
// exports. It panics if a port is nil: a mistake in the wiring, caught at
// start-up.
func NewIntake(split *Splitter, objects DropFolder, exports ExportStarter, cfg IntakeConfig) *Intake {
	if err := errors.Join(required("Splitter", split), required("DropFolder", objects), required("ExportStarter", exports)); err != nil {
		panic("pipeline.NewIntake: " + err.Error())
	}
	return &Intake{split: split, objects: objects, exports: exports, cfg: cfg.withDefaults()}
}

// IntakeOutcome is what became of a dropped object.
type IntakeOutcome int

const (
	// IntakeIgnored: not an input (outside the folder, a folder marker),
	// gone, or a duplicate of a task that got past splitting.
	IntakeIgnored IntakeOutcome = iota
	// IntakeSplit: the task was created (or continued) and enqueued.
	IntakeSplit
	// IntakeRejected: the input was refused; the task is FAILED with the
	// reason and the error file is written.
	IntakeRejected
)

// IntakeResult reports one Accept.
type IntakeResult struct {
	Outcome IntakeOutcome
	// TaskID is the task the object belongs to; empty when ignored before
	// it was named.
	TaskID string
	// Taken is true when the input is done with and belongs in processed/
	// (ProcessedKey): it was split, rejected with its error file written,
	// exported again, or is a duplicate of a task that exists. It is false
	// for an object that is no input or was gone when looked at: there is
	// nothing to move.
	Taken bool
	// Moved is true when Accept moved the input to processed/
	// (IntakeConfig.MoveTaken).
	Moved bool
}

// DropTaskID is the task id of a drop-folder input at key whose object
// version (or ETag, on an unversioned bucket) is version, under the
// deployment's default spec.
func DropTaskID(key, version string, defaultSpec store.TaskSpec) string {
	return DeriveTaskID(key+"@"+version, defaultSpec)
}

// ErrorFileKey is where the reason for rejecting the input at key is
// written: incoming/<path> -> results/<path>.error.txt.
func ErrorFileKey(key string) string {
	return "results/" + strings.TrimPrefix(key, IncomingPrefix) + ".error.txt"
}

// ProcessedPrefix is where a drop folder moves an input once it has been
// taken (split, rejected, or a duplicate of a known task).
const ProcessedPrefix = "processed/"

// ProcessedKey is where the drop-folder input at key goes once taken:
// incoming/<path> -> processed/<path>, the sub-path kept as for results.
func ProcessedKey(key string) string {
	return ProcessedPrefix + strings.TrimPrefix(key, IncomingPrefix)
}

// SidecarSuffix ends the name of a drop-folder input's own prompt file.
const SidecarSuffix = ".prompt.txt"

// SidecarPromptKey is the prompt file that goes with the drop-folder input
// at key: incoming/<path>/<name>.<ext> -> incoming/<path>/<name>.prompt.txt.
// Its template applies when the workbook has no "prompt" sheet, before the
// deployment's default.
func SidecarPromptKey(key string) string {
	return strings.TrimSuffix(key, path.Ext(key)) + SidecarSuffix
}

// maxSidecarBytes bounds a sidecar prompt file: the API's prompt limit.
const maxSidecarBytes = 32 << 10

// input is one object to split.
type input struct {
	key    string
	taskID string
	spec   store.TaskSpec
	// source names the input on the task; display names it in messages.
	source, display string
	// owner is the principal the task belongs to.
	owner string
	// encoding is the CSV encoding asked for; empty detects it.
	encoding string
	// terms are the task's cap, mode and deadline (an upload's, or the
	// settings sidecar's).
	terms store.Terms
	// upload is true when an API upload record supplied the spec.
	upload bool
	// sidecar is the template of the input's sidecar prompt file; empty
	// when it has none.
	sidecar string
	// columns are the output columns declared by the input's columns
	// sidecar (SidecarColumnsKey), and columnsErr why that file could not
	// be read as a declaration.
	columns    schema.Columns
	columnsErr error
}

// Accept takes the object at key (already URL-decoded) whose version (or
// ETag) is version. It returns an error only for failures a retry may fix;
// a rejected input is an outcome, not an error, because retrying cannot
// fix a bad file. Accept is idempotent: a repeated call continues the same
// task.
//
// With IntakeConfig.MoveTaken a taken input is then moved to processed/.
// An input already moved (a duplicate S3 event after the first one's move:
// S3 delivers events at least once) finds its task and nothing to move,
// and is a quiet no-op.
func (in *Intake) Accept(ctx context.Context, key, version string) (IntakeResult, error) {
	defer in.taking.lock(key)()
	res, err := in.accept(ctx, key, version)
	if err != nil || !res.Taken || !in.cfg.MoveTaken {
		return res, err
	}
	to := ProcessedKey(key)
	err = in.objects.Move(ctx, key, to)
	switch {
	case errors.Is(err, blob.ErrNotFound):
		// Moved by an earlier delivery of the same event.
	case err != nil:
		// The task is in place; the retried event finds it and moves again.
		return res, fmt.Errorf("move %s to %s: %w", key, to, err)
	default:
		res.Moved = true
		in.cfg.Logger.InfoContext(ctx, "input moved to processed", logging.TaskID, res.TaskID, "key", key, "moved_to", to)
	}
	return res, nil
}

func (in *Intake) accept(ctx context.Context, key, version string) (IntakeResult, error) {
	log := in.cfg.Logger
	if !IsInputKey(key) {
		log.InfoContext(ctx, "ignoring object that is not a sheet in the drop folder", "key", key)
		return IntakeResult{}, nil
	}
	src, err := in.identify(ctx, key, version)
	if err != nil {
		return IntakeResult{}, err
	}
	res := IntakeResult{TaskID: src.taskID}
	ctx = logging.With(ctx, logging.TaskID, src.taskID)
	log = log.With("key", key)

	// A repeated event for a task that got past splitting (or was
	// rejected) has nothing left to do: skip the download.
	if t, err := in.split.store.GetTask(ctx, src.taskID); err == nil && t.State != store.TaskPending {
		if gone, err := in.resultGone(ctx, t); err != nil {
			return res, fmt.Errorf("split %s: %w", key, err)
		} else if gone {
			// The same file dropped again after its result expired: write
			// the result again from the stored rows, no model call.
			started, err := Reexport(ctx, in.split.store, in.exports, t, in.cfg.Clock.Now())
			if err != nil {
				return res, fmt.Errorf("split %s: %w", key, err)
			}
			log.InfoContext(ctx, "input dropped again after its result was gone; exporting it again", "state", t.State, "started", started)
			res.Outcome, res.Taken = IntakeSplit, true
			return res, nil
		}
		log.InfoContext(ctx, "duplicate upload event; the task exists", "state", t.State)
		res.Taken = true
		return res, nil
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return res, fmt.Errorf("split %s: look up task %s: %w", key, src.taskID, err)
	}

	limits := in.cfg.Limits
	size, err := in.objects.Size(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		log.WarnContext(ctx, "object is gone; nothing to split")
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("split %s: size: %w", key, err)
	}
	if size > limits.MaxFileBytes {
		return in.reject(ctx, src, fmt.Sprintf("%s: the file is %s; the limit is %s", src.display, mib(size), mib(limits.MaxFileBytes)))
	}
	file, err := in.download(ctx, key, limits.MaxFileBytes)
	if errors.Is(err, errTooBig) {
		return in.reject(ctx, src, fmt.Sprintf("%s: the file is larger than the limit of %s", src.display, mib(limits.MaxFileBytes)))
	}
	if errors.Is(err, blob.ErrNotFound) {
		log.WarnContext(ctx, "object is gone; nothing to split")
		return res, nil
	}
	if err != nil {
		return res, err
	}
	defer os.Remove(file)

	if src.columnsErr != nil {
		return in.reject(ctx, src, fmt.Sprintf("%s: %v", src.display, src.columnsErr))
	}
	params := SplitParams{TaskID: src.taskID, Path: file, Source: src.source, Owner: src.owner, Spec: src.spec, Encoding: src.encoding, Terms: src.terms, Limits: limits,
		Spool: true, TempDir: in.cfg.TempDir, DefaultColumns: in.cfg.DefaultSpec.Columns}
	if len(src.columns) > 0 {
		params.DefaultColumns = src.columns
	}
	params.Spec.Prompt = in.prompt(file, params, src.sidecar)
	// The display name, not the temporary file's, must appear in messages.
	params.Source = src.display
	v, err := Validate(params)
	params.Source = src.source
	var rejected *RejectedError
	if errors.As(err, &rejected) {
		return in.reject(ctx, src, rejected.Error())
	}
	if err != nil {
		return res, fmt.Errorf("split %s: validate: %w", key, err)
	}
	defer v.Close()
	params.Validated = &v
	task, err := in.split.Split(ctx, params)
	if errors.As(err, &rejected) {
		return in.reject(ctx, src, rejected.Error())
	}
	if err != nil {
		return res, fmt.Errorf("split %s: %w", key, err)
	}
	log.InfoContext(ctx, "input split", "rows", task.RowsTotal, "batches", task.BatchesTotal, "state", task.State, "upload", src.upload)
	res.Outcome = IntakeSplit
	// A task with no batch (nothing would ever finish one and start its
	// export) needs its export now; any other is left to its last batch.
	if _, err := StartExportOnce(ctx, in.split.store, in.exports, task, in.cfg.Clock.Now()); err != nil {
		return res, fmt.Errorf("split %s: start export of task %s: %w", key, task.ID, err)
	}
	res.Taken = true
	return res, nil
}

// identify names the task an object belongs to. An object at
// incoming/<id>/<name> whose <id> has an API upload record belongs to task
// <id> with the record's spec; any other object is a drop-folder input whose
// task id derives from the object's version (DropTaskID).
// resultGone reports whether t is a finished task whose result file no
// longer exists (expired by the bucket's lifecycle rule, or deleted).
func (in *Intake) resultGone(ctx context.Context, t store.Task) (bool, error) {
	if !t.CanReexport() {
		return false, nil
	}
	_, err := in.objects.Size(ctx, t.ResultKey)
	if errors.Is(err, blob.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("look for the result %s of task %s: %w", t.ResultKey, t.ID, err)
	}
	return false, nil
}

func (in *Intake) identify(ctx context.Context, key, version string) (input, error) {
	rest := strings.TrimPrefix(key, IncomingPrefix)
	if id, name, ok := strings.Cut(rest, "/"); ok && in.cfg.Uploads != nil && !strings.Contains(name, "/") {
		up, err := in.cfg.Uploads.LookupUpload(ctx, id)
		switch {
		case err == nil:
			return input{key: key, taskID: id, spec: up.Spec, source: up.Filename, display: up.Filename, owner: up.Owner, encoding: up.Encoding, terms: up.Terms, upload: true}, nil
		case !errors.Is(err, blob.ErrNotFound):
			return input{}, fmt.Errorf("split %s: %w", key, err)
		}
	}
	spec := in.cfg.DefaultSpec
	// Resolved after the workbook's prompt sheet: see prompt, and
	// SplitParams.DefaultColumns.
	spec.Prompt, spec.Columns = "", nil
	sidecar, err := in.sidecar(ctx, SidecarPromptKey(key))
	if err != nil {
		return input{}, err
	}
	if sidecar != "" {
		// The sidecar is part of what the input asks for: a file dropped
		// again with another sidecar (say, after its first drop was
		// rejected for want of a prompt) is another task.
		version += "|prompt=" + DeriveTaskID(sidecar, store.TaskSpec{})
	}
	src := input{
		key:     key,
		spec:    spec,
		source:  key,
		display: path.Base(key),
		owner:   in.cfg.Owner,
		sidecar: sidecar,
	}
	ck := SidecarColumnsKey(key)
	text, err := in.sidecar(ctx, ck)
	if err != nil {
		return input{}, err
	}
	if text != "" {
		// So is its declaration of columns.
		version += "|columns=" + DeriveTaskID(text, store.TaskSpec{})
		if src.columns, err = schema.ParseText(text); err != nil {
			src.columnsErr = fmt.Errorf("the output columns in %s: %w", path.Base(ck), err)
		}
	}
	text, err = in.sidecar(ctx, SidecarSettingsKey(key))
	if err != nil {
		return input{}, err
	}
	if text != "" {
		version += "|settings=" + DeriveTaskID(text, store.TaskSpec{})
		if err := in.applySettings(&src, text); err != nil && src.columnsErr == nil {
			src.columnsErr = fmt.Errorf("%s: %w", path.Base(SidecarSettingsKey(key)), err)
		}
	}
	src.taskID = DropTaskID(key, version, in.cfg.DefaultSpec)
	return src, nil
}

// SidecarSettingsKey is the file beside a drop-folder input at key that may
// set what a request sets for an upload: a JSON object with "columns" (any
// form schema.ParseJSON reads), "rows_per_call", "max_cost_usd" (the
// task's spending cap), "mode" and "deadline" (an RFC 3339 time, or a
// duration such as "6h" from when the input is taken), and "sample" (a
// quote first: the task is held while that many rows are answered, and its
// owner reads the quote and starts it on the page or through the API). Its columns come after
// a columns sidecar's (SidecarColumnsKey) and before the deployment's.
func SidecarSettingsKey(key string) string {
	return strings.TrimSuffix(key, path.Ext(key)) + ".batchgen.json"
}

// applySettings reads a settings sidecar into src.
func (in *Intake) applySettings(src *input, text string) error {
	var s struct {
		Columns     json.RawMessage `json:"columns"`
		RowsPerCall *int            `json:"rows_per_call"`
		MaxCostUSD  *float64        `json:"max_cost_usd"`
		Mode        string          `json:"mode"`
		Deadline    string          `json:"deadline"`
		Sample      *int            `json:"sample"`
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf(`not a JSON object of settings ("columns", "rows_per_call", "max_cost_usd", "mode", "deadline", "sample"): %w`, err)
	}
	if s.Sample != nil {
		if err := CheckSample("sample", *s.Sample); err != nil {
			return err
		}
		src.terms.Sample = *s.Sample
	}
	if s.Mode != "" || s.Deadline != "" {
		mode, deadline, err := ParseModeDeadline(s.Mode, s.Deadline, in.cfg.Clock.Now())
		if err != nil {
			return err
		}
		if mode.Batched() && !in.cfg.BatchModes {
			return fmt.Errorf("mode %s: this deployment runs tasks online only", mode)
		}
		src.terms.Mode, src.terms.Deadline = mode, deadline
	}
	if s.MaxCostUSD != nil {
		if err := CheckMaxCost("max_cost_usd", *s.MaxCostUSD); err != nil {
			return err
		}
		src.terms.MaxCost = *s.MaxCostUSD
	}
	if s.RowsPerCall != nil {
		if err := checkRowsPerCall(*s.RowsPerCall); err != nil {
			return err
		}
		src.spec.RowsPerCall = *s.RowsPerCall
		if src.spec.RowsPerCall == 1 {
			src.spec.RowsPerCall = 0
		}
	}
	if len(src.columns) == 0 && len(s.Columns) > 0 {
		cols, err := schema.ParseJSON(s.Columns)
		if err != nil {
			return fmt.Errorf("columns: %w", err)
		}
		src.columns = cols
	}
	return nil
}

// SidecarColumnsKey is the file beside a drop-folder input at key that may
// declare its output columns: <name>.columns.txt, holding the short form
// (as --columns takes it) or JSON (a list of columns, a JSON Schema:
// schema.ParseJSON). A workbook's own declaration (its prompt sheet) comes
// first. Each sidecar is one read per input (one S3 GetObject on AWS), so
// there are two: this one, and the settings (SidecarSettingsKey).
func SidecarColumnsKey(key string) string {
	return strings.TrimSuffix(key, path.Ext(key)) + ".columns.txt"
}

// sidecar reads a sidecar file (SidecarPromptKey, SidecarColumnsKey, SidecarSettingsKey) at
// key: its text with trailing line breaks removed, or "" when there is
// none or it is blank. A file over the prompt limit is read only up to it;
// Validate then reports what the template lacks.
func (in *Intake) sidecar(ctx context.Context, key string) (string, error) {
	if !in.cfg.Sidecars {
		return "", nil
	}
	rc, err := in.objects.Open(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxSidecarBytes))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	text := strings.TrimRight(string(b), "\r\n")
	if strings.TrimSpace(text) == "" {
		return "", nil
	}
	return text, nil
}

// prompt resolves the template: the request's (an upload record's), else
// the workbook's "prompt" sheet, else the input's sidecar prompt file, else
// the deployment's default. An input that cannot be opened keeps the
// request's; Validate then reports why.
func (in *Intake) prompt(file string, p SplitParams, sidecar string) string {
	if strings.TrimSpace(p.Spec.Prompt) != "" {
		return p.Spec.Prompt
	}
	r, err := sheet.Open(file, sheet.Options{Sheet: p.Sheet, Limits: p.Limits, DisplayName: p.Source})
	if err != nil {
		return p.Spec.Prompt
	}
	defer r.Close()
	if text, ok := r.Prompt(); ok && strings.TrimSpace(text) != "" {
		return text
	}
	if sidecar != "" {
		return sidecar
	}
	return in.cfg.DefaultSpec.Prompt
}

// reject records a refused input where its owner will look: a FAILED task
// with the reason (GET /api/tasks/{id}) and an error file beside the
// results.
func (in *Intake) reject(ctx context.Context, src input, reason string) (IntakeResult, error) {
	res := IntakeResult{TaskID: src.taskID}
	now := in.cfg.Clock.Now()
	st := in.split.store
	err := st.CreateTask(ctx, store.Task{
		ID: src.taskID, State: store.TaskFailed, Spec: src.spec, Source: src.source, Owner: src.owner, Error: reason,
		CreatedAt: now, UpdatedAt: now, FinishedAt: now,
	})
	if err != nil && !errors.Is(err, store.ErrConflict) {
		return res, fmt.Errorf("reject %s: record failed task %s: %w", src.key, src.taskID, err)
	}
	if errors.Is(err, store.ErrConflict) {
		// A PENDING task of this id exists: a split that died halfway
		// before the input changed under it. Fail it the ordinary way.
		fail := store.EventReject.Params(src.taskID, now)
		fail.Error = reason
		_, terr := st.TransitionTask(ctx, fail)
		if terr != nil && !errors.Is(terr, store.ErrConflict) {
			return res, fmt.Errorf("reject %s: fail task %s: %w", src.key, src.taskID, terr)
		}
	}
	errKey := ErrorFileKey(src.key)
	if err := in.objects.Put(ctx, errKey, strings.NewReader(reason+"\n")); err != nil {
		return res, fmt.Errorf("reject %s: write %s: %w", src.key, errKey, err)
	}
	in.cfg.Logger.WarnContext(ctx, "input rejected", logging.TaskID, src.taskID, "key", src.key, "reason", reason, "error_file", errKey)
	res.Outcome, res.Taken = IntakeRejected, true
	return res, nil
}

var errTooBig = errors.New("input exceeds the size limit")

// download copies the object to a temporary file and returns its path. It
// stops past limit bytes (the object may have grown since Size).
func (in *Intake) download(ctx context.Context, key string, limit int64) (string, error) {
	rc, err := in.objects.Open(ctx, key)
	if err != nil {
		return "", fmt.Errorf("split %s: open: %w", key, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(in.cfg.TempDir, "batchgen-input-*"+path.Ext(key))
	if err != nil {
		return "", fmt.Errorf("split %s: create temporary file: %w", key, err)
	}
	n, err := io.Copy(f, io.LimitReader(rc, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		os.Remove(f.Name())
		return "", fmt.Errorf("split %s: download: %w", key, err)
	case n > limit:
		os.Remove(f.Name())
		return "", errTooBig
	}
	return f.Name(), nil
}

// mib renders a byte count for people.
func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
