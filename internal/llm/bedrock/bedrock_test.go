package bedrockllm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm"
	bedrockllm "github.com/batchgen/batchgen/internal/llm/bedrock"
	"github.com/batchgen/batchgen/internal/schema"
)

// converseDouble is a local HTTP double of Bedrock's Converse wire format
// (restJson1: POST /model/{modelId}/converse, errors named by the
// X-Amzn-ErrorType header): the real SDK signs, sends and decodes against
// it.
type converseDouble struct {
	srv *httptest.Server

	mu       sync.Mutex
	calls    int
	models   []string
	bodies   []map[string]any
	auth     []string
	status   int
	errType  string
	errBody  string
	response string
	// hang makes every call wait until the client gives up (or the test
	// ends: release).
	hang    bool
	release chan struct{}
}

func newDouble(t *testing.T) *converseDouble {
	t.Helper()
	d := &converseDouble{response: okResponse("Fresh copy", "end_turn"), release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /model/{modelId}/converse", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Errorf("request body %q: %v", raw, err)
		}
		d.mu.Lock()
		d.calls++
		d.models = append(d.models, r.PathValue("modelId"))
		d.bodies = append(d.bodies, body)
		d.auth = append(d.auth, r.Header.Get("Authorization"))
		status, errType, errBody, resp, hang := d.status, d.errType, d.errBody, d.response, d.hang
		d.mu.Unlock()
		if tc, ok := body["toolConfig"].(map[string]any); ok && status == 0 && strings.Contains(resp, `"text":"Fresh copy"`) {
			resp = toolAnswer(t, tc)
		}
		if hang {
			select {
			case <-r.Context().Done():
			case <-d.release:
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if status != 0 {
			if errType != "" {
				w.Header().Set("X-Amzn-ErrorType", errType+":http://internal.amazon.com/coral/com.amazon.bedrock/")
			}
			w.WriteHeader(status)
			io.WriteString(w, errBody)
			return
		}
		io.WriteString(w, resp)
	})
	d.srv = httptest.NewServer(mux)
	t.Cleanup(d.srv.Close)
	t.Cleanup(func() { close(d.release) }) // runs first
	return d
}

func (d *converseDouble) fail(status int, errType, message string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.status, d.errType = status, errType
	d.errBody = `{"message":` + jsonString(message) + `}`
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func okResponse(text, stop string) string {
	return `{"output":{"message":{"role":"assistant","content":[{"text":` + jsonString(text) + `}]}},` +
		`"stopReason":"` + stop + `",` +
		`"usage":{"inputTokens":12,"outputTokens":7,"totalTokens":23,"cacheReadInputTokens":4},` +
		`"metrics":{"latencyMs":210}}`
}

// toolAnswer is the double's answer to a request that forces the answer tool: a toolUse whose input has a valid
// value for each column of the tool's input schema, as a model held to the tool gives.
func toolAnswer(t *testing.T, toolConfig map[string]any) string {
	tools, _ := toolConfig["tools"].([]any)
	if len(tools) != 1 {
		t.Errorf("toolConfig has %d tools, want the answer tool", len(tools))
		return okResponse("no tool", "end_turn")
	}
	spec, _ := tools[0].(map[string]any)["toolSpec"].(map[string]any)
	inputSchema, _ := spec["inputSchema"].(map[string]any)
	raw, _ := json.Marshal(inputSchema["json"])
	cols, err := schema.ParseJSONSchema(raw)
	if err != nil {
		t.Errorf("the answer tool's input schema %s: %v", raw, err)
		return okResponse("bad schema", "end_turn")
	}
	input := map[string]any{}
	for _, c := range cols {
		switch c.Type {
		case schema.Enum:
			input[c.Name] = c.Values[0]
		case schema.Number, schema.Integer:
			input[c.Name] = 3
		case schema.Boolean:
			input[c.Name] = true
		case schema.Date:
			input[c.Name] = "2026-12-01"
		case schema.List:
			input[c.Name] = []string{"a"}
		default:
			input[c.Name] = "Fresh copy"
		}
	}
	in, _ := json.Marshal(input)
	return `{"output":{"message":{"role":"assistant","content":[{"toolUse":{"toolUseId":"tu-1","name":` + jsonString(fmt.Sprint(spec["name"])) +
		`,"input":` + string(in) + `}}]}},"stopReason":"tool_use","usage":{"inputTokens":40,"outputTokens":12,"totalTokens":52}}`
}

// provider drives the double through the real SDK client: static
// credentials, the double as BaseEndpoint.
func (d *converseDouble) provider(t *testing.T, model string) *bedrockllm.Provider {
	t.Helper()
	awsCfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""),
	}
	cfg := bedrockllm.Config{Model: model, Region: "eu-west-1", BaseURL: d.srv.URL, Timeout: 5 * time.Second}
	p, err := bedrockllm.New(bedrockllm.NewClient(awsCfg, cfg), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ptr[T any](v T) *T { return &v }

func TestGenerate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		model     string
		req       llm.Request
		wantModel string
		wantBody  map[string]any
	}{
		{
			name:      "prompt only",
			model:     "amazon.nova-lite-v1:0",
			req:       llm.Request{Prompt: "为积木写文案"},
			wantModel: "amazon.nova-lite-v1:0",
			wantBody:  map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"text": "为积木写文案"}}}}},
		},
		{
			name:      "system prompt and every setting; the request's model wins",
			model:     "amazon.nova-lite-v1:0",
			req:       llm.Request{Model: "us.anthropic.claude-3-5-haiku-20241022-v1:0", System: "Be brief.", Prompt: "p", Temperature: ptr(0.5), TopP: ptr(0.25), MaxTokens: 300},
			wantModel: "us.anthropic.claude-3-5-haiku-20241022-v1:0",
			wantBody: map[string]any{
				"messages":        []any{map[string]any{"role": "user", "content": []any{map[string]any{"text": "p"}}}},
				"system":          []any{map[string]any{"text": "Be brief."}},
				"inferenceConfig": map[string]any{"temperature": 0.5, "topP": 0.25, "maxTokens": 300.0},
			},
		},
		{
			name:      "an inference profile ARN travels escaped in the path",
			model:     "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123",
			req:       llm.Request{Prompt: "p"},
			wantModel: "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123",
			wantBody:  map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"text": "p"}}}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDouble(t)
			resp, err := d.provider(t, tc.model).Generate(context.Background(), tc.req)
			if err != nil {
				t.Fatalf("Generate: %v", err)
			}
			// Bedrock counts cache reads apart from inputTokens; Usage
			// includes them.
			want := llm.Response{Text: "Fresh copy", Usage: llm.Usage{InputTokens: 16, OutputTokens: 7, CachedInputTokens: 4}}
			if diff := cmp.Diff(want, resp); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{tc.wantModel}, d.models); diff != "" {
				t.Errorf("model in path (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantBody, d.bodies[0]); diff != "" {
				t.Errorf("request body (-want +got):\n%s", diff)
			}
			// Signed with SigV4 for bedrock in the configured region, from
			// the credentials given: no key of our own.
			if a := d.auth[0]; !strings.HasPrefix(a, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") || !strings.Contains(a, "/eu-west-1/bedrock/aws4_request") {
				t.Errorf("Authorization = %q, want SigV4 for bedrock in eu-west-1", a)
			}
		})
	}
}

func TestGenerateErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		status    int
		errType   string
		message   string
		response  string // a 200 answer instead of an error
		wantClass llm.ErrorClass
		wantMsg   string
	}{
		{name: "throttled", status: 429, errType: "ThrottlingException", message: "Too many requests, please wait before trying again.", wantClass: llm.ClassRateLimited},
		{name: "service quota", status: 400, errType: "ServiceQuotaExceededException", message: "Your request exceeds the service quota for your account.", wantClass: llm.ClassRateLimited},
		{name: "model not ready", status: 429, errType: "ModelNotReadyException", message: "Model is not ready", wantClass: llm.ClassRateLimited},
		{name: "validation", status: 400, errType: "ValidationException", message: "Malformed input request: temperature must be <= 1", wantClass: llm.ClassBadRequest},
		{name: "prompt too long", status: 400, errType: "ValidationException", message: "Input is too long for requested model.", wantClass: llm.ClassPromptTooLong},
		{name: "access denied stops the job", status: 403, errType: "AccessDeniedException", message: "You don't have access to the model with the specified model ID.", wantClass: llm.ClassAuth},
		{name: "unknown credentials", status: 403, errType: "UnrecognizedClientException", message: "The security token included in the request is invalid.", wantClass: llm.ClassAuth},
		{name: "no such model", status: 404, errType: "ResourceNotFoundException", message: "Model not found", wantClass: llm.ClassBadRequest},
		{name: "service unavailable", status: 503, errType: "ServiceUnavailableException", message: "Service unavailable", wantClass: llm.ClassServer},
		{name: "model timeout", status: 408, errType: "ModelTimeoutException", message: "Model has timed out", wantClass: llm.ClassTimeout},
		{name: "internal error", status: 500, errType: "InternalServerException", message: "Internal error", wantClass: llm.ClassServer},
		{name: "model error", status: 424, errType: "ModelErrorException", message: "The model returned an error", wantClass: llm.ClassServer},
		{name: "an unnamed 502 from a proxy", status: 502, message: "bad gateway", wantClass: llm.ClassServer},
		{name: "guardrail", response: okResponse("Sorry, the model cannot answer this question.", "guardrail_intervened"), wantClass: llm.ClassContentFilter, wantMsg: "guardrail_intervened"},
		{name: "content filter", response: okResponse("", "content_filtered"), wantClass: llm.ClassContentFilter, wantMsg: "content_filtered"},
		{name: "context window", response: okResponse("", "model_context_window_exceeded"), wantClass: llm.ClassPromptTooLong},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDouble(t)
			if tc.response != "" {
				d.response = tc.response
			} else {
				d.fail(tc.status, tc.errType, tc.message)
			}
			_, err := d.provider(t, "amazon.nova-lite-v1:0").Generate(context.Background(), llm.Request{Prompt: "p"})
			var e *llm.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T), want *llm.Error", err, err)
			}
			if e.Class != tc.wantClass {
				t.Errorf("class = %s, want %s (error: %v)", e.Class, tc.wantClass, e)
			}
			if tc.status != 0 && e.StatusCode != tc.status {
				t.Errorf("status = %d, want %d", e.StatusCode, tc.status)
			}
			wantMsg := tc.wantMsg
			if wantMsg == "" {
				wantMsg = tc.message
			}
			if !strings.Contains(e.Error(), wantMsg) {
				t.Errorf("error %q does not carry %q", e.Error(), wantMsg)
			}
			if d.calls != 1 {
				t.Errorf("%d calls, want 1: the SDK must not retry (the pipeline does)", d.calls)
			}
		})
	}
}

