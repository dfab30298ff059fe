package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// measureFairness: issue 20's fair sharing. `batchgen serve` with two
// principals and a quota of 600 calls a minute (the simulator at 200 ms a
// call): alice sends 20,000 rows (5,000 quick), bob 100 rows 5 s later.
// Bob's task must end within twice its own bound, 100 rows at half the
// quota: 20 s. Before the principals took turns it waited behind alice's
// batches in hand, and would have behind her whole task on a plain FIFO.
func measureFairness(ctx context.Context, r *run) ([]Figure, error) {
	const rpm, small = 600, 100
	big := 20_000
	if r.quick {
		big = 5_000
	}
	tokens := map[string]string{"alice": strings.Repeat("a", 24), "bob": strings.Repeat("b", 24)}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bin, "serve", "--addr", "127.0.0.1:0", "--data", r.dir("fair-data"),
		"--provider", "sim", "--sim-latency", "200ms", "--rpm", fmt.Sprint(rpm), "--log-level", "warn")
	cmd.Env = append(os.Environ(), "BATCHGEN_API_TOKENS=alice:"+tokens["alice"]+",bob:"+tokens["bob"])
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	url := ""
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(lines.Text()); m != nil {
			url = m[1]
			break
		}
	}
	if url == "" {
		return nil, fmt.Errorf("serve did not start:\n%s", stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	type task struct {
		ID            string `json:"id"`
		Status        string `json:"status"`
		RowsSucceeded int    `json:"rows_succeeded"`
	}
	call := func(who, method, path string, body io.Reader, contentType string) (task, error) {
		req, err := http.NewRequestWithContext(ctx, method, url+path, body)
		if err != nil {
			return task{}, err
		}
		req.Header.Set("Authorization", "Bearer "+tokens[who])
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return task{}, err
		}
		defer resp.Body.Close()
		var t task
		if resp.StatusCode >= 300 {
			b, _ := io.ReadAll(resp.Body)
			return t, fmt.Errorf("%s %s as %s: %s %s", method, path, who, resp.Status, b)
		}
		return t, json.NewDecoder(resp.Body).Decode(&t)
	}
	upload := func(who string, rows int) (task, error) {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", who+".csv")
		fmt.Fprintln(fw, "id,name")
		for i := range rows {
			fmt.Fprintf(fw, "%d,%s product %d\n", i, who, i)
		}
		_ = mw.WriteField("prompt", "{{name}}")
		_ = mw.Close()
		return call(who, "POST", "/api/tasks", &body, mw.FormDataContentType())
	}
	alice, err := upload("alice", big)
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(5 * time.Second):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	start := time.Now()
	bob, err := upload("bob", small)
	if err != nil {
		return nil, err
	}
	for bob.Status != "SUCCEEDED" {
		if time.Since(start) > 10*time.Minute {
			return nil, fmt.Errorf("bob's %d rows are %s after 10 minutes", small, bob.Status)
		}
		time.Sleep(200 * time.Millisecond)
		if bob, err = call("bob", "GET", "/api/tasks/"+bob.ID, nil, ""); err != nil {
			return nil, err
		}
	}
	took := time.Since(start)
	a, err := call("alice", "GET", "/api/tasks/"+alice.ID, nil, "")
	if err != nil {
		return nil, err
	}
	if _, err := call("alice", "POST", "/api/tasks/"+alice.ID+"/cancel", nil, ""); err != nil {
		return nil, err
	}
	bound := time.Duration(float64(small) / (rpm / 60.0 / 2) * float64(time.Second))
	return []Figure{{
		ID:    "fair-small",
		Name:  "fairness: a 100-row task sent 5 s after a large one of another principal, time / its bound at half the quota",
		Value: took.Seconds() / bound.Seconds(), Unit: "x", Better: AtMost, Bound: 2,
		Detail: fmt.Sprintf("bob's %d rows took %.1f s beside alice's %d (bound %.0f s: %d rows at %d calls a minute shared by two); alice had %d rows done and was %s",
			small, took.Seconds(), big, bound.Seconds(), small, rpm, a.RowsSucceeded, a.Status),
	}}, nil
}
