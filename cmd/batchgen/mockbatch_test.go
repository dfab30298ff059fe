package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestMockLLMBatchAPI: `batchgen mock-llm --batch-delay 1s` serves OpenAI's
// Batch API: a file of 30 requests becomes a batch that completes within
// about a second, its output file answering each custom id, and the paid
// log bills each line once, as batch.
func TestMockLLMBatchAPI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := startMockLLM(t, dir, "b", "--batch-delay", "1s")
	post := func(path, contentType string, body []byte) map[string]any {
		t.Helper()
		resp, err := http.Post(m.baseURL+path, contentType, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d %v %v", path, resp.StatusCode, out, err)
		}
		return out
	}
	var jsonl bytes.Buffer
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&jsonl, `{"custom_id":"row-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"product %d"}]}}`+"\n", i, i)
	}
	var form bytes.Buffer
	w := multipart.NewWriter(&form)
	_ = w.WriteField("purpose", "batch")
	part, _ := w.CreateFormFile("file", "rows.jsonl")
	part.Write(jsonl.Bytes())
	w.Close()
	file := post("/files", w.FormDataContentType(), form.Bytes())
	batch := post("/batches", "application/json", []byte(`{"input_file_id":"`+file["id"].(string)+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`))

	deadline := time.Now().Add(30 * time.Second)
	for batch["status"] != "completed" {
		if time.Now().After(deadline) {
			t.Fatalf("batch still %v after 30 s", batch["status"])
		}
		time.Sleep(100 * time.Millisecond)
		resp, err := http.Get(m.baseURL + "/batches/" + batch["id"].(string))
		if err != nil {
			t.Fatal(err)
		}
		batch = nil
		_ = json.NewDecoder(resp.Body).Decode(&batch)
		resp.Body.Close()
	}
	resp, err := http.Get(m.baseURL + "/files/" + batch["output_file_id"].(string) + "/content")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	resp.Body.Close()
	if n := strings.Count(strings.TrimSpace(out.String()), "\n") + 1; n != 30 {
		t.Errorf("output file has %d lines, want 30", n)
	}
	b, err := os.ReadFile(filepath.Join(dir, "b.paid"))
	if err != nil {
		t.Fatal(err)
	}
	paid, err := mockserver.ParsePaidLog(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 30; i++ {
		if p := paid[fmt.Sprintf("product %d", i)]; p != (mockserver.Paid{Batch: 1}) {
			t.Errorf("product %d paid %+v, want once as batch", i, p)
		}
	}
}
