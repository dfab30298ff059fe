package mockserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
)

func messagesBody(prompt string) string {
	return fmt.Sprintf(`{"model":"claude-mock","max_tokens":100,"system":"be brief","messages":[{"role":"user","content":%q}]}`, prompt)
}

// postMessages sends a Messages API request straight to the handler.
func postMessages(s *Server, body string, header ...string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	s.ServeHTTP(rec, r)
	return rec
}

// TestAnthropicAnswers: the Messages API's answer, its usage and its
// rate-limit headers, which llm reads back as the quota in force.
func TestAnthropicAnswers(t *testing.T) {
	clk := clock.NewFake(t0)
	s := New(Config{Quota: 2, TokenQuota: 10_000, Clock: clk})
	rec := postMessages(s, messagesBody("a lamp"))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var msg struct {
		Type       string `json:"type"`
		StopReason string `json:"stop_reason"`
		Content    []struct{ Type, Text string }
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &msg); err != nil {
		t.Fatal(err)
	}
	if msg.Type != "message" || msg.StopReason != "end_turn" || len(msg.Content) != 1 || msg.Content[0].Text != "Copy for: a lamp" {
		t.Errorf("answer %s: want a message with the copy and end_turn", rec.Body)
	}
	if msg.Usage.InputTokens <= 0 || msg.Usage.OutputTokens <= 0 {
		t.Errorf("usage %+v: want tokens both ways", msg.Usage)
	}
	rl := llm.ParseAnthropicRateLimits(rec.Header(), t0)
	if rl.Requests.Limit != 2 || rl.Requests.Remaining != 1 || rl.Requests.Reset != time.Minute || rl.Tokens.Limit != 10_000 {
		t.Errorf("rate limits %+v from %v: want 2 a minute, 1 left, whole in a minute, and the token quota", rl, rec.Header())
	}
	if rec.Header().Get("X-Ratelimit-Limit-Requests") != "" {
		t.Error("OpenAI's headers on an Anthropic answer")
	}
}

// TestAnthropicErrors: each fault in the Messages API's words and status.
func TestAnthropicErrors(t *testing.T) {
	tests := []struct {
		name, body   string
		cfg          Config
		header       []string
		status       int
		typ, message string
	}{
		{"rate limited", messagesBody("b"), Config{Quota: 1}, nil, 429, "rate_limit_error", "Rate limit reached"},
		{"billing", messagesBody("x [[quota]]"), Config{}, nil, 402, "billing_error", "credit balance"},
		{"overloaded", messagesBody("x [[flaky]]"), Config{}, nil, 529, "overloaded_error", "Overloaded"},
		{"server error", messagesBody("x [[5xx]]"), Config{}, nil, 500, "api_error", "Internal server error"},
		{"prompt too long", messagesBody("x [[too_long]]"), Config{}, nil, 400, "invalid_request_error", "prompt is too long"},
		{"filtered", messagesBody("x [[filter]]"), Config{}, nil, 400, "invalid_request_error", "content filtering"},
		{"bad key", messagesBody("x"), Config{RequireAPIKey: "k"}, []string{"X-Api-Key", "nope"}, 401, "authentication_error", "invalid x-api-key"},
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, Config{}, nil, 400, "invalid_request_error", "max_tokens"},
		{"a system turn", `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, Config{}, nil, 400, "invalid_request_error", "messages.0.role"},
		{"no structured outputs", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}}}}`,
			Config{NoStructuredOutputs: true}, nil, 400, "invalid_request_error", "output_config.format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(tt.cfg)
			if tt.cfg.Quota > 0 {
				postMessages(s, messagesBody("a"))
			}
			rec := postMessages(s, tt.body, tt.header...)
			var e struct {
				Type  string `json:"type"`
				Error struct{ Type, Message string }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
				t.Fatalf("body %s: %v", rec.Body, err)
			}
			if rec.Code != tt.status || e.Type != "error" || e.Error.Type != tt.typ || !strings.Contains(e.Error.Message, tt.message) {
				t.Errorf("%d %s, want %d with error type %s saying %q", rec.Code, rec.Body, tt.status, tt.typ, tt.message)
			}
			if tt.status == 429 && rec.Header().Get("Retry-After") == "" {
				t.Error("a 429 without retry-after")
			}
		})
	}
	// The key as the official SDK sends it is accepted too.
	s := New(Config{RequireAPIKey: "k"})
	if rec := postMessages(s, messagesBody("x"), "Authorization", "Bearer k"); rec.Code != http.StatusOK {
		t.Errorf("bearer key: %d %s", rec.Code, rec.Body)
	}
}

