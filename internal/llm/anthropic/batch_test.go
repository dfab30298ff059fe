package anthropicllm_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	anthropicllm "github.com/batchgen/batchgen/internal/llm/anthropic"
	"github.com/batchgen/batchgen/internal/llm/llmtest"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestBatchContract runs the provider batch suite against the mock's
// Message Batches, through the adapter's SDK calls.
func TestBatchContract(t *testing.T) {
	llmtest.RunBatch(t, func(t *testing.T, expire bool) (llm.BatchProvider, *clock.Fake) {
		clk := clock.NewFake(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
		srv := httptest.NewServer(mockserver.New(mockserver.Config{Clock: clk, BatchDelay: time.Hour, BatchExpire: expire}))
		t.Cleanup(srv.Close)
		p, err := anthropicllm.New(anthropicllm.Config{Conn: llm.Conn{BaseURL: srv.URL, APIKey: "sk-ant-batch", Model: "claude-haiku-4-5"}})
		if err != nil {
			t.Fatal(err)
		}
		return p, clk
	})
}
