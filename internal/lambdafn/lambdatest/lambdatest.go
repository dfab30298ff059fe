// Package lambdatest is what the tests of the Lambda handlers share: the
// embedded adapters a handler runs on in a unit test (Env), test sheets,
// and the recorded AWS events of testdata/ (an SQS batch, an API Gateway
// request). Only tests import it, so no function links it.
package lambdatest

import (
	"bytes"
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/blob/fileblob"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/queue"
	"github.com/batchgen/batchgen/internal/queue/sqlitequeue"
	"github.com/batchgen/batchgen/internal/store"
	"github.com/batchgen/batchgen/internal/store/sqlitestore"
)

// Epoch is where the handlers' fake clock starts.
var Epoch = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// Blobs is the file blob store plus the Size the splitter needs (S3's
// HeadObject), counting downloads per key so tests can tell one was
// avoided.
type Blobs struct {
	*fileblob.Store
	// SizeErr, when set, is what Size answers.
	SizeErr error
	mu      sync.Mutex
	opened  map[string]int
}

// Size is the object's size, as S3's HeadObject tells it.
func (s *Blobs) Size(_ context.Context, key string) (int64, error) {
	if s.SizeErr != nil {
		return 0, s.SizeErr
	}
	p, err := s.Path(key)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, blob.ErrNotFound
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Open opens key and counts it.
func (s *Blobs) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	s.mu.Lock()
	s.opened[key]++
	s.mu.Unlock()
	return s.Store.Open(ctx, key)
}

// Opens counts the downloads of key.
func (s *Blobs) Opens(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened[key]
}

// Env is the embedded adapters the handlers run on in unit tests: a
// SQLite store and queue, file blobs, a fake clock, and a JSON logger
// whose lines Logs keeps.
type Env struct {
	T     *testing.T
	Dir   string
	Clock *clock.Fake
	Store *sqlitestore.Store
	Queue *sqlitequeue.Queue
	Blobs *Blobs
	Logs  *SyncBuffer
	Log   *slog.Logger
}

