// Package pipeline holds the use cases of batchgen, written once against the
// ports (store, queue, blob, llm, clock) and run unchanged by the embedded
// runtime (cmd/batchgen) and the AWS runtime (functions/*):
//
//   - Splitter: validate a sheet, create the task, write rows and batches,
//     enqueue one small message per batch.
//   - Generator: claim a batch with a conditional write, generate its rows
//     under a quota and a concurrency limit, persist each result at once,
//     classify failures, finish the batch atomically and trigger the export.
//   - Exporter: stream the results in row order into the result workbook.
package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/store"
)

// BatchMessage is the body of a queue message: a reference to a batch,
// never the rows themselves.
type BatchMessage struct {
	TaskID  string `json:"task_id"`
	BatchNo int    `json:"batch_no"`
	// Owner is the task's principal and the message's group
	// (queue.Outgoing.Group), so that the queue shares its consumers among
	// principals; a message sent again from its body (Settlement.Apply)
	// keeps it. Messages sent before it existed have none.
	Owner string `json:"owner,omitempty"`
	// Sample, when positive, asks for that many of the batch's rows only,
	// answered online, for a quote (SampleMessages): the batch is handed
	// back with its other rows pending and the message is not retried.
	Sample int `json:"sample,omitempty"`
}

// Outgoing is m as a message to send after delay, in its owner's group.
func (m BatchMessage) Outgoing(delay time.Duration) queue.Outgoing {
	b, _ := json.Marshal(m) // cannot fail: strings and ints
	return queue.Outgoing{Body: b, Delay: delay, Group: m.Owner}
}

// BatchMessages are the messages of task's batches nos, in its owner's
// group.
func BatchMessages(task store.Task, nos []int) []queue.Outgoing {
	msgs := make([]queue.Outgoing, len(nos))
	for i, no := range nos {
		msgs[i] = BatchMessage{TaskID: task.ID, BatchNo: no, Owner: task.Owner}.Outgoing(0)
	}
	return msgs
}

// EncodeBatchMessage returns the queue body for a batch.
func EncodeBatchMessage(taskID string, batchNo int) []byte {
	b, _ := json.Marshal(BatchMessage{TaskID: taskID, BatchNo: batchNo}) // cannot fail: strings and ints
	return b
}

// DecodeBatchMessage parses a queue body, rejecting anything that is not a
// well-formed batch reference.
func DecodeBatchMessage(body []byte) (BatchMessage, error) {
	var m BatchMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return m, fmt.Errorf("decode batch message %.80q: %w", body, err)
	}
	if m.TaskID == "" || m.BatchNo < 1 {
		return m, fmt.Errorf("decode batch message %.80q: task_id and batch_no >= 1 are required", body)
	}
	if m.Sample < 0 {
		return m, fmt.Errorf("decode batch message %.80q: sample must be 0 or more rows", body)
	}
	return m, nil
}

// RejectedError is an input that was refused before anything was written:
// a bad sheet, a bad template or a placeholder naming no column. Its message
// is meant for the user as is.
type RejectedError struct{ Err error }

func (e *RejectedError) Error() string { return e.Err.Error() }
func (e *RejectedError) Unwrap() error { return e.Err }

// PoisonError is a queue message that can never be processed (malformed, or
// naming a task or batch that does not exist). It is left for the queue to
// dead-letter.
type PoisonError struct{ Err error }

func (e *PoisonError) Error() string { return "poison message: " + e.Err.Error() }
func (e *PoisonError) Unwrap() error { return e.Err }

// ValidTaskID reports whether id can name a task: 1-80 letters, digits,
// '-' or '_'. The limit is Step Functions' execution name, which is the
// task id; the alphabet keeps ids safe inside object keys.
func ValidTaskID(id string) bool { return taskIDPattern.MatchString(id) }

var taskIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}$`)

// DeriveTaskID returns the task id for an input and a spec: the same input
// content (or the same object version) with the same settings always gives
// the same id, so running a job again continues it instead of paying twice.
// sourceIdentity is a content hash, or an object key plus its ETag/version.
func DeriveTaskID(sourceIdentity string, spec store.TaskSpec) string {
	specJSON, _ := json.Marshal(spec) // cannot fail: plain struct
	h := sha256.New()
	h.Write([]byte(sourceIdentity))
	h.Write([]byte{0})
	h.Write(specJSON)
	return hex.EncodeToString(h.Sum(nil))[:20]
}

// ResultKey is the blob key of the result workbook of a task that did not
// come from the drop folder (an API upload, a local run): named after the
// task, since its input has no key of its own under the results folder.
func ResultKey(taskID string) string { return "results/" + taskID + ".xlsx" }

// DropResultKey is where the result of the drop-folder input at key goes:
// incoming/<path>/<name>.<ext> -> results/<path>/<name>.result.xlsx, so the
// people who dropped the file find its result by its name. The sub-path is
// kept, so inputs of the same name in different folders never meet. Two
// inputs that differ only in the extension (a.csv and a.xlsx in one folder),
// or the same key dropped again with other content, share the name: the
// latest export wins, as when a file is saved again under its name (each
// export writes the whole file in one put, so a reader sees one result or
// the other, never a mix). ok is false when key is not a drop-folder input.
func DropResultKey(key string) (resultKey string, ok bool) {
	if !IsInputKey(key) {
		return "", false
	}
	rel := strings.TrimPrefix(key, IncomingPrefix)
	return "results/" + strings.TrimSuffix(rel, path.Ext(rel)) + ".result.xlsx", true
}

// TaskResultKey is where task's result goes: DropResultKey of its source
// for a task made from a dropped file, ResultKey(id) otherwise. The
// exporter, the local stack and its download command all ask this, so the
// rule lives once. (API uploads and local runs name their source by a plain
// file name, never by a key under the drop folder.)
//
// A task that asked for a CSV result gets the same name ending in .csv.
func TaskResultKey(t store.Task) string {
	key, ok := DropResultKey(t.Source)
	if !ok {
		key = ResultKey(t.ID)
	}
	return strings.TrimSuffix(key, ".xlsx") + t.Spec.ResultFormat.Ext()
}

// InputKey is where the splitter keeps a copy of a workbook input (the
// whole file the user sent), which the export returns with the answers
// added beside the rows. A CSV input has none: its result is a new workbook.
func InputKey(taskID string) string { return "inputs/" + taskID + ".xlsx" }

// Event is a progress notification from the generator, for progress bars and
// metrics. It is informational; nothing depends on receiving it.
type Event struct {
	TaskID string
	RowNo  int
	State  store.RowState
	Cached bool
	// Calls is the number of model calls this event accounts for.
	Calls int
	// ErrorClass is set for failed calls, retryable or not.
	ErrorClass string
}

// Observer receives events; it must be fast and safe for concurrent use.
type Observer func(Event)

// ExportStarter starts the export of a task whose batches are all done. It
// must be idempotent per export generation: a second start for the same task
// and generation is a no-op (on AWS the Step Functions execution is named
// after both), while a task reopened by a retry (generation + 1) is exported
// again. The pipeline calls it once per export in the normal course (see
// StartExportOnce); the sweeper repeats a start that was lost.
type ExportStarter interface {
	StartExport(ctx context.Context, taskID string, generation int) error
}

// isConflict reports whether err is the store's ErrConflict.
func isConflict(err error) bool { return errors.Is(err, store.ErrConflict) }

// retryDelay picks the graded redelivery delay for a batch whose rows have
// used `round` invocations' worth of attempts (1-based).
func retryDelay(delays []time.Duration, round int) time.Duration {
	if len(delays) == 0 {
		return 0
	}
	if round < 1 {
		round = 1
	}
	if round > len(delays) {
		round = len(delays)
	}
	return delays[round-1]
}

// required reports a nil port given to a constructor.
func required(name string, port any) error {
	if port == nil || reflect.ValueOf(port).Kind() == reflect.Pointer && reflect.ValueOf(port).IsNil() {
		return fmt.Errorf("%s is nil", name)
	}
	return nil
}

func orClock(c clock.Clock) clock.Clock {
	if c == nil {
		return clock.Real{}
	}
	return c
}

func orLogger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
