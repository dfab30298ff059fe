package bedrockllm_test

import (
	"net/http"
	"testing"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/llmtest"
)

// TestContract runs the provider conformance suite through the real SDK
// against the double of Bedrock's Converse wire format.
func TestContract(t *testing.T) {
	llmtest.Run(t, func(t *testing.T, b llmtest.Behavior) llm.Provider {
		d := newDouble(t)
		switch b {
		case llmtest.Filter:
			d.response = okResponse("Sorry, the model cannot answer this question.", "guardrail_intervened")
		case llmtest.Throttle:
			d.fail(http.StatusTooManyRequests, "ThrottlingException", "Too many requests")
		case llmtest.Overload:
			d.fail(http.StatusServiceUnavailable, "ServiceUnavailableException", "Service unavailable")
		case llmtest.Reject:
			d.fail(http.StatusBadRequest, "ValidationException", "Malformed input request")
		case llmtest.Deny:
			d.fail(http.StatusForbidden, "AccessDeniedException", "You don't have access to the model")
		case llmtest.Hang:
			d.hang = true
		}
		return d.provider(t, "amazon.nova-lite-v1:0")
	})
}
