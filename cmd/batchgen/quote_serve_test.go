package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// quoteView is the part of GET /api/tasks/{id}/quote the tests read.
type quoteView struct {
	Status   string   `json:"status"`
	Rows     int      `json:"rows"`
	Left     int      `json:"left"`
	Sample   int      `json:"sample"`
	Tried    int      `json:"tried"`
	Measured int      `json:"measured"`
	Sampling bool     `json:"sampling"`
	SpentUSD *float64 `json:"spent_usd"`
	Plans    []struct {
		Mode    string `json:"mode"`
		Offered bool   `json:"offered"`
		Note    string `json:"note"`
		CostUSD *struct {
			Low, Mid, High float64
		} `json:"cost_usd"`
		Seconds *struct {
			Low, Mid, High float64
		} `json:"seconds"`
	} `json:"plans"`
}

// TestServeQuoteThenStart: a task created through serve's API with a
// sample is split and held; its sample (and only its sample) is answered;
// the quote prices the rest online and through the batch API at half; the
// start runs the rest, and the sample's rows are not paid twice. A second
// held task, cancelled from its quote, never runs more than its sample.
func TestServeQuoteThenStart(t *testing.T) {
	t.Parallel()
	model := mockserver.New(mockserver.Config{Latency: 20 * time.Millisecond})
	mock := httptest.NewServer(model)
	t.Cleanup(mock.Close)
	dir := t.TempDir()
	prices := writeFile(t, filepath.Join(dir, "prices.yaml"), "models:\n  mock-1: {input_per_mtok: 1000, output_per_mtok: 1000}\n")
	srv := startServe(t, filepath.Join(dir, "data"), mock, "--model", "mock-1", "--prices", prices, "--rpm", "6000")

	call := func(method, path string, body io.Reader, contentType string, v any) int {
		t.Helper()
		req, err := http.NewRequest(method, srv.url+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if v != nil && json.Unmarshal(b, v) != nil {
			t.Fatalf("%s %s: %s %s", method, path, resp.Status, b)
		}
		return resp.StatusCode
	}
	create := func(name string, rows, sample int) string {
		t.Helper()
		var csv strings.Builder
		csv.WriteString("id,name\n")
		for i := range rows {
			fmt.Fprintf(&csv, "%d,%s product %d with a longer description\n", i, name, i)
		}
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", name+".csv")
		_, _ = io.WriteString(fw, csv.String())
		_ = mw.WriteField("prompt", "Copy for {{name}}")
		_ = mw.WriteField("sample", fmt.Sprint(sample))
		_ = mw.Close()
		var task apiTask
		if code := call("POST", "/api/tasks", &body, mw.FormDataContentType(), &task); code != http.StatusCreated || task.State != "HELD" {
			t.Fatalf("create %s: %d %+v, want 201 and HELD", name, code, task)
		}
		return task.TaskID
	}
	quoted := func(id string) quoteView {
		t.Helper()
		var q quoteView
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if code := call("GET", "/api/tasks/"+id+"/quote?deadline=2h", nil, "", &q); code != http.StatusOK {
				t.Fatalf("quote %s: %d %+v", id, code, q)
			}
			if !q.Sampling {
				return q
			}
			if time.Now().After(deadline) {
				t.Fatalf("quote %s still sampling after 30 s: %+v", id, q)
			}
		}
	}

	const rows, sample = 40, 6
	id := create("quoted", rows, sample)
	q := quoted(id)
	if q.Status != "HELD" || q.Sample != sample || q.Tried != sample || q.Measured != sample || q.Left != rows-sample || q.Rows != rows {
		t.Fatalf("quote after the sample = %+v, want HELD with %d of %d rows measured", q, sample, rows)
	}
	if got := model.Stats().Succeeded; got != sample {
		t.Errorf("the provider answered %d calls for a sample of %d", got, sample)
	}
	if len(q.Plans) != 3 || q.Plans[0].Mode != "online" || q.Plans[1].Mode != "economy" || q.Plans[2].Mode != "auto" {
		t.Fatalf("plans = %+v, want online, economy, auto", q.Plans)
	}
	online, economy, auto := q.Plans[0], q.Plans[1], q.Plans[2]
	if online.CostUSD == nil || economy.CostUSD == nil || !economy.Offered || !auto.Offered || online.Seconds == nil || auto.Seconds == nil {
		t.Fatalf("plans = %+v, want costs and times for all three", q.Plans)
	}
	if math.Abs(economy.CostUSD.Mid-online.CostUSD.Mid/2) > 0.01*online.CostUSD.Mid {
		t.Errorf("economy quoted at $%.4f, online at $%.4f: want half", economy.CostUSD.Mid, online.CostUSD.Mid)
	}
	if auto.Seconds.High > 2*3600+1 {
		t.Errorf("auto takes up to %.0f s; its deadline is 2h away", auto.Seconds.High)
	}
	// Held: nothing beyond the sample runs while its owner reads.
	time.Sleep(500 * time.Millisecond)
	if got := model.Stats().Succeeded; got != sample {
		t.Errorf("%d calls while the task was held, want its sample's %d", got, sample)
	}

	var started apiTask
	if code := call("POST", "/api/tasks/"+id+"/start", strings.NewReader(`{"mode": "online"}`), "application/json", &started); code != http.StatusAccepted || started.State != "RUNNING" {
		t.Fatalf("start: %d %+v, want 202 RUNNING", code, started)
	}
	var done struct {
		apiTask
		EstimatedCost *float64 `json:"estimated_cost"`
	}
	for deadline := time.Now().Add(60 * time.Second); done.State != "SUCCEEDED"; time.Sleep(100 * time.Millisecond) {
		call("GET", "/api/tasks/"+id, nil, "", &done)
		if time.Now().After(deadline) {
			t.Fatalf("task %s is %+v 60 s after its start", id, done)
		}
	}
	if done.RowsSucceeded != rows {
		t.Errorf("%d rows succeeded, want %d", done.RowsSucceeded, rows)
	}
	if got := model.Stats().Succeeded; got != rows {
		t.Errorf("the provider answered %d calls for %d rows: the sample was paid twice", got, rows)
	}
	if quotedCost := *q.SpentUSD + online.CostUSD.Mid; done.EstimatedCost == nil || math.Abs(*done.EstimatedCost-quotedCost) > 0.15*quotedCost {
		t.Errorf("the run cost %v, the quote said $%.6f: want within 15%%", done.EstimatedCost, quotedCost)
	}
	// Starting it again is a conflict.
	if code := call("POST", "/api/tasks/"+id+"/start", nil, "", nil); code != http.StatusConflict {
		t.Errorf("second start: %d, want 409", code)
	}

	// A held task cancelled from its quote: its sample stays, nothing else
	// is called, and its partial result is written.
	before := model.Stats().Succeeded
	dropped := create("dropped", 20, 3)
	quoted(dropped)
	var cancelled apiTask
	if code := call("POST", "/api/tasks/"+dropped+"/cancel", nil, "", &cancelled); code != http.StatusAccepted || cancelled.State != "CANCELLED" {
		t.Fatalf("cancel the held task: %d %+v", code, cancelled)
	}
	time.Sleep(300 * time.Millisecond)
	if got := model.Stats().Succeeded - before; got != 3 {
		t.Errorf("a held task cancelled after its sample of 3 made %d calls", got)
	}
	srv.stop()
}
