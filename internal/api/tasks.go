package api

import (
	"encoding/json"
	"path"
	"strings"
	"time"

	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/store"
)

// StateAwaitingUpload is the status GET /api/tasks/{id} reports for a task
// that was created through the API but whose sheet has not arrived yet. It
// is not a store.TaskState: no task exists until the splitter runs.
const StateAwaitingUpload = "AWAITING_UPLOAD"

// StateUploaded is the status of a task whose sheet the API has stored and
// checked but the splitter has not taken yet (AWS, between the upload and
// the bucket's event).
const StateUploaded = "UPLOADED"

// Field limits of CreateTaskRequest.
const (
	maxFilenameBytes = 255
	maxPromptBytes   = 32 << 10
	maxModelBytes    = 200
	maxListLimit     = 200
	defaultListLimit = 50
	// maxPreviewRows bounds GET .../preview?limit=.
	maxPreviewRows     = 100
	defaultPreviewRows = 10
	// maxFormFieldBytes bounds a multipart field other than the file.
	maxFormFieldBytes = maxPromptBytes + 1
)

// CreateTaskRequest is the JSON body of POST /api/tasks, which asks for an
// upload URL; Filename and Size are required. The multipart form of POST
// /api/tasks carries the same fields (but the file instead of Filename and
// Size).
type CreateTaskRequest struct {
	// Filename is the sheet's name; it must end in .xlsx or .csv.
	Filename string `json:"filename"`
	// Prompt is the row template; empty takes the workbook's "prompt" sheet
	// (cell A1), then the deployment's default.
	Prompt string `json:"prompt,omitempty"`
	// System is the system prompt.
	System string `json:"system,omitempty"`
	// Model overrides the deployment's model.
	Model string `json:"model,omitempty"`
	// Temperature is sent to the model when set; 0 to 2.
	Temperature *float64 `json:"temperature,omitempty"`
	// MaxTokens caps each completion; 0 leaves the provider's default.
	MaxTokens int `json:"max_tokens,omitempty"`
	// BatchSize is the number of rows per batch; 0 takes the deployment's.
	BatchSize int `json:"batch_size,omitempty"`
	// Encoding names the text encoding of a CSV input; empty detects it.
	Encoding string `json:"encoding,omitempty"`
	// ResultFormat is the result's file: "xlsx" (the default: the user's
	// own workbook for a workbook input) or "csv" (the input's fields, then
	// the result columns, UTF-8 with a byte-order mark, in the input's
	// delimiter).
	ResultFormat string `json:"result_format,omitempty"`
	// Columns declares typed output columns instead of the one text
	// answer: a string in the short form ("category:enum(a|b)!,
	// score:number"), a list of {"name", "type", "values", "required",
	// "description"} objects, or a JSON Schema object
	// (schema.ParseJSON). Absent takes the deployment's.
	Columns json.RawMessage `json:"columns,omitempty"`
	// RowsPerCall packs up to that many rows into one model call (1 to
	// 100; 0 or absent: one).
	RowsPerCall int `json:"rows_per_call,omitempty"`
	// MaxCostUSD caps what the task may spend on model calls (at the
	// deployment's prices); absent or 0 for no cap. A deployment that
	// cannot hold a task to a cap (Limits.CostCaps) refuses it.
	MaxCostUSD *float64 `json:"max_cost_usd,omitempty"`
	// Mode is how the rows are called: "online" (absent: the default),
	// "economy" (the provider's batch API, at about half the price, within
	// hours) or "auto" (economy until the deadline leaves just the time
	// the rest needs online). A deployment that cannot run provider
	// batches (Limits.BatchModes) refuses the last two.
	Mode string `json:"mode,omitempty"`
	// Deadline is when an auto task must be done (RFC 3339); required for
	// auto, refused otherwise.
	Deadline string `json:"deadline,omitempty"`
	// Sample, when positive, asks for a quote before the task runs: the
	// task is split and held (HELD), that many of its rows are answered
	// (kept by the task), GET .../quote prices the rest online, economy
	// and auto, and POST .../start runs it (or .../cancel drops it).
	Sample int `json:"sample,omitempty"`
	// Size is the sheet's length in bytes; required. The upload URL is
	// signed for exactly this length, and a size over the deployment's
	// input limit is refused with 413.
	Size *int64 `json:"size,omitempty"`
}

// CreateTaskResponse is the 201 body of the JSON form of POST /api/tasks:
// the task, awaiting its sheet, and where to PUT it before ExpiresAt.
type CreateTaskResponse struct {
	TaskView
	UploadURL    string `json:"upload_url"`
	UploadMethod string `json:"upload_method"`
	// UploadHeaders are the headers the PUT must send exactly as given
	// (Content-Type, Content-Length): they are signed into a presigned
	// UploadURL.
	UploadHeaders map[string]string `json:"upload_headers"`
	ExpiresAt     time.Time         `json:"expires_at"`
}

// contentTypes are the media types uploads are signed with, by extension
// (lower case; sheet.IsSheetName decides which extensions are sheets).
var contentTypes = map[string]string{
	".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
	".xlsm": "application/vnd.ms-excel.sheet.macroEnabled.12",
	".csv":  "text/csv",
	".tsv":  "text/tab-separated-values",
}

