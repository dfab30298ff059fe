package openaillm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
	"github.com/batchgen/batchgen/internal/schema"
)

var shape = schema.Columns{
	{Name: "category", Type: schema.Enum, Values: []string{"家居", "数码"}, Required: true},
	{Name: "price", Type: schema.Number},
	{Name: "in_stock", Type: schema.Boolean, Required: true},
	{Name: "summary", Type: schema.Text, Required: true},
}

// TestStructuredOutputs: a request with columns asks for strict structured outputs, and the mock's answer, built
// from the schema that arrived, passes the columns' check and quotes the row's prompt.
func TestStructuredOutputs(t *testing.T) {
	t.Parallel()
	mock, p := newMock(t, mockserver.Config{})
	resp, err := p.Generate(context.Background(), llm.Request{Prompt: "为保温杯归类", Columns: shape})
	if err != nil {
		t.Fatal(err)
	}
	norm, err := shape.Validate(resp.Text)
	if err != nil {
		t.Fatalf("answer %s: %v", resp.Text, err)
	}
	if !strings.Contains(norm, "summary for: 为保温杯归类") {
		t.Errorf("answer %s does not quote the prompt", norm)
	}
	if st := mock.Stats(); st.Structured != 1 || st.BadRequests != 0 || p.JSONMode() {
		t.Errorf("stats %+v, JSON mode %v: want one structured answer in json_schema mode", st, p.JSONMode())
	}
}

// TestFallsBackToJSONMode: a server that refuses json_schema is learned once, said in the log, and asked in JSON
// mode from then on, with the schema in the messages; the answers still fit.
func TestFallsBackToJSONMode(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	mock, p := newMock(t, mockserver.Config{NoStructuredOutputs: true}, func(c *openaillm.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
	})
	for i := range 3 {
		resp, err := p.Generate(context.Background(), llm.Request{Prompt: "row " + string(rune('a'+i)), Columns: shape})
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if _, err := shape.Validate(resp.Text); err != nil {
			t.Fatalf("call %d: answer %s: %v", i+1, resp.Text, err)
		}
	}
	if st := mock.Stats(); st.BadRequests != 1 || st.Structured != 3 {
		t.Errorf("stats %+v: want one refusal, then three JSON-mode answers", st)
	}
	if !p.JSONMode() || strings.Count(log.String(), "refused structured outputs") != 1 {
		t.Errorf("JSON mode %v; log:\n%s", p.JSONMode(), log.String())
	}
	// A request without columns is unaffected.
	resp, err := p.Generate(context.Background(), llm.Request{Prompt: "plain"})
	if err != nil || resp.Text != "Copy for: plain" {
		t.Errorf("plain request: %q, %v", resp.Text, err)
	}
}

// TestCorrectionsAreTheConversation: a re-ask carries the earlier answer as the assistant's and the follow-up as
// the user's, after the row's question; the mock keys the call by that question, and a broken answer fails the
// check.
func TestCorrectionsAreTheConversation(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{InvalidRate: 1})
	var mu sync.Mutex
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		mock.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p, err := openaillm.New(openaillm.Config{Conn: llm.Conn{BaseURL: srv.URL + "/v1", Model: "gpt-mock"}})
	if err != nil {
		t.Fatal(err)
	}
	req := llm.Request{System: "be brief", Prompt: "为耳机归类", Columns: shape}
	resp, err := p.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = shape.Validate(resp.Text)
	var invalid *schema.InvalidAnswerError
	if !errors.As(err, &invalid) {
		t.Fatalf("a broken answer %s passed: %v", resp.Text, err)
	}
	req.Corrections = []llm.Correction{{Answer: resp.Text, FollowUp: shape.FollowUp(invalid)}}
	if _, err := p.Generate(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	var sent struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		ResponseFormat struct {
			Type       string `json:"type"`
			JSONSchema struct {
				Strict bool            `json:"strict"`
				Schema json.RawMessage `json:"schema"`
			} `json:"json_schema"`
		} `json:"response_format"`
	}
	if err := json.Unmarshal(bodies[1], &sent); err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range sent.Messages {
		roles = append(roles, m.Role)
	}
	if strings.Join(roles, ",") != "system,user,assistant,user" || sent.Messages[2].Content != resp.Text ||
		!strings.Contains(sent.Messages[3].Content, "That answer does not fit") {
		t.Errorf("the re-ask's messages: %+v", sent.Messages)
	}
	if sent.ResponseFormat.Type != "json_schema" || !sent.ResponseFormat.JSONSchema.Strict || !bytes.Equal(sent.ResponseFormat.JSONSchema.Schema, shape.JSONSchema()) {
		t.Errorf("response_format %+v", sent.ResponseFormat)
	}
	if st := mock.Stats(); st.PerPrompt["为耳机归类"].Calls != 2 || st.Broken != 2 {
		t.Errorf("stats %+v: want both calls counted for the row's question", st)
	}
}