func TestGenerateTimeoutAndCancel(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")}
	cfg := bedrockllm.Config{Model: "amazon.nova-lite-v1:0", BaseURL: srv.URL, Timeout: 50 * time.Millisecond}
	p, err := bedrockllm.New(bedrockllm.NewClient(awsCfg, cfg), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Generate(context.Background(), llm.Request{Prompt: "p"})
	if e := llm.Classify(err); e.Class != llm.ClassTimeout {
		t.Errorf("slow call: class %s (%v), want timeout", e.Class, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = p.Generate(ctx, llm.Request{Prompt: "p"})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v, want context.Canceled", err)
	}
}

func TestGenerateNeedsModel(t *testing.T) {
	t.Parallel()
	d := newDouble(t)
	_, err := d.provider(t, "").Generate(context.Background(), llm.Request{Prompt: "p"})
	if e := llm.Classify(err); e.Class != llm.ClassBadRequest || !strings.Contains(e.Error(), "no model") {
		t.Errorf("error %v, want bad_request naming the missing model", err)
	}
	if d.calls != 0 {
		t.Errorf("%d calls without a model", d.calls)
	}
}

// TestColumnsForceTheAnswerTool: a request with columns offers one tool whose input schema is the columns and
// forces it; the tool's input is the answer (text beside it ignored), and a re-ask carries the earlier answer and
// the follow-up as the conversation.
func TestColumnsForceTheAnswerTool(t *testing.T) {
	t.Parallel()
	d := newDouble(t)
	d.response = `{"output":{"message":{"role":"assistant","content":[{"text":"Here you go."},` +
		`{"toolUse":{"toolUseId":"tu-1","name":"answer","input":{"category":"数码","price":12.5}}}]}},` +
		`"stopReason":"tool_use","usage":{"inputTokens":30,"outputTokens":9,"totalTokens":39}}`
	cols := schema.Columns{{Name: "category", Type: schema.Enum, Values: []string{"家居", "数码"}, Required: true}, {Name: "price", Type: schema.Number}}
	req := llm.Request{Prompt: "为耳机归类", Columns: cols,
		Corrections: []llm.Correction{{Answer: `{"category":"玩具"}`, FollowUp: "That answer does not fit"}}}
	resp, err := d.provider(t, "anthropic.claude").Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if norm, err := cols.Validate(resp.Text); err != nil || norm != `{"category":"数码","price":12.5}` {
		t.Errorf("answer %s: %s, %v", resp.Text, norm, err)
	}
	body := d.bodies[0]
	tools := body["toolConfig"].(map[string]any)
	choice, _ := json.Marshal(tools["toolChoice"])
	spec, _ := json.Marshal(tools["tools"])
	if string(choice) != `{"tool":{"name":"answer"}}` || !strings.Contains(string(spec), `"inputSchema":{"json":{"additionalProperties":false`) ||
		!strings.Contains(string(spec), `"enum":["家居","数码"]`) {
		t.Errorf("toolConfig %s %s", choice, spec)
	}
	msgs, _ := json.Marshal(body["messages"])
	want := `[{"content":[{"text":"为耳机归类"}],"role":"user"},{"content":[{"text":"{\"category\":\"玩具\"}"}],"role":"assistant"},` +
		`{"content":[{"text":"That answer does not fit"}],"role":"user"}]`
	if string(msgs) != want {
		t.Errorf("messages\n got %s\nwant %s", msgs, want)
	}
}
