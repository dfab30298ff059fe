package lambdafn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

// IncomingPrefix is the drop folder: objects created under it are inputs.
const IncomingPrefix = "incoming/"

// IsInputKey reports whether the object key (decoded) is an input: a sheet (.xlsx, .xlsm, .csv or .tsv, the
// extension in any letter case) under the drop folder. The bucket notification filters on the prefix only,
// because S3 suffix filters are case-sensitive and cannot list every spelling of an extension; this decides the
// rest, for the deployed stack and the local drop-folder watch alike.
func IsInputKey(key string) bool {
	return strings.HasPrefix(key, IncomingPrefix) && !strings.HasSuffix(key, "/") && sheet.IsSheetName(key)
}

// DefaultMaxInputBytes is the largest input the splitter downloads.
const DefaultMaxInputBytes = 100 << 20

// Objects is the blob store the splitter reads inputs from: it must tell an
// object's size without downloading it (S3 HeadObject).
type Objects interface {
	blob.Store
	// Size returns the object's size in bytes, or an error wrapping
	// blob.ErrNotFound.
	Size(ctx context.Context, key string) (int64, error)
}

// Splitter handles S3 ObjectCreated events for the drop folder: it checks
// the object, downloads it to a temporary file and runs pipeline.Validate
// and Splitter.Split. A rejected input becomes a FAILED task with the
// reason and a results/<name>.error.txt beside where the result would have
// gone; the event then succeeds, because retrying cannot fix a bad file.
// Other failures return an error so that Lambda retries the event; Split
// is idempotent, so a retried or duplicated event continues one task.
type Splitter struct {
	// Split writes the task, rows, batches and messages.
	Split *pipeline.Splitter
	// Store is Split's store, where rejected inputs are recorded.
	Store store.Store
	// Clock stamps rejected tasks. Defaults to the wall clock.
	Clock clock.Clock
	// Objects holds the inputs, the upload records and the error files.
	Objects Objects
	// Exports, when non-nil, starts the export of a task that has no
	// batches at all (nothing would ever finish one).
	Exports pipeline.ExportStarter
	// DefaultSpec is the deployment's spec for drop-folder inputs; its
	// Prompt applies when the workbook has no "prompt" sheet.
	DefaultSpec store.TaskSpec
	// Limits bound the input; MaxFileBytes also bounds the download.
	// Zero fields take sheet's defaults, and MaxFileBytes defaults to
	// DefaultMaxInputBytes.
	Limits sheet.Limits
	// TempDir receives the downloaded input. Defaults to os.TempDir().
	TempDir string
	// Metrics, when non-nil, receives TasksSplit and TasksRejected.
	Metrics *metrics.Emitter
	Logger  *slog.Logger
}

// input is one object to split.
type input struct {
	key string
	// taskID is the upload id, or derived from the object's version.
	taskID string
	spec   store.TaskSpec
	// source names the input on the task; display names it in messages.
	source, display string
	// upload is true when an API upload record supplied the spec.
	upload bool
}

// Handle processes every record of an S3 event. It returns an error only
// for failures a retry may fix; the records already split stay split.
func (h *Splitter) Handle(ctx context.Context, ev events.S3Event) error {
	var errs []error
	split, rejected := 0, 0
	for _, rec := range ev.Records {
		outcome, err := h.handleRecord(ctx, rec)
		if err != nil {
			errs = append(errs, err)
		}
		switch outcome {
		case outcomeSplit:
			split++
		case outcomeRejected:
			rejected++
		}
	}
	if h.Metrics != nil && split+rejected > 0 {
		err := h.Metrics.Emit([]metrics.Value{{Name: metrics.TasksSplit, Value: float64(split)}, {Name: metrics.TasksRejected, Value: float64(rejected)}}, nil)
		if err != nil {
			h.logger().Warn("write metrics failed", "error", err)
		}
	}
	return errors.Join(errs...)
}

type recordOutcome int

const (
	outcomeIgnored recordOutcome = iota
	outcomeSplit
	outcomeRejected
)

