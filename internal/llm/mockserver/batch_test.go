package mockserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
)

// batchClient drives a Server's Batch API in a test.
type batchClient struct {
	t   *testing.T
	s   *Server
	clk *clock.Fake
}

func (c batchClient) do(method, path, contentType string, body []byte) (int, map[string]any, []byte) {
	c.t.Helper()
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	c.s.ServeHTTP(rec, req)
	var m map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &m)
	return rec.Code, m, rec.Body.Bytes()
}

// upload posts a batch file of one request per prompt (custom ids row-1,
// row-2, ...) and returns its id.
func (c batchClient) upload(prompts ...string) string {
	c.t.Helper()
	var jsonl bytes.Buffer
	for i, p := range prompts {
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("row-%d", i+1), "method": "POST", "url": "/v1/chat/completions",
			"body": map[string]any{"model": "gpt-4o-mini", "messages": []map[string]string{{"role": "user", "content": p}}}})
		jsonl.Write(append(line, '\n'))
	}
	status, m, body := c.uploadRaw(jsonl.Bytes())
	if status != http.StatusOK {
		c.t.Fatalf("upload: %d %s", status, body)
	}
	return m["id"].(string)
}

func (c batchClient) uploadRaw(jsonl []byte) (int, map[string]any, []byte) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	_ = w.WriteField("purpose", "batch")
	part, _ := w.CreateFormFile("file", "in.jsonl")
	part.Write(jsonl)
	w.Close()
	return c.do("POST", "/v1/files", w.FormDataContentType(), b.Bytes())
}