// UploadContentType is the Content-Type an upload of filename is signed
// with, by its extension in any letter case; "application/octet-stream"
// for an extension without its own type.
func UploadContentType(filename string) string {
	if t, ok := contentTypes[strings.ToLower(path.Ext(filename))]; ok {
		return t
	}
	return "application/octet-stream"
}

// TaskView is a task as the API shows it.
type TaskView struct {
	ID string `json:"id"`
	// Status is the task's state (store.TaskState), or StateAwaitingUpload
	// or StateUploaded before the task exists.
	Status   string `json:"status"`
	Source   string `json:"source,omitempty"`
	Sheet    string `json:"sheet,omitempty"`
	Encoding string `json:"encoding,omitempty"`
	// ResultFormat is the result's file: "xlsx" or "csv".
	ResultFormat string `json:"result_format"`
	// Rerun, for a task made of a result sent back in, says what became
	// of its rows: kept with their answers, or sent again and why.
	Rerun *store.RerunCounts `json:"rerun,omitempty"`
	// Columns are the task's declared output columns; absent for one text
	// answer.
	Columns schema.Columns `json:"columns,omitempty"`
	// RowsPerCall is how many rows one model call answers, when more than
	// one.
	RowsPerCall int `json:"rows_per_call,omitempty"`
	// MaxCostUSD is the task's spending cap; absent for none.
	MaxCostUSD *float64 `json:"max_cost_usd,omitempty"`
	// Mode is "economy" or "auto", absent for online; Deadline an auto
	// task's (RFC 3339).
	Mode     string     `json:"mode,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
	// Sample is the rows a quote asked to be answered before the task
	// runs; absent for none.
	Sample int `json:"sample,omitempty"`
	// SavedUSD is what the rows answered through the provider's batch API
	// would have cost more online; absent for none.
	SavedUSD *float64 `json:"saved_usd,omitempty"`
	// WaitingOn says what an economy or auto task waits for: the provider
	// batches and the lines they answered so far; absent for nothing.
	WaitingOn     string `json:"waiting_on,omitempty"`
	Provider      string `json:"provider,omitempty"`
	Model         string `json:"model,omitempty"`
	RowsTotal     int    `json:"rows_total"`
	RowsSucceeded int    `json:"rows_succeeded"`
	RowsFailed    int    `json:"rows_failed"`
	RowsSkipped   int    `json:"rows_skipped"`
	BatchesDone   int    `json:"batches_done"`
	BatchesTotal  int    `json:"batches_total"`
	// InputTokens, CachedInputTokens and OutputTokens sum the tokens of the
	// rows of the finished batches.
	InputTokens       int64 `json:"input_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	// EstimatedCost is those tokens at the deployment's prices (USD for the
	// built-in table), each provider's at its own for a routed task
	// (pricing.Table.Task); absent when no price matches a provider or model
	// with tokens.
	EstimatedCost *float64 `json:"estimated_cost,omitempty"`
	// RowsPerSecond is the rows done per second since the task was
	// created (until it finished); absent before the first row.
	RowsPerSecond *float64 `json:"rows_per_second,omitempty"`
	// ETASeconds is the time left at that rate; absent when unknown or
	// finished.
	ETASeconds *float64 `json:"eta_seconds,omitempty"`
	// Error says why the task FAILED: for a rejected sheet, the same
	// message the CLI prints.
	Error string `json:"error,omitempty"`
	// ResultURL downloads the result workbook until ResultExpiresAt; set on
	// GET /api/tasks/{id} for a finished task when the API can presign.
	ResultURL       string     `json:"result_url,omitempty"`
	ResultExpiresAt *time.Time `json:"result_expires_at,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       *time.Time `json:"updated_at,omitempty"`
	FinishedAt      *time.Time `json:"finished_at,omitempty"`
	Links           Links      `json:"links"`
}

// Links are the task's routes.
type Links struct {
	Self    string `json:"self"`
	Result  string `json:"result"`
	Preview string `json:"preview"`
	Events  string `json:"events"`
	Cancel  string `json:"cancel"`
	Retry   string `json:"retry"`
	// Quote prices the rows left from those answered (a held task's
	// sample), and Start starts a held task.
	Quote string `json:"quote"`
	Start string `json:"start"`
	// Upload is where to PUT the sheet, while the task awaits it.
	Upload string `json:"upload,omitempty"`
}

func (s *server) linksOf(id string) Links {
	base := "/api/tasks/" + id
	l := Links{Self: base, Result: base + "/result", Preview: base + "/preview", Events: base + "/events", Cancel: base + "/cancel", Retry: base + "/retry",
		Quote: base + "/quote", Start: base + "/start"}
	if s.cfg.EventsURL != "" {
		l.Events = strings.TrimSuffix(s.cfg.EventsURL, "/") + l.Events
	}
	return l
}

// TaskList is the body of GET /api/tasks: the caller's tasks, newest
// first. NextCursor, when set, fetches the next page (?cursor=).
type TaskList struct {
	Tasks      []TaskView `json:"tasks"`
	NextCursor string     `json:"next_cursor,omitempty"`
}

// Preview is the body of GET /api/tasks/{id}/preview: the first rows of
// the result as they stand, the input columns then output, status and
// error.
type Preview struct {
	ID        string     `json:"id"`
	Status    string     `json:"status"`
	Columns   []string   `json:"columns"`
	Rows      [][]string `json:"rows"`
	RowsTotal int        `json:"rows_total"`
}
