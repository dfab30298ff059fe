package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/store"
)

// UploadRecord is what the API's POST /api/tasks leaves for the splitter at
// UploadRecordKey(TaskID): the spec the client asked for, which the upload
// event alone cannot carry.
type UploadRecord struct {
	TaskID string `json:"task_id"`
	// Filename is the name the client gave; the object key may differ in
	// the case of its extension.
	Filename string         `json:"filename"`
	Spec     store.TaskSpec `json:"spec"`
	// Owner is the principal that created the task; the task is theirs.
	Owner string `json:"owner,omitempty"`
	// Size is the declared length of a sheet still to be uploaded.
	Size     int64  `json:"size,omitempty"`
	Encoding string `json:"encoding,omitempty"`
	// Terms are the task's cap, mode and deadline (store.Task.Terms);
	// absent for none.
	store.Terms
	CreatedAt time.Time `json:"created_at"`
	// Uploaded is set once the API has stored the sheet.
	Uploaded bool `json:"uploaded,omitempty"`
}

// UploadRecordKey is the blob key of a task's upload record.
func UploadRecordKey(taskID string) string { return "uploads/" + taskID + ".json" }

// IncomingKey is the object key a client uploads a task's sheet to. The
// extension is lowercased so keys are uniform; the splitter accepts any case
// (pipeline.IsInputKey).
func IncomingKey(taskID, filename string) string {
	ext := path.Ext(filename)
	return "incoming/" + taskID + "/" + strings.TrimSuffix(filename, ext) + strings.ToLower(ext)
}

// LoadUpload reads a task's upload record. A task created without the API
// has none: the error then wraps blob.ErrNotFound.
func LoadUpload(ctx context.Context, blobs blob.Store, taskID string) (UploadRecord, error) {
	if !ValidTaskID(taskID) {
		return UploadRecord{}, fmt.Errorf("load upload record %q: invalid task id: %w", taskID, blob.ErrNotFound)
	}
	rc, err := blobs.Open(ctx, UploadRecordKey(taskID))
	if err != nil {
		return UploadRecord{}, fmt.Errorf("load upload record %s: %w", taskID, err)
	}
	defer rc.Close()
	var rec UploadRecord
	if err := json.NewDecoder(rc).Decode(&rec); err != nil {
		return UploadRecord{}, fmt.Errorf("load upload record %s: decode: %w", taskID, err)
	}
	if rec.TaskID != taskID {
		return UploadRecord{}, fmt.Errorf("load upload record %s: it names task %q", taskID, rec.TaskID)
	}
	return rec, nil
}

// BlobUploads finds upload records in Blobs for Intake, so that an input
// uploaded through the API is split with the spec it was created with. It
// is the core's, not the API's: the splitter reads what the API wrote
// without linking the API.
type BlobUploads struct{ Blobs blob.Store }

var _ UploadRecords = BlobUploads{}

// LookupUpload returns the upload record of taskID, or an error wrapping
// blob.ErrNotFound when there is none.
func (u BlobUploads) LookupUpload(ctx context.Context, taskID string) (Upload, error) {
	rec, err := LoadUpload(ctx, u.Blobs, taskID)
	if err != nil {
		return Upload{}, err
	}
	return Upload{Spec: rec.Spec, Filename: rec.Filename, Owner: rec.Owner, Encoding: rec.Encoding, Terms: rec.Terms}, nil
}
