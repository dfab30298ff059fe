package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// bedrockDouble answers Converse calls (POST /model/{modelId}/converse) in
// Bedrock's wire format: a guardrail stop for prompts containing
// "GUARDRAIL", else a text answer with usage; with denied set, every call
// gets AccessDeniedException.
func bedrockDouble(t *testing.T, denied bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /model/{modelId}/converse", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential=AKIDBATCHGEN/") {
			t.Errorf("Authorization = %q: not signed with the environment's credentials", r.Header.Get("Authorization"))
		}
		w.Header().Set("Content-Type", "application/json")
		if denied {
			w.Header().Set("X-Amzn-ErrorType", "AccessDeniedException")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"message":"You don't have access to the model with the specified model ID."}`)
			return
		}
		var in struct {
			Messages []struct {
				Content []struct{ Text string } `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || len(in.Messages) != 1 || len(in.Messages[0].Content) != 1 {
			t.Errorf("request body: %v %+v", err, in)
		}
		prompt := in.Messages[0].Content[0].Text
		stop, text := "end_turn", "文案："+prompt+" from "+r.PathValue("modelId")
		if strings.Contains(prompt, "GUARDRAIL") {
			stop, text = "guardrail_intervened", "Sorry, the model cannot answer this question."
		}
		out, _ := json.Marshal(map[string]any{
			"output":     map[string]any{"message": map[string]any{"role": "assistant", "content": []any{map[string]any{"text": text}}}},
			"stopReason": stop,
			"usage":      map[string]any{"inputTokens": 20, "outputTokens": 10, "totalTokens": 30},
			"metrics":    map[string]any{"latencyMs": 5},
		})
		w.Write(out)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &calls
}

// runWithAWSEnv runs the binary with static AWS credentials in the
// environment and no shared config, as the default credential chain would
// find them on a workstation.
func runWithAWSEnv(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), binary, args...)
	var env []string
	for _, kv := range os.Environ() {
		// No AWS settings but the fake ones below, and no vendor key, so
		// that the checks of a missing key run wherever the test does.
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "ANTHROPIC_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "AWS_ACCESS_KEY_ID=AKIDBATCHGEN", "AWS_SECRET_ACCESS_KEY=secret",
		"AWS_CONFIG_FILE="+os.DevNull, "AWS_SHARED_CREDENTIALS_FILE="+os.DevNull, "AWS_EC2_METADATA_DISABLED=true")
	return runCmd(t, cmd)
}

// TestRunBedrock runs a job through --provider bedrock against a double of
// the Converse wire format: rows answered with their provider and tokens, a
// guardrail stop failing its row as content_filter, and an access-denied
// model stopping the calls.
func TestRunBedrock(t *testing.T) {
	t.Parallel()
	srv, calls := bedrockDouble(t, false)
	dir := t.TempDir()
	in := productsCSV(t, dir, 12, func(i int) string {
		if i == 5 {
			return "GUARDRAIL"
		}
		return ""
	})
	r := runWithAWSEnv(t, "run", "--in", in, "--prompt", "为{{商品名称}}写文案", "--provider", "bedrock",
		"--model", "us.amazon.nova-lite-v1:0", "--region", "us-west-2", "--base-url", srv.URL)
	if r.code != 3 {
		t.Fatalf("exit %d, want 3 (one row failed); stderr:\n%s", r.code, r.stderr)
	}
	rows := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for i, row := range rows[1:] {
		if i+1 == 5 {
			if row[col["status"]] != "failed" || row[col["error_class"]] != "content_filter" || !strings.Contains(row[col["error"]], "guardrail_intervened") {
				t.Errorf("guardrail row = %q, want failed content_filter naming guardrail_intervened", row)
			}
			continue
		}
		if row[col["status"]] != "succeeded" || !strings.HasSuffix(row[col["output"]], "from us.amazon.nova-lite-v1:0") ||
			row[col["provider"]] != "bedrock/us.amazon.nova-lite-v1:0" || row[col["input_tokens"]] != "20" || row[col["output_tokens"]] != "10" {
			t.Errorf("row %d = %q, want succeeded by bedrock/us.amazon.nova-lite-v1:0 with 20/10 tokens", i+1, row)
		}
	}
	if got := calls.Load(); got != 12 {
		t.Errorf("%d Converse calls for 12 rows, want 12", got)
	}
	// 11 rows of 20 in, 10 out at the built-in Nova Lite price.
	if !strings.Contains(r.stdout, "tokens    220 in (0 cached), 110 out  (estimated cost $0.000040)") {
		t.Errorf("summary lacks the tokens line:\n%s", r.stdout)
	}

	deniedSrv, deniedCalls := bedrockDouble(t, true)
	dir = t.TempDir()
	in = productsCSV(t, dir, 60, nil)
	r = runWithAWSEnv(t, "run", "--in", in, "--prompt", "{{商品名称}}", "--provider", "bedrock", "--concurrency", "2",
		"--model", "amazon.nova-lite-v1:0", "--region", "us-east-1", "--base-url", deniedSrv.URL)
	if r.code != 3 {
		t.Fatalf("access denied: exit %d, want 3; stderr:\n%s", r.code, r.stderr)
	}
	rows = readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	for _, row := range rows[1:] {
		if row[col["error_class"]] != "auth" {
			t.Fatalf("row %q: want error class auth", row)
		}
	}
	if got := deniedCalls.Load(); got > 2 {
		t.Errorf("%d calls after access was denied, want at most the 2 in flight: auth errors stop the job", got)
	}
}

func TestRunBedrockFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 2, nil)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no model", []string{"--provider", "bedrock", "--region", "us-east-1"}, "--provider bedrock needs --model"},
		{"region for openai", []string{"--provider", "openai", "--base-url", "http://127.0.0.1:1/v1", "--region", "us-east-1"}, "--region is not used by --provider openai"},
		{"unknown provider", []string{"--provider", "vertex"}, `--provider "vertex": use openai, anthropic, bedrock, sim or mock`},
		{"mock without its server", []string{"--provider", "mock"}, "--provider mock needs --base-url"},
		{"anthropic without a key", []string{"--provider", "anthropic"}, "--provider anthropic needs ANTHROPIC_API_KEY in the environment"},
		{"anthropic's root with /v1", []string{"--provider", "anthropic", "--base-url", "http://127.0.0.1:1/v1"}, "anthropic takes the API root without /v1"},
	}
	for _, tc := range tests {
		r := runWithAWSEnv(t, append([]string{"run", "--in", in, "--prompt", "{{sku}}"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", tc.name, r.code, r.stderr, tc.want)
		}
	}
	// No region anywhere: refused before any row is called.
	r := runWithAWSEnv(t, "run", "--in", in, "--prompt", "{{sku}}", "--provider", "bedrock", "--model", "amazon.nova-lite-v1:0")
	if r.code != 2 || !strings.Contains(r.stderr, "no AWS region") {
		t.Errorf("no region: exit %d, stderr %q", r.code, r.stderr)
	}
}
