package splitterfn_test

import (
	"encoding/json"
	"errors"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/lambdafn/splitterfn"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
	"github.com/batchgen/batchgen/internal/store"
)

var defaultSpec = store.TaskSpec{Prompt: "Default copy for {{商品名称}}", Provider: "sim", Model: "sim-1", BatchSize: 2}

// s3Event returns the testdata S3 event for key (URL-encoded the way S3
// encodes keys in events: '+' for a space) with the given ETag.
func s3Event(t *testing.T, key, etag string) events.S3Event {
	t.Helper()
	var ev events.S3Event
	lambdatest.ReadJSON(t, "s3-object-created.json", &ev)
	ev.Records[0].S3.Object.Key = url.QueryEscape(key)
	ev.Records[0].S3.Object.ETag = etag
	return ev
}

func (e *env) splitter(limits sheet.Limits) *splitterfn.Handler {
	intake := pipeline.NewIntake(
		pipeline.NewSplitter(e.Store, e.Queue, pipeline.SplitterConfig{Clock: e.Clock, Logger: e.Log}),
		e.Blobs, &pipeline.ExportSignal{},
		pipeline.IntakeConfig{
			DefaultSpec: defaultSpec, Limits: limits, Uploads: pipeline.BlobUploads{Blobs: e.Blobs},
			TempDir: e.T.TempDir(), Clock: e.Clock, Logger: e.Log,
		})
	return &splitterfn.Handler{Intake: intake, Metrics: metrics.New(e.Logs, e.Clock, nil), Logger: e.Log}
}

// taskSummary is what the splitter tests compare.
type taskSummary struct {
	ID, State, Source, Prompt, Error string
	BatchSize, Rows, Batches         int
}

func summarize(ts []store.Task) []taskSummary {
	var out []taskSummary
	for _, t := range ts {
		out = append(out, taskSummary{
			ID: t.ID, State: string(t.State), Source: t.Source, Prompt: t.Spec.Prompt, Error: t.Error,
			BatchSize: t.Spec.BatchSize, Rows: t.RowsTotal, Batches: t.BatchesTotal,
		})
	}
	return out
}

func TestSplitterSplits(t *testing.T) {
	t.Parallel()
	const uploadID = "0123456789abcdef0123456789abcdef"
	dropKey := "incoming/商品 list 2025.xlsx"
	tests := []struct {
		name string
		// setup stores the input (and maybe an upload record) and returns
		// the key the event names.
		setup     func(e *env) string
		want      taskSummary
		wantMsgs  int
		wantTasks int
	}{
		{
			name: "drop folder workbook uses its prompt sheet",
			setup: func(e *env) string {
				e.Put(dropKey, lambdatest.XLSX(t, lambdatest.Header, lambdatest.Rows(5), "Sheet copy for {{商品名称}} in {{类目}}"))
				return dropKey
			},
			want: taskSummary{
				ID:    pipeline.DeriveTaskID(dropKey+"@etag-1", defaultSpec),
				State: "RUNNING", Source: dropKey, Prompt: "Sheet copy for {{商品名称}} in {{类目}}",
				BatchSize: 2, Rows: 5, Batches: 3,
			},
			wantMsgs: 3,
		},
		{
			name: "drop folder CSV without a prompt sheet uses the default",
			setup: func(e *env) string {
				e.Put("incoming/team a/items.csv", lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(4)))
				return "incoming/team a/items.csv"
			},
			want: taskSummary{
				ID:    pipeline.DeriveTaskID("incoming/team a/items.csv@etag-1", defaultSpec),
				State: "RUNNING", Source: "incoming/team a/items.csv", Prompt: defaultSpec.Prompt,
				BatchSize: 2, Rows: 4, Batches: 2,
			},
			wantMsgs: 2,
		},
		{
			name: "API upload takes the task id and spec from its record",
			setup: func(e *env) string {
				rec, err := json.Marshal(pipeline.UploadRecord{
					TaskID: uploadID, Filename: "商品 list.XLSX", CreatedAt: lambdatest.Epoch,
					Spec: store.TaskSpec{Prompt: "Upload copy for {{商品名称}}", Provider: "sim", BatchSize: 4},
				})
				if err != nil {
					t.Fatal(err)
				}
				e.Put(pipeline.UploadRecordKey(uploadID), rec)
				key := pipeline.IncomingKey(uploadID, "商品 list.XLSX")
				// The workbook's prompt sheet loses to the request's prompt.
				e.Put(key, lambdatest.XLSX(t, lambdatest.Header, lambdatest.Rows(9), "Sheet copy for {{商品名称}}"))
				return key
			},
			want: taskSummary{
				ID: uploadID, State: "RUNNING", Source: "商品 list.XLSX", Prompt: "Upload copy for {{商品名称}}",
				BatchSize: 4, Rows: 9, Batches: 3,
			},
			wantMsgs: 3,
		},
		{
			name: "a folder named like an id without a record is a drop folder",
			setup: func(e *env) string {
				key := "incoming/" + uploadID + "/items.csv"
				e.Put(key, lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(1)))
				return key
			},
			want: taskSummary{
				ID:    pipeline.DeriveTaskID("incoming/"+uploadID+"/items.csv@etag-1", defaultSpec),
				State: "RUNNING", Source: "incoming/" + uploadID + "/items.csv", Prompt: defaultSpec.Prompt,
				BatchSize: 2, Rows: 1, Batches: 1,
			},
			wantMsgs: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			key := tc.setup(e)
			h := e.splitter(sheet.Limits{})
			ev := s3Event(t, key, "etag-1")
			// At-least-once delivery: the same event twice makes one task
			// and one set of messages, and the input is downloaded once.
			for i := range 2 {
				if err := h.Handle(t.Context(), ev); err != nil {
					t.Fatalf("Handle #%d: %v", i+1, err)
				}
			}
			if diff := cmp.Diff([]taskSummary{tc.want}, summarize(e.Tasks())); diff != "" {
				t.Errorf("tasks mismatch (-want +got):\n%s", diff)
			}
			var got []pipeline.BatchMessage
			for _, d := range e.Drain() {
				m, err := pipeline.DecodeBatchMessage(d.Body)
				if err != nil {
					t.Fatal(err)
				}
				if d.Group != m.Owner {
					t.Errorf("batch %d sent in group %q, its body names owner %q", m.BatchNo, d.Group, m.Owner)
				}
				got = append(got, m)
			}
			// Each message in its task's principal's group.
			owner := e.Tasks()[0].Owner
			var want []pipeline.BatchMessage
			for b := 1; b <= tc.wantMsgs; b++ {
				want = append(want, pipeline.BatchMessage{TaskID: tc.want.ID, BatchNo: b, Owner: owner})
			}
			sortMsgs := cmpopts.SortSlices(func(a, b pipeline.BatchMessage) bool { return a.BatchNo < b.BatchNo })
			if diff := cmp.Diff(want, got, sortMsgs); diff != "" {
				t.Errorf("queue messages mismatch (-want +got):\n%s", diff)
			}
			if n := e.Blobs.Opens(key); n != 1 {
				t.Errorf("input downloaded %d times, want 1", n)
			}
		})
	}
}

func TestSplitterNewVersionIsNewTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.splitter(sheet.Limits{})
	key := "incoming/items.csv"
	e.Put(key, lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(1)))
	if err := h.Handle(t.Context(), s3Event(t, key, "etag-1")); err != nil {
		t.Fatal(err)
	}
	e.Put(key, lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(3)))
	if err := h.Handle(t.Context(), s3Event(t, key, "etag-2")); err != nil {
		t.Fatal(err)
	}
	if n := len(e.Tasks()); n != 2 {
		t.Fatalf("got %d tasks, want one per object version", n)
	}
}

func TestSplitterRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		key     string
		content []byte
		limits  sheet.Limits
		// wantError is the task's error and the error file's first line.
		wantError string
		// wantDownload is false when the size check avoids the download.
		wantDownload bool
	}{
		{
			name:         "unknown placeholder",
			key:          "incoming/bad prompt.xlsx",
			content:      lambdatest.XLSX(t, lambdatest.Header, lambdatest.Rows(2), "Copy for {{品名}}"),
			wantError:    `bad prompt.xlsx: prompt template: placeholder {{品名}} names no column; the columns are "商品名称", "类目"`,
			wantDownload: true,
		},
		{
			name:         "not a spreadsheet",
			key:          "incoming/notes.csv",
			content:      []byte{0x00, 0x01, 0x02, 'P', 'K'},
			wantError:    "notes.csv: row 1 column A: cell contains a NUL byte",
			wantDownload: true,
		},
		{
			name:      "too large",
			key:       "incoming/huge.csv",
			content:   lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(200)),
			limits:    sheet.Limits{MaxFileBytes: 1000},
			wantError: "huge.csv: the file is 3512 bytes; the limit is 1000 bytes",
		},
		{
			name:         "too many rows",
			key:          "incoming/long.csv",
			content:      lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(11)),
			limits:       sheet.Limits{MaxRows: 10},
			wantError:    "long.csv: row 12: too many data rows: the limit is 10",
			wantDownload: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.Put(tc.key, tc.content)
			h := e.splitter(tc.limits)
			ev := s3Event(t, tc.key, "etag-1")
			for i := range 2 {
				if err := h.Handle(t.Context(), ev); err != nil {
					t.Fatalf("Handle #%d returned %v; a rejected input must not be retried", i+1, err)
				}
			}
			tasks := e.Tasks()
			if len(tasks) != 1 {
				t.Fatalf("got %d tasks, want 1 FAILED task: %+v", len(tasks), tasks)
			}
			task := tasks[0]
			if task.State != store.TaskFailed || !strings.HasPrefix(task.Error, tc.wantError) {
				t.Errorf("task = %s %q, want FAILED %q...", task.State, task.Error, tc.wantError)
			}
			if task.ID != pipeline.DeriveTaskID(tc.key+"@etag-1", defaultSpec) || task.Source != tc.key {
				t.Errorf("task id/source = %s %q, want the derived id and the key", task.ID, task.Source)
			}
			errFile := e.Get(pipeline.ErrorFileKey(tc.key))
			if errFile != task.Error+"\n" {
				t.Errorf("error file = %q, want the task's error %q", errFile, task.Error)
			}
			if msgs := e.Drain(); len(msgs) != 0 {
				t.Errorf("a rejected input enqueued %d messages", len(msgs))
			}
			if got := e.Blobs.Opens(tc.key) > 0; got != tc.wantDownload {
				t.Errorf("downloaded = %v, want %v", got, tc.wantDownload)
			}
			// The metrics line of the first delivery counts the rejection.
			var rejected float64
			for _, l := range e.Logs.Lines(t) {
				if v, ok := l[metrics.TasksRejected].(float64); ok {
					rejected += v
				}
			}
			if rejected != 1 {
				t.Errorf("TasksRejected = %v, want 1", rejected)
			}
		})
	}
}