func (h *Splitter) handleRecord(ctx context.Context, rec events.S3EventRecord) (recordOutcome, error) {
	log := h.logger()
	if !strings.HasPrefix(rec.EventName, "ObjectCreated:") {
		log.Info("ignoring event", "event", rec.EventName, "key", rec.S3.Object.Key)
		return outcomeIgnored, nil
	}
	// Keys arrive URL-encoded, with '+' for a space.
	key, err := url.QueryUnescape(rec.S3.Object.Key)
	if err != nil {
		log.Error("ignoring object with an undecodable key", "key", rec.S3.Object.Key, "error", err)
		return outcomeIgnored, nil
	}
	if !IsInputKey(key) {
		log.Info("ignoring object that is not a sheet in the drop folder", "key", key)
		return outcomeIgnored, nil
	}
	in, err := h.identify(ctx, key, rec.S3.Object)
	if err != nil {
		return outcomeIgnored, err
	}
	log = log.With("task", in.taskID, "key", key)

	// A redelivered event for a task that got past splitting (or was
	// rejected) has nothing left to do: skip the download.
	if t, err := h.Store.GetTask(ctx, in.taskID); err == nil && t.State != store.TaskPending {
		log.Info("duplicate upload event; the task exists", "state", t.State)
		return outcomeIgnored, nil
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return outcomeIgnored, fmt.Errorf("split %s: look up task %s: %w", key, in.taskID, err)
	}

	limits := h.limits()
	size, err := h.Objects.Size(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		log.Warn("object is gone; nothing to split")
		return outcomeIgnored, nil
	}
	if err != nil {
		return outcomeIgnored, fmt.Errorf("split %s: size: %w", key, err)
	}
	if size > limits.MaxFileBytes {
		return h.reject(ctx, in, fmt.Sprintf("%s: the file is %s; the limit is %s", in.display, mib(size), mib(limits.MaxFileBytes)))
	}

	path, err := h.download(ctx, key, limits.MaxFileBytes)
	if errors.Is(err, errTooBig) {
		return h.reject(ctx, in, fmt.Sprintf("%s: the file is larger than the limit of %s", in.display, mib(limits.MaxFileBytes)))
	}
	if errors.Is(err, blob.ErrNotFound) {
		log.Warn("object is gone; nothing to split")
		return outcomeIgnored, nil
	}
	if err != nil {
		return outcomeIgnored, err
	}
	defer os.Remove(path)

	params := pipeline.SplitParams{TaskID: in.taskID, Path: path, Source: in.source, Spec: in.spec, Limits: limits}
	params.Spec.Prompt = h.prompt(path, params)
	// The display name, not the temporary file's, must appear in messages.
	params.Source = in.display
	v, err := pipeline.Validate(params)
	params.Source = in.source
	var rejected *pipeline.RejectedError
	if errors.As(err, &rejected) {
		return h.reject(ctx, in, rejected.Error())
	}
	if err != nil {
		return outcomeIgnored, fmt.Errorf("split %s: validate: %w", key, err)
	}
	params.Validated = &v
	task, err := h.Split.Split(ctx, params)
	if errors.As(err, &rejected) {
		return h.reject(ctx, in, rejected.Error())
	}
	if err != nil {
		return outcomeIgnored, fmt.Errorf("split %s: %w", key, err)
	}
	log.Info("input split", "rows", task.RowsTotal, "batches", task.BatchesTotal, "state", task.State, "upload", in.upload)
	if h.Exports != nil && task.BatchesTotal == 0 && !task.State.Final() {
		if _, err := pipeline.StartExportOnce(ctx, h.Store, h.Exports, task, h.clock().Now()); err != nil {
			return outcomeSplit, fmt.Errorf("split %s: start export of empty task %s: %w", key, task.ID, err)
		}
	}
	return outcomeSplit, nil
}

// identify names the task an object belongs to. An object at
// incoming/<id>/<name> whose <id> has an API upload record belongs to task
// <id> with the record's spec; any other object is a drop-folder input whose
// task id derives from the object's version, so that a new upload to the
// same key starts a new task and a duplicate event does not.
func (h *Splitter) identify(ctx context.Context, key string, obj events.S3Object) (input, error) {
	rest := strings.TrimPrefix(key, IncomingPrefix)
	if id, name, ok := strings.Cut(rest, "/"); ok && api.ValidTaskID(id) && !strings.Contains(name, "/") {
		rec, err := api.LoadUpload(ctx, h.Objects, id)
		switch {
		case err == nil:
			return input{key: key, taskID: id, spec: rec.Spec, source: rec.Filename, display: rec.Filename, upload: true}, nil
		case !errors.Is(err, blob.ErrNotFound):
			return input{}, fmt.Errorf("split %s: %w", key, err)
		}
	}
	version := obj.VersionID
	if version == "" {
		version = obj.ETag
	}
	spec := h.DefaultSpec
	spec.Prompt = "" // resolved after the workbook's prompt sheet, see prompt
	return input{
		key:     key,
		taskID:  pipeline.DeriveTaskID(key+"@"+version, h.DefaultSpec),
		spec:    spec,
		source:  key,
		display: path.Base(key),
	}, nil
}

