package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestLogsKeepKeyAndPromptOut runs a job with a known API key and prompt
// text through retries and failures at --log-level info and scans every line
// it printed: neither appears, while the lines on the task's path carry
// task_id and batch_no and each batch's outcome is one INFO line.
func TestLogsKeepKeyAndPromptOut(t *testing.T) {
	t.Parallel()
	const key = "sk-test-d0ntLogMe-7f3a9c"
	const promptText = "PROMPT-SECRET-写一段绝密文案"
	mock := mockserver.New(mockserver.Config{
		Latency: 2 * time.Millisecond, FailRate: 0.2, Seed: 5, RequireAPIKey: key,
		Quota: 40, QuotaWindow: time.Second,
	})
	srv := httptest.NewServer(mock)
	defer srv.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 60, func(i int) string {
		if i%20 == 0 {
			return " [[filter]]" // a permanent failure with the provider's message
		}
		return ""
	})
	cmd := exec.CommandContext(context.Background(), binary, "run", "--in", in, "--prompt", promptText+" {{商品名称}}",
		"--provider", "openai", "--base-url", srv.URL+"/v1", "--batch-size", "20", "--retry-delays", "50ms",
		"--log-level", "info", "--progress-interval", "10ms")
	cmd.Env = append(cmd.Environ(), "OPENAI_API_KEY="+key)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("exit %v, want 3 (filtered rows fail); stderr:\n%s", err, stderr.String())
	}
	if st := mock.Stats(); st.Succeeded == 0 || st.ServerErrors == 0 {
		t.Fatalf("the mock saw no successful or failed calls with the key: %+v", st)
	}
	all := stdout.String() + stderr.String()
	for _, secret := range []string{key, "d0ntLogMe", "PROMPT-SECRET", "绝密"} {
		if strings.Contains(all, secret) {
			t.Errorf("output contains %q:\n%s", secret, all)
		}
	}
	batchDone := regexp.MustCompile(`(?m)^time=\S+ level=INFO msg="batch done" .*\btask_id=[0-9a-f]{20}\b.*\bbatch_no=(\d+)\b`)
	seen := map[string]int{}
	for _, m := range batchDone.FindAllStringSubmatch(stderr.String(), -1) {
		seen[m[1]]++
	}
	if len(seen) != 3 {
		t.Errorf("batch done lines for batches %v, want one each for 1-3; stderr:\n%s", seen, stderr.String())
	}
	for b, n := range seen {
		if n != 1 {
			t.Errorf("batch %s has %d batch-done lines, want 1", b, n)
		}
	}
	if n := strings.Count(stderr.String(), "level=INFO"); n > 20 {
		t.Errorf("%d INFO lines for 60 rows in 3 batches: more than one per batch outcome\n%s", n, stderr.String())
	}
}