// NewEnv builds an Env in a temporary directory of t.
func NewEnv(t *testing.T) *Env {
	t.Helper()
	dir := t.TempDir()
	clk := clock.NewFake(Epoch)
	st, err := sqlitestore.Open(filepath.Join(dir, "db.sqlite"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	q, err := sqlitequeue.New(st.DB(), sqlitequeue.Config{Name: "work", Visibility: 30 * time.Minute, MaxReceive: 5, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := fileblob.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &SyncBuffer{}
	return &Env{
		T: t, Dir: dir, Clock: clk, Store: st, Queue: q,
		Blobs: &Blobs{Store: fb, opened: map[string]int{}},
		Logs:  logs,
		Log:   slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// SyncBuffer is a bytes.Buffer safe for the concurrent writes of handlers.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines returns the JSON lines written so far.
func (b *SyncBuffer) Lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// Put stores content under key.
func (e *Env) Put(key string, content []byte) {
	e.T.Helper()
	if err := e.Blobs.Put(e.T.Context(), key, bytes.NewReader(content)); err != nil {
		e.T.Fatalf("put %s: %v", key, err)
	}
}

// Get returns the content at key, or fails.
func (e *Env) Get(key string) string {
	e.T.Helper()
	p, err := e.Blobs.Path(key)
	if err != nil {
		e.T.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		e.T.Fatalf("read %s: %v", key, err)
	}
	return string(b)
}

// Drain receives every visible message.
func (e *Env) Drain() []queue.Delivery {
	e.T.Helper()
	var all []queue.Delivery
	for {
		ds, err := e.Queue.Receive(e.T.Context(), 10)
		if err != nil {
			e.T.Fatalf("receive: %v", err)
		}
		if len(ds) == 0 {
			return all
		}
		all = append(all, ds...)
	}
}

// Tasks lists every task.
func (e *Env) Tasks() []store.Task {
	e.T.Helper()
	ts, err := e.Store.ListTasks(e.T.Context(), 0)
	if err != nil {
		e.T.Fatal(err)
	}
	return ts
}

// XLSX builds a workbook with a data sheet and, when promptText is not
// empty, a "prompt" sheet holding it in A1.
func XLSX(t *testing.T, header []string, rows [][]string, promptText string) []byte {
	t.Helper()
	f := excelize.NewFile()
	defer f.Close()
	if err := f.SetSheetName("Sheet1", "商品"); err != nil {
		t.Fatal(err)
	}
	write := func(sheet string, r int, values []string) {
		for c, v := range values {
			cell, err := excelize.CoordinatesToCellName(c+1, r)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.SetCellStr(sheet, cell, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("商品", 1, header)
	for i, r := range rows {
		write("商品", i+2, r)
	}
	if promptText != "" {
		if _, err := f.NewSheet("prompt"); err != nil {
			t.Fatal(err)
		}
		write("prompt", 1, []string{promptText})
	}
	var buf bytes.Buffer
	if err := f.Write(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// CSVBytes is a CSV file of header and rows.
func CSVBytes(header []string, rows [][]string) []byte {
	var b strings.Builder
	b.WriteString(strings.Join(header, ",") + "\n")
	for _, r := range rows {
		b.WriteString(strings.Join(r, ",") + "\n")
	}
	return []byte(b.String())
}

// recorded holds the AWS events of testdata/, embedded so that every
// package's tests read them whatever their working directory and however
// the binary was built (-trimpath leaves no source path to find them by).
//
//go:embed testdata/*.json
var recorded embed.FS

// ReadJSON decodes a recorded event of this package's testdata into v.
func ReadJSON(t *testing.T, name string, v any) {
	t.Helper()
	b, err := recorded.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
}

// Header is the header of the handlers' test sheets.
var Header = []string{"商品名称", "类目"}

// Rows are n rows under Header.
func Rows(n int) [][]string {
	out := make([][]string, n)
	for i := range out {
		out[i] = []string{fmt.Sprintf("积木 %d", i+1), "玩具"}
	}
	return out
}

// SQSEvent is the recorded SQS event carrying ds.
func SQSEvent(t *testing.T, ds []queue.Delivery) events.SQSEvent {
	t.Helper()
	var tmpl events.SQSEvent
	ReadJSON(t, "sqs-batch.json", &tmpl)
	var ev events.SQSEvent
	for _, d := range ds {
		r := tmpl.Records[0]
		r.Attributes = map[string]string{}
		for k, v := range tmpl.Records[0].Attributes {
			r.Attributes[k] = v
		}
		r.MessageId, r.ReceiptHandle, r.Body = d.ID, d.Receipt, string(d.Body)
		r.Attributes["ApproximateReceiveCount"] = strconv.Itoa(d.ReceiveCount)
		ev.Records = append(ev.Records, r)
	}
	return ev
}

// BatchNos are the batch numbers of ds, sorted.
func BatchNos(t *testing.T, ds []queue.Delivery) []int {
	t.Helper()
	var out []int
	for _, d := range ds {
		m, err := pipeline.DecodeBatchMessage(d.Body)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m.BatchNo)
	}
	slices.Sort(out)
	return out
}

// GatewayRequest is one HTTP request as API Gateway (payload 2.0) hands it
// to the api function after its JWT authorizer accepted a token of
// subject sub: the recorded GET event with method, path, body and claims
// replaced.
type GatewayRequest struct {
	Sub, Method, Target, ContentType, Body string
}

// Event builds the API Gateway event of r from the recorded payload.
func (r GatewayRequest) Event(t *testing.T) events.APIGatewayV2HTTPRequest {
	t.Helper()
	var ev events.APIGatewayV2HTTPRequest
	ReadJSON(t, "apigw-v2-get-task.json", &ev)
	u, err := url.Parse(r.Target)
	if err != nil {
		t.Fatal(err)
	}
	ev.RawPath, ev.RawQueryString = u.Path, u.RawQuery
	ev.RequestContext.HTTP.Method, ev.RequestContext.HTTP.Path = r.Method, u.Path
	ev.PathParameters = map[string]string{"proxy": strings.TrimPrefix(u.Path, "/")}
	ev.Headers = map[string]string{"host": ev.RequestContext.DomainName, "x-forwarded-proto": "https"}
	if r.ContentType != "" {
		ev.Headers["content-type"] = r.ContentType
	}
	ev.Body, ev.IsBase64Encoded = r.Body, false
	if !utf8.ValidString(r.Body) {
		ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString([]byte(r.Body)), true
	}
	ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{}
	if r.Sub != "" {
		ev.RequestContext.Authorizer.JWT = &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{
			Claims: map[string]string{"sub": r.Sub, "iss": "https://issuer.test", "client_id": "client"},
		}
	}
	return ev
}

// ServeGateway runs r through the Lambda adapter and returns the response
// with its body decoded.
func ServeGateway(t *testing.T, h *apifn.Handler, r GatewayRequest) (events.APIGatewayV2HTTPResponse, []byte) {
	t.Helper()
	resp, err := h.Handle(t.Context(), r.Event(t))
	if err != nil {
		t.Fatalf("%s %s: Handle: %v", r.Method, r.Target, err)
	}
	body := []byte(resp.Body)
	if resp.IsBase64Encoded {
		if body, err = base64.StdEncoding.DecodeString(resp.Body); err != nil {
			t.Fatalf("%s %s: body: %v", r.Method, r.Target, err)
		}
	}
	return resp, body
}

// SplitCSV splits n rows under Header into batches of size as task
// "task-1", its messages in Queue, and returns the task id.
func (e *Env) SplitCSV(n, size int) string {
	e.T.Helper()
	e.Put("in.csv", CSVBytes(Header, Rows(n)))
	p, err := e.Blobs.Path("in.csv")
	if err != nil {
		e.T.Fatal(err)
	}
	sp := pipeline.NewSplitter(e.Store, e.Queue, pipeline.SplitterConfig{Clock: e.Clock})
	spec := store.TaskSpec{Prompt: "Copy for {{商品名称}}", Provider: "sim", BatchSize: size}
	task, err := sp.Split(e.T.Context(), pipeline.SplitParams{TaskID: "task-1", Path: p, Source: "in.csv", Spec: spec})
	if err != nil {
		e.T.Fatalf("split: %v", err)
	}
	return task.ID
}
