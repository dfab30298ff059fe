package anthropicllm_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/batchgen/batchgen/internal/llm"
	anthropicllm "github.com/batchgen/batchgen/internal/llm/anthropic"
	"github.com/batchgen/batchgen/internal/llm/llmtest"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestContract runs the provider conformance suite against a server that
// answers in the Messages API's wire format.
func TestContract(t *testing.T) {
	llmtest.Run(t, func(t *testing.T, b llmtest.Behavior) llm.Provider {
		// release ends a hanging handler at cleanup (before the server
		// closes), whether or not the client dropped the connection.
		release := make(chan struct{})
		mock := mockserver.New(mockserver.Config{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if b == llmtest.Answer && bytes.Contains(body, []byte(`"output_config"`)) {
				// An answer of the columns' shape, built by the mock from
				// the schema the request carries.
				r.Body = io.NopCloser(bytes.NewReader(body))
				mock.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			answer := func(stop, text string) {
				io.WriteString(w, `{"id":"msg_c","type":"message","role":"assistant","model":"contract-model",`+
					`"content":[{"type":"text","text":"`+text+`"}],"stop_reason":"`+stop+`","stop_sequence":null,`+
					`"usage":{"input_tokens":21,"output_tokens":9}}`)
			}
			fail := func(status int, typ string) {
				w.WriteHeader(status)
				io.WriteString(w, `{"type":"error","error":{"type":"`+typ+`","message":"scripted `+string(b)+`"}}`)
			}
			switch b {
			case llmtest.Answer:
				answer("end_turn", "拼出想象力。")
			case llmtest.Filter:
				answer("refusal", "")
			case llmtest.Throttle:
				fail(http.StatusTooManyRequests, "rate_limit_error")
			case llmtest.Overload:
				fail(529, "overloaded_error")
			case llmtest.Reject:
				fail(http.StatusBadRequest, "invalid_request_error")
			case llmtest.Deny:
				fail(http.StatusUnauthorized, "authentication_error")
			case llmtest.Hang:
				select {
				case <-r.Context().Done():
				case <-release:
				}
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) }) // runs first
		p, err := anthropicllm.New(anthropicllm.Config{Conn: llm.Conn{BaseURL: srv.URL, APIKey: "sk-ant-contract", Model: "contract-model"}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	})
}
