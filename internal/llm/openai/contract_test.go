package openaillm_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/llmtest"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
)

// TestContract runs the provider conformance suite against a server that
// answers in OpenAI's wire format.
func TestContract(t *testing.T) {
	llmtest.Run(t, func(t *testing.T, b llmtest.Behavior) llm.Provider {
		// release ends a hanging handler at cleanup (before the server
		// closes), whether or not the client dropped the connection.
		release := make(chan struct{})
		mock := mockserver.New(mockserver.Config{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if b == llmtest.Answer && bytes.Contains(body, []byte(`"response_format"`)) {
				// An answer of the columns' shape, built by the mock from
				// the schema the request carries.
				r.Body = io.NopCloser(bytes.NewReader(body))
				mock.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			answer := func(finish string) {
				io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"contract-model",`+
					`"choices":[{"index":0,"message":{"role":"assistant","content":"拼出想象力。"},"finish_reason":"`+finish+`"}],`+
					`"usage":{"prompt_tokens":21,"completion_tokens":9,"total_tokens":30}}`)
			}
			fail := func(status int, typ, code string) {
				w.WriteHeader(status)
				io.WriteString(w, `{"error":{"message":"scripted `+string(b)+`","type":"`+typ+`","param":null,"code":"`+code+`"}}`)
			}
			switch b {
			case llmtest.Answer:
				answer("stop")
			case llmtest.Filter:
				answer("content_filter")
			case llmtest.Throttle:
				fail(http.StatusTooManyRequests, "requests", "rate_limit_exceeded")
			case llmtest.Overload:
				fail(http.StatusServiceUnavailable, "server_error", "")
			case llmtest.Reject:
				fail(http.StatusBadRequest, "invalid_request_error", "invalid_value")
			case llmtest.Deny:
				fail(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key")
			case llmtest.Hang:
				select {
				case <-r.Context().Done():
				case <-release:
				}
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) }) // runs first
		p, err := openaillm.New(openaillm.Config{Conn: llm.Conn{BaseURL: srv.URL + "/v1", APIKey: "sk-contract", Model: "contract-model"}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	})
}
