package openaillm_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/llmtest"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
)

// TestBatchContract runs the provider batch suite against the mock's
// Batch API, through the adapter's Files and Batches calls.
func TestBatchContract(t *testing.T) {
	llmtest.RunBatch(t, func(t *testing.T, expire bool) (llm.BatchProvider, *clock.Fake) {
		clk := clock.NewFake(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
		srv := httptest.NewServer(mockserver.New(mockserver.Config{Clock: clk, BatchDelay: time.Hour, BatchExpire: expire}))
		t.Cleanup(srv.Close)
		p, err := openaillm.New(openaillm.Config{Conn: llm.Conn{BaseURL: srv.URL + "/v1", APIKey: "sk-batch", Model: "gpt-4o-mini"}})
		if err != nil {
			t.Fatal(err)
		}
		return p, clk
	})
}
