package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeSharesTheQuotaBetweenPrincipals: alice starts a 1,000-row task
// on a server paced to 600 calls a minute; bob sends 40 rows a moment
// later. The server serves the two in turn (the queue's turns, a newcomer
// worker, the generator's row slots), so bob's task ends while alice's runs
// on, and alice finishes at most about as many rows as bob meanwhile, not
// the whole quota's worth.
func TestServeSharesTheQuotaBetweenPrincipals(t *testing.T) {
	t.Parallel()
	tokens := map[string]string{"alice": strings.Repeat("a", 24), "bob": strings.Repeat("b", 24)}
	srv := startServeWith(t, filepath.Join(t.TempDir(), "data"), []string{"BATCHGEN_API_TOKENS=alice:" + tokens["alice"] + ",bob:" + tokens["bob"]},
		"--provider", "sim", "--sim-latency", "20ms", "--rpm", "600", "--concurrency", "4", "--batch-size", "10", "--log-level", "warn")
	type task struct {
		ID            string `json:"id"`
		Status        string `json:"status"`
		RowsSucceeded int    `json:"rows_succeeded"`
	}
	call := func(who, method, path string, body io.Reader, contentType string) task {
		t.Helper()
		req, _ := http.NewRequest(method, srv.url+path, body)
		req.Header.Set("Authorization", "Bearer "+tokens[who])
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got task
		if resp.StatusCode >= 300 || json.NewDecoder(resp.Body).Decode(&got) != nil {
			t.Fatalf("%s %s as %s: %s", method, path, who, resp.Status)
		}
		return got
	}
	upload := func(who string, rows int) task {
		t.Helper()
		var csv strings.Builder
		csv.WriteString("id,name\n")
		for i := range rows {
			fmt.Fprintf(&csv, "%d,%s product %d\n", i, who, i)
		}
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", who+".csv")
		_, _ = io.WriteString(fw, csv.String())
		_ = mw.WriteField("prompt", "{{name}}")
		_ = mw.Close()
		return call(who, "POST", "/api/tasks", &body, mw.FormDataContentType())
	}
	alice := upload("alice", 1000)
	// Alice's batches fill every worker first.
	deadline := time.Now().Add(30 * time.Second)
	for call("alice", "GET", "/api/tasks/"+alice.ID, nil, "").RowsSucceeded < 20 {
		if time.Now().After(deadline) {
			t.Fatal("alice's task made no progress in 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	aliceBefore := call("alice", "GET", "/api/tasks/"+alice.ID, nil, "").RowsSucceeded
	bob := upload("bob", 40)
	for bob.Status != "SUCCEEDED" {
		if time.Now().After(deadline.Add(60 * time.Second)) {
			t.Fatalf("bob's 40 rows are %s after 90 s", bob.Status)
		}
		time.Sleep(50 * time.Millisecond)
		bob = call("bob", "GET", "/api/tasks/"+bob.ID, nil, "")
	}
	aliceAfter := call("alice", "GET", "/api/tasks/"+alice.ID, nil, "")
	if aliceAfter.Status == "SUCCEEDED" {
		t.Fatalf("alice's 1,000 rows finished before bob's 40: bob waited behind her")
	}
	// In turn, alice gets about half the calls while bob's rows run: about
	// 40, plus the rows her batches had in hand when bob came.
	if meanwhile := aliceAfter.RowsSucceeded - aliceBefore; meanwhile > 100 {
		t.Errorf("alice finished %d rows while bob's 40 ran; the principals did not share the quota", meanwhile)
	}
}

// TestServePrincipalLimits: serve's --max-active-tasks reaches the API: a
// principal with one task running is refused a second with 429 and
// Retry-After, and another principal is not.
func TestServePrincipalLimits(t *testing.T) {
	t.Parallel()
	tokens := map[string]string{"alice": strings.Repeat("a", 24), "bob": strings.Repeat("b", 24)}
	srv := startServeWith(t, filepath.Join(t.TempDir(), "data"), []string{"BATCHGEN_API_TOKENS=alice:" + tokens["alice"] + ",bob:" + tokens["bob"]},
		"--provider", "sim", "--sim-latency", "500ms", "--concurrency", "1", "--max-active-tasks", "1", "--log-level", "warn")
	upload := func(who string) *http.Response {
		t.Helper()
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", who+".csv")
		_, _ = io.WriteString(fw, "name\n"+strings.Repeat("brick\n", 20))
		_ = mw.WriteField("prompt", "{{name}}")
		_ = mw.Close()
		req, _ := http.NewRequest("POST", srv.url+"/api/tasks", &body)
		req.Header.Set("Authorization", "Bearer "+tokens[who])
		req.Header.Set("Content-Type", mw.FormDataContentType())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if resp := upload("alice"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("alice's first task: %s", resp.Status)
	}
	resp := upload("alice")
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(msg), "max active tasks 1") {
		t.Errorf("alice's second task while the first runs: %s, Retry-After %q, %s; want 429 naming the limit", resp.Status, resp.Header.Get("Retry-After"), msg)
	}
	if resp := upload("bob"); resp.StatusCode != http.StatusCreated {
		t.Errorf("bob's first task: %s, want 201", resp.Status)
	}
}