// prompt resolves the template: the request's (an upload record's), else
// the workbook's "prompt" sheet, else the deployment's default. An input
// that cannot be opened keeps the request's; Validate then reports why.
func (h *Splitter) prompt(path string, p pipeline.SplitParams) string {
	if strings.TrimSpace(p.Spec.Prompt) != "" {
		return p.Spec.Prompt
	}
	r, err := sheet.Open(path, sheet.Options{Sheet: p.Sheet, Limits: p.Limits, DisplayName: p.Source})
	if err != nil {
		return p.Spec.Prompt
	}
	defer r.Close()
	if text, ok := r.Prompt(); ok && strings.TrimSpace(text) != "" {
		return text
	}
	return h.DefaultSpec.Prompt
}

// reject records a refused input where its owner will look: a FAILED task
// with the reason (GET /api/tasks/{id}) and an error file beside the
// results. The event succeeds unless recording fails.
func (h *Splitter) reject(ctx context.Context, in input, reason string) (recordOutcome, error) {
	now := h.clock().Now()
	err := h.Store.CreateTask(ctx, store.Task{
		ID: in.taskID, State: store.TaskFailed, Spec: in.spec, Source: in.source, Error: reason,
		CreatedAt: now, UpdatedAt: now, FinishedAt: now,
	})
	if err != nil && !errors.Is(err, store.ErrConflict) {
		return outcomeIgnored, fmt.Errorf("reject %s: record failed task %s: %w", in.key, in.taskID, err)
	}
	if errors.Is(err, store.ErrConflict) {
		// A PENDING task of this id exists: a split that died halfway
		// before the input changed under it. Fail it the ordinary way.
		_, terr := h.Store.TransitionTask(ctx, store.TransitionTaskParams{
			ID: in.taskID, From: []store.TaskState{store.TaskPending}, To: store.TaskFailed, Error: reason, Now: now,
		})
		if terr != nil && !errors.Is(terr, store.ErrConflict) {
			return outcomeIgnored, fmt.Errorf("reject %s: fail task %s: %w", in.key, in.taskID, terr)
		}
	}
	errKey := ErrorFileKey(in.key)
	if err := h.Objects.Put(ctx, errKey, strings.NewReader(reason+"\n")); err != nil {
		return outcomeIgnored, fmt.Errorf("reject %s: write %s: %w", in.key, errKey, err)
	}
	h.logger().Warn("input rejected", "task", in.taskID, "key", in.key, "reason", reason, "error_file", errKey)
	return outcomeRejected, nil
}

// ErrorFileKey is where the reason for rejecting the input at key is
// written: incoming/<path> -> results/<path>.error.txt.
func ErrorFileKey(key string) string {
	return "results/" + strings.TrimPrefix(key, IncomingPrefix) + ".error.txt"
}

var errTooBig = errors.New("input exceeds the size limit")

// download copies the object to a temporary file and returns its path. It
// stops past limit bytes (the object may have grown since Size).
func (h *Splitter) download(ctx context.Context, key string, limit int64) (string, error) {
	rc, err := h.Objects.Open(ctx, key)
	if err != nil {
		return "", fmt.Errorf("split %s: open: %w", key, err)
	}
	defer rc.Close()
	dir := h.TempDir
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, "batchgen-input-*"+path.Ext(key))
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

func (h *Splitter) limits() sheet.Limits {
	l := h.Limits
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = DefaultMaxInputBytes
	}
	return l
}

func (h *Splitter) clock() clock.Clock {
	if h.Clock == nil {
		return clock.Real{}
	}
	return h.Clock
}

func (h *Splitter) logger() *slog.Logger { return discard(h.Logger) }

// mib renders a byte count for people.
func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