// TestAnthropicRefusal: the output filter marker ends the answer with
// stop_reason refusal and no text.
func TestAnthropicRefusal(t *testing.T) {
	rec := postMessages(New(Config{}), messagesBody("x [[filter_output]]"))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"stop_reason":"refusal"`) || !strings.Contains(rec.Body.String(), `"content":[]`) {
		t.Errorf("%d %s: want a refusal without content", rec.Code, rec.Body)
	}
}

// TestMessageBatchesRefuse: a batch's results are not served before it
// ends, an unknown batch is not found, and ids must be unique.
func TestMessageBatchesRefuse(t *testing.T) {
	clk := clock.NewFake(t0)
	s := New(Config{Clock: clk, BatchDelay: time.Minute})
	do := func(method, path, body string) (int, string) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	params := `{"model":"claude-haiku-4-5","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`
	if code, body := do("POST", "/v1/messages/batches", `{"requests":[{"custom_id":"a","params":`+params+`},{"custom_id":"a","params":`+params+`}]}`); code != 400 || !strings.Contains(body, "used twice") {
		t.Errorf("duplicate ids: %d %s", code, body)
	}
	code, body := do("POST", "/v1/messages/batches", `{"requests":[{"custom_id":"a","params":`+params+`}]}`)
	var b struct{ ID, ProcessingStatus string }
	if err := json.Unmarshal([]byte(strings.Replace(body, "processing_status", "ProcessingStatus", 1)), &b); code != 200 || err != nil || b.ProcessingStatus != "in_progress" {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := do("GET", "/v1/messages/batches/"+b.ID+"/results", ""); code != 400 || !strings.Contains(body, "not ended") {
		t.Errorf("results too early: %d %s", code, body)
	}
	if code, _ := do("GET", "/v1/messages/batches/msgbatch-nope", ""); code != 404 {
		t.Errorf("unknown batch: %d, want 404", code)
	}
	if code, _ := do("GET", "/v1/batches/"+b.ID, ""); code != 404 {
		t.Errorf("a message batch through OpenAI's path: %d, want 404", code)
	}
	clk.Advance(time.Minute)
	if code, body := do("GET", "/v1/messages/batches/"+b.ID+"/results", ""); code != 200 || !strings.Contains(body, `"type":"succeeded"`) {
		t.Errorf("results once ended: %d %s", code, body)
	}
}

// TestMessageBatchesList: the list pages newest first, on by after_id and
// back by before_id, as the SDK's pager walks it; a lost answer's batch is
// in it.
func TestMessageBatchesList(t *testing.T) {
	s := New(Config{Clock: clock.NewFake(t0), BatchDelay: time.Minute, BatchAnswersLost: 1})
	do := func(method, path, body string) (int, string) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	params := `{"model":"claude-haiku-4-5","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`
	for i := range 3 {
		code, _ := do("POST", "/v1/messages/batches", `{"requests":[{"custom_id":"a","params":`+params+`}]}`)
		if want := map[bool]int{true: 502, false: 200}[i == 0]; code != want {
			t.Fatalf("create %d: %d, want %d", i, code, want)
		}
	}
	type page struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
		HasMore bool   `json:"has_more"`
		FirstID string `json:"first_id"`
		LastID  string `json:"last_id"`
	}
	list := func(query string) (page, []string) {
		t.Helper()
		code, body := do("GET", "/v1/messages/batches"+query, "")
		var p page
		if err := json.Unmarshal([]byte(body), &p); code != 200 || err != nil {
			t.Fatalf("list%s: %d %s", query, code, body)
		}
		var ids []string
		for _, d := range p.Data {
			ids = append(ids, d.ID)
		}
		return p, ids
	}
	p1, ids1 := list("?limit=2")
	if len(ids1) != 2 || !p1.HasMore || ids1[0] <= ids1[1] || p1.LastID != ids1[1] {
		t.Fatalf("first page %+v: want the 2 newest, newest first, more to come", p1)
	}
	p2, ids2 := list("?limit=2&after_id=" + p1.LastID)
	if len(ids2) != 1 || p2.HasMore || ids2[0] >= ids1[1] {
		t.Fatalf("second page %+v: want the oldest (the lost answer's) alone", p2)
	}
	if _, back := list("?limit=2&before_id=" + ids2[0]); len(back) != 2 || back[0] != ids1[0] {
		t.Errorf("before_id %s: %v, want the 2 newer ones %v", ids2[0], back, ids1)
	}
	if st := s.Stats(); st.BatchesCreated != 3 {
		t.Errorf("BatchesCreated %d, want 3 (the lost answer's too)", st.BatchesCreated)
	}
	if code, _ := do("GET", "/v1/messages/batches?limit=0", ""); code != 400 {
		t.Errorf("limit 0: %d, want 400", code)
	}
}
