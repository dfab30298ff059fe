package llm_test

import (
	"testing"

	"github.com/batchgen/batchgen/internal/llm"
)

// TestClassOfStatus: the status mapping every provider adapter starts
// from, and what each class means for the row and the provider.
func TestClassOfStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status           int
		want             llm.ErrorClass
		retryable, fatal bool
	}{
		{429, llm.ClassRateLimited, true, false},
		{408, llm.ClassTimeout, true, false},
		{401, llm.ClassAuth, false, true},
		{403, llm.ClassAuth, false, true},
		{413, llm.ClassPromptTooLong, false, false},
		{400, llm.ClassBadRequest, false, false},
		{404, llm.ClassBadRequest, false, false},
		{422, llm.ClassBadRequest, false, false},
		{500, llm.ClassServer, true, false},
		{503, llm.ClassServer, true, false},
		{529, llm.ClassServer, true, false},
		{302, llm.ClassServer, true, false},
	}
	for _, tc := range tests {
		got := llm.ClassOfStatus(tc.status)
		if got != tc.want || got.Retryable() != tc.retryable || got.Fatal() != tc.fatal {
			t.Errorf("HTTP %d: %s (retryable %v, fatal %v), want %s (%v, %v)", tc.status, got, got.Retryable(), got.Fatal(), tc.want, tc.retryable, tc.fatal)
		}
	}
}