func TestSplitterIgnores(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		edit   func(ev *events.S3Event)
		stored bool
	}{
		{"outside the drop folder", func(ev *events.S3Event) { ev.Records[0].S3.Object.Key = "results/a.csv" }, true},
		{"folder marker", func(ev *events.S3Event) { ev.Records[0].S3.Object.Key = "incoming/team/" }, false},
		{"not a sheet", func(ev *events.S3Event) { ev.Records[0].S3.Object.Key = "incoming/readme.txt" }, true},
		{"macOS folder metadata", func(ev *events.S3Event) { ev.Records[0].S3.Object.Key = "incoming/.DS_Store" }, true},
		{"extension only", func(ev *events.S3Event) { ev.Records[0].S3.Object.Key = "incoming/.csv" }, true},
		{"removal event", func(ev *events.S3Event) { ev.Records[0].EventName = "ObjectRemoved:Delete" }, true},
		{"undecodable key", func(ev *events.S3Event) { ev.Records[0].S3.Object.Key = "incoming/%zz.csv" }, false},
		{"object deleted before the event arrived", func(*events.S3Event) {}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if tc.stored {
				for _, key := range []string{"incoming/a.csv", "results/a.csv", "incoming/readme.txt", "incoming/.DS_Store", "incoming/.csv"} {
					e.Put(key, lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(1)))
				}
			}
			ev := s3Event(t, "incoming/a.csv", "etag-1")
			tc.edit(&ev)
			if err := e.splitter(sheet.Limits{}).Handle(t.Context(), ev); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if n := len(e.Tasks()); n != 0 {
				t.Errorf("got %d tasks, want none", n)
			}
		})
	}
}

// TestSplitterAcceptsExtensionsInAnyCase splits sheets whose extension is in any letter case, as Windows and Excel
// users save them; the bucket notification passes every key under incoming/ and the splitter decides.
func TestSplitterAcceptsExtensionsInAnyCase(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"incoming/A.CSV", "incoming/b.Csv", "incoming/c.XLSX", "incoming/d.Xlsx", "incoming/e.xlsx", "incoming/f.XLSM", "incoming/g.TSV"} {
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			var body []byte
			switch strings.ToLower(path.Ext(key)) {
			case ".xlsx", ".xlsm":
				body = lambdatest.XLSX(t, lambdatest.Header, lambdatest.Rows(3), "")
			case ".tsv":
				body = []byte(strings.ReplaceAll(string(lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(3))), ",", "\t"))
			default:
				body = lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(3))
			}
			e.Put(key, body)
			if err := e.splitter(sheet.Limits{}).Handle(t.Context(), s3Event(t, key, "etag-1")); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			ts := e.Tasks()
			if len(ts) != 1 || ts[0].State == store.TaskFailed || ts[0].RowsTotal != 3 {
				t.Fatalf("tasks = %+v; want one split task of 3 rows", summarize(ts))
			}
		})
	}
}

func TestSplitterTransientErrorsRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Put("incoming/a.csv", lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(1)))
	e.Blobs.SizeErr = errors.New("connection reset by peer")
	err := e.splitter(sheet.Limits{}).Handle(t.Context(), s3Event(t, "incoming/a.csv", "etag-1"))
	if err == nil || !strings.Contains(err.Error(), "connection reset by peer") {
		t.Fatalf("Handle = %v, want the transient error so Lambda retries", err)
	}
	if n := len(e.Tasks()); n != 0 {
		t.Errorf("got %d tasks after a transient failure, want none", n)
	}
}

func TestSplitterBadUploadRecordRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const id = "0123456789abcdef0123456789abcdef"
	e.Put(pipeline.UploadRecordKey(id), []byte("{not json"))
	key := pipeline.IncomingKey(id, "a.csv")
	e.Put(key, lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(1)))
	if err := e.splitter(sheet.Limits{}).Handle(t.Context(), s3Event(t, key, "etag-1")); err == nil {
		t.Fatal("Handle succeeded with an unreadable upload record")
	}
	if n := len(e.Tasks()); n != 0 {
		t.Errorf("got %d tasks, want none", n)
	}
}
