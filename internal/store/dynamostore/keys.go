package dynamostore

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/store"
)

// Key layout of the single table (fixed by template.yaml: string PK and SK).
//
//	task   PK=TASK#<id>   SK=TASK
//	batch  PK=TASK#<id>   SK=BATCH#<no, 8 digits>
//	row    PK=TASK#<id>   SK=ROW#<no, 9 digits>
//	cache  PK=CACHE#<key> SK=CACHE
//
// A task and everything under it share one partition key, so one Query reads
// a task's batches or rows in order. Numbers are zero-padded so that the
// string sort key sorts them numerically.
const (
	taskPrefix  = "TASK#"
	taskSK      = "TASK"
	batchPrefix = "BATCH#"
	rowPrefix   = "ROW#"
	cachePrefix = "CACHE#"
	cacheSK     = "CACHE"

	// maxBatchNo and maxRowNo are the largest numbers the padded sort keys
	// hold.
	maxBatchNo = 99_999_999
	maxRowNo   = 999_999_999
)

// Index names and their key values, fixed by template.yaml.
const (
	// indexOpen is the sparse index of batches that are not DONE: only
	// open batches carry open_pk and open_sk.
	indexOpen = "open-batches"
	// indexTasks lists tasks by creation time: only task items carry list_pk.
	indexTasks = "tasks-by-time"
	// indexOwner lists one owner's tasks newest first: only task items
	// with an owner carry task_owner and owner_sk.
	indexOwner = "tasks-by-owner"
	// listPK is the single partition of indexTasks. Task creation is rare
	// (one per uploaded sheet), far below one partition's write limit.
	listPK = "TASKS"
	// openShards spreads open batches over this many index partitions
	// ("OPEN#0".."OPEN#3") so that a split writing thousands of batches at
	// once does not throttle on one hot GSI partition; ListOpenBatches
	// queries all of them and merges. Changing it strands open batches in
	// shards no longer queried until they are next written, so it is a
	// constant, not an option.
	openShards = 4
)

// timeLayout is a fixed-width UTC form with nanoseconds, so that times
// compare as strings: condition expressions (lease_until < :now) and sort
// keys (created_at, open_sk) rely on that. It holds years 0000-9999.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// encodeTime formats t for storage; the zero time becomes "".
func encodeTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeLayout)
}

// decodeTime parses what encodeTime wrote; "" is the zero time. It also
// takes any RFC 3339 time, because the export state machine marks a task
// FAILED itself (infra/statemachine/export.asl.json) and stamps it with
// Step Functions' $$.State.EnteredTime ("2025-03-01T12:00:00.123Z").
func decodeTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(timeLayout, s)
	if err == nil {
		return t, nil
	}
	t, err2 := time.Parse(time.RFC3339Nano, s)
	if err2 != nil {
		return time.Time{}, fmt.Errorf("decode time %q: %w", s, err)
	}
	return t.UTC(), nil
}

// sortTime formats t like encodeTime but keeps the zero time as a value, for
// sort keys that must be present (created_at of the tasks-by-time index).
func sortTime(t time.Time) string {
	return t.UTC().Format(timeLayout)
}

// ownerSK is a task's sort key in the tasks-by-owner index: its creation
// time, then its id, so a cursor names one place even among tasks created
// at the same instant. "" (no index entry) for a task without an owner.
func ownerSK(owner string, c store.TaskCursor) string {
	if owner == "" {
		return ""
	}
	return sortTime(c.CreatedAt) + "#" + c.ID
}

// taskPK is the partition key of a task and of its batches and rows.
func taskPK(id string) string { return taskPrefix + id }

// taskIDOf returns the task ID in a partition key written by taskPK.
func taskIDOf(pk string) (string, error) {
	id, ok := strings.CutPrefix(pk, taskPrefix)
	if !ok || id == "" {
		return "", fmt.Errorf("partition key %q is not a task's", pk)
	}
	return id, nil
}

// batchSK is the sort key of batch no.
func batchSK(no int) string { return fmt.Sprintf("%s%08d", batchPrefix, no) }

// rowSK is the sort key of row no.
func rowSK(no int) string { return fmt.Sprintf("%s%09d", rowPrefix, no) }

// cachePK is the partition key of a cache entry.
func cachePK(key string) string { return cachePrefix + key }

// checkTaskID rejects IDs that cannot be stored.
func checkTaskID(id string) error {
	if id == "" {
		return fmt.Errorf("empty task ID")
	}
	return nil
}

// checkBatchNo rejects batch numbers the padded sort key cannot hold.
func checkBatchNo(no int) error {
	if no < 0 || no > maxBatchNo {
		return fmt.Errorf("batch number %d outside 0..%d", no, maxBatchNo)
	}
	return nil
}

// checkRowNo rejects row numbers the padded sort key cannot hold.
func checkRowNo(no int) error {
	if no < 0 || no > maxRowNo {
		return fmt.Errorf("row number %d outside 0..%d", no, maxRowNo)
	}
	return nil
}

// openShard is the open-batches partition of a batch: stable for the
// batch, spread across batches.
func openShard(taskID string, no int) string {
	h := fnv.New32a()
	h.Write([]byte(taskID))
	h.Write([]byte{'#'})
	h.Write([]byte(strconv.Itoa(no)))
	return "OPEN#" + strconv.Itoa(int(h.Sum32()%openShards))
}

// openSK is the open-batches sort key: last change first, so that a Query
// with open_sk < openBefore(t) returns batches changed before t, oldest
// first; task and number make it unique and tie-break.
func openSK(updated time.Time, taskID string, no int) string {
	return fmt.Sprintf("%s#%s#%08d", sortTime(updated), taskID, no)
}

// openBefore is the exclusive upper bound of open_sk for batches changed
// strictly before t: every open_sk of a batch changed at t starts with the
// same time string and continues with '#', so it sorts after this bound.
func openBefore(t time.Time) string { return sortTime(t) }