func (c batchClient) create(fileID string) string {
	c.t.Helper()
	status, m, body := c.do("POST", "/v1/batches", "application/json",
		[]byte(`{"input_file_id":"`+fileID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`))
	if status != http.StatusOK || m["status"] != "validating" {
		c.t.Fatalf("create: %d %s", status, body)
	}
	return m["id"].(string)
}

func (c batchClient) get(id string) map[string]any {
	c.t.Helper()
	status, m, body := c.do("GET", "/v1/batches/"+id, "", nil)
	if status != http.StatusOK {
		c.t.Fatalf("get: %d %s", status, body)
	}
	return m
}

// lines reads a file's JSONL lines.
func (c batchClient) lines(fileID any) []map[string]any {
	c.t.Helper()
	if fileID == nil {
		return nil
	}
	status, _, body := c.do("GET", "/v1/files/"+fileID.(string)+"/content", "", nil)
	if status != http.StatusOK {
		c.t.Fatalf("file content: %d %s", status, body)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			c.t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func counts(m map[string]any) (total, completed, failed int) {
	rc := m["request_counts"].(map[string]any)
	return int(rc["total"].(float64)), int(rc["completed"].(float64)), int(rc["failed"].(float64))
}

func newBatchClient(t *testing.T, cfg Config) batchClient {
	clk := clock.NewFake(t0)
	cfg.Clock, cfg.BatchDelay = clk, 100*time.Second
	return batchClient{t: t, s: New(cfg), clk: clk}
}

// TestBatchCompletes: a batch's lines finish over its delay; the output
// file has the answers, in another order than the input's, each under its
// custom id; the error file has the line a marker filtered; the paid log
// has each answer once, marked as batch.
func TestBatchCompletes(t *testing.T) {
	var paid bytes.Buffer
	c := newBatchClient(t, Config{PaidLog: &paid})
	var prompts []string
	for i := 1; i <= 20; i++ {
		prompts = append(prompts, fmt.Sprintf("product %d", i))
	}
	prompts[6] = "product 7 [[filter]]"
	id := c.create(c.upload(prompts...))

	if m := c.get(id); m["status"] != "in_progress" {
		t.Errorf("at once: %v, want in_progress", m["status"])
	}
	c.clk.Advance(50 * time.Second)
	m := c.get(id)
	if _, completed, failed := counts(m); m["status"] != "in_progress" || completed+failed != 10 {
		t.Errorf("half way: %s with %d+%d lines done, want in_progress with 10", m["status"], completed, failed)
	}
	c.clk.Advance(50 * time.Second)
	m = c.get(id)
	total, completed, failed := counts(m)
	if m["status"] != "completed" || total != 20 || completed != 19 || failed != 1 {
		t.Fatalf("at its delay: %v", m)
	}
	out := c.lines(m["output_file_id"])
	var order []string
	for _, l := range out {
		cid := l["custom_id"].(string)
		order = append(order, cid)
		var n int
		fmt.Sscanf(cid, "row-%d", &n)
		resp := l["response"].(map[string]any)
		content := resp["body"].(map[string]any)["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"]
		if resp["status_code"] != 200.0 || content != "Copy for: "+prompts[n-1] {
			t.Errorf("%s answered %v (%v), want its own prompt's copy", cid, content, resp["status_code"])
		}
	}
	var inputOrder []string
	for i := range prompts {
		if i != 6 {
			inputOrder = append(inputOrder, fmt.Sprintf("row-%d", i+1))
		}
	}
	if strings.Join(order, ",") == strings.Join(inputOrder, ",") {
		t.Errorf("output in the input's order %v: want it shuffled", order)
	}
	errs := c.lines(m["error_file_id"])
	if len(errs) != 1 || errs[0]["custom_id"] != "row-7" || errs[0]["response"].(map[string]any)["status_code"] != 400.0 {
		t.Errorf("error file %v, want row-7 filtered (400)", errs)
	}
	paidLines := strings.Split(strings.TrimSpace(paid.String()), "\n")
	if len(paidLines) != 19 || !strings.Contains(paidLines[0], `"batch":true`) {
		t.Errorf("paid log %q: want 19 batch lines", paidLines)
	}
}

// TestBatchCancelKeepsFinishedLines: a batch cancelled half way keeps the
// answers it has, and lists the rest in its error file as cancelled.
func TestBatchCancelKeepsFinishedLines(t *testing.T) {
	c := newBatchClient(t, Config{})
	id := c.create(c.upload("a", "b", "c", "d", "e", "f", "g", "h", "i", "j"))
	c.clk.Advance(40 * time.Second)
	if status, m, body := c.do("POST", "/v1/batches/"+id+"/cancel", "", nil); status != http.StatusOK || m["status"] != "cancelling" {
		t.Fatalf("cancel: %d %s", status, body)
	}
	c.clk.Advance(time.Hour)
	m := c.get(id)
	_, completed, failed := counts(m)
	if m["status"] != "cancelled" || completed != 4 || failed != 6 {
		t.Fatalf("after the cancel: %v", m)
	}
	for _, l := range c.lines(m["error_file_id"]) {
		if l["error"].(map[string]any)["code"] != "batch_cancelled" {
			t.Errorf("error line %v, want batch_cancelled", l)
		}
	}
	if status, _, _ := c.do("POST", "/v1/batches/"+id+"/cancel", "", nil); status != http.StatusConflict {
		t.Errorf("cancelling a cancelled batch: %d, want 409", status)
	}
}

// TestBatchExpires: with BatchExpire the batch expires at its delay with
// half its lines done, the rest in the error file as expired.
func TestBatchExpires(t *testing.T) {
	c := newBatchClient(t, Config{BatchExpire: true})
	id := c.create(c.upload("a", "b", "c", "d", "e", "f", "g", "h", "i", "j"))
	c.clk.Advance(100 * time.Second)
	m := c.get(id)
	_, completed, failed := counts(m)
	if m["status"] != "expired" || completed != 5 || failed != 5 || len(c.lines(m["output_file_id"])) != 5 {
		t.Fatalf("at its delay: %v", m)
	}
	for _, l := range c.lines(m["error_file_id"]) {
		if l["error"].(map[string]any)["code"] != "batch_expired" {
			t.Errorf("error line %v, want batch_expired", l)
		}
	}
}

// TestBatchErrorRate: BatchErrorRate fails a share of the lines with a
// 500, in the error file.
func TestBatchErrorRate(t *testing.T) {
	c := newBatchClient(t, Config{BatchErrorRate: 0.3, Seed: 7})
	var prompts []string
	for i := range 200 {
		prompts = append(prompts, fmt.Sprintf("p%d", i))
	}
	id := c.create(c.upload(prompts...))
	c.clk.Advance(100 * time.Second)
	m := c.get(id)
	_, completed, failed := counts(m)
	if m["status"] != "completed" || failed < 40 || failed > 80 || completed+failed != 200 {
		t.Errorf("%d of 200 lines failed (%d answered), want about 60", failed, completed)
	}
	for _, l := range c.lines(m["error_file_id"]) {
		if l["response"].(map[string]any)["status_code"] != 500.0 {
			t.Errorf("error line %v, want a 500", l)
		}
	}
}

// TestBatchFileChecks: a file OpenAI would refuse is refused, naming the
// line and what is wrong.
func TestBatchFileChecks(t *testing.T) {
	c := newBatchClient(t, Config{})
	line := func(cid, url string) string {
		return `{"custom_id":"` + cid + `","method":"POST","url":"` + url + `","body":{"model":"m","messages":[{"role":"user","content":"x"}]}}` + "\n"
	}
	for _, tc := range []struct{ file, want string }{
		{line("a", "/v1/chat/completions") + line("a", "/v1/chat/completions"), `line 2: custom_id "a" is used twice`},
		{line("a", "/v1/embeddings"), "line 1: want method POST and url /v1/chat/completions"},
		{"not json\n", "line 1: not a JSON request"},
		{"", "the file has 0 requests"},
	} {
		status, m, body := c.uploadRaw([]byte(tc.file))
		msg, _ := m["error"].(map[string]any)["message"].(string)
		if status != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("file %q: %d %s, want 400 saying %q", tc.file, status, body, tc.want)
		}
	}
	if status, _, _ := c.do("POST", "/v1/batches", "application/json", []byte(`{"input_file_id":"file-nope","endpoint":"/v1/chat/completions","completion_window":"24h"}`)); status != http.StatusBadRequest {
		t.Errorf("a batch of an unknown file: %d, want 400", status)
	}
}

// TestParsePaidLog: online and batch lines, per prompt; a last line cut
// short by a kill is not counted, any other bad line is an error.
func TestParsePaidLog(t *testing.T) {
	got, err := ParsePaidLog([]byte("\"a\"\n{\"prompt\":\"a\",\"batch\":true}\n\"b\"\n\"a\"\n{\"prom"))
	if err != nil {
		t.Fatal(err)
	}
	if got["a"] != (Paid{Online: 2, Batch: 1}) || got["b"] != (Paid{Online: 1}) || len(got) != 2 {
		t.Errorf("parsed %v", got)
	}
	if _, err := ParsePaidLog([]byte("\"a\"\nnonsense\n\"b\"\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a bad line: %v, want an error naming line 2", err)
	}
}
