package llm_test

import (
	"fmt"
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

// TestRefusesFeature: only a bad request that names the feature is a
// refusal of that feature; any other failure, or a bad request about
// something else, must not make an adapter drop structured outputs.
func TestRefusesFeature(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"names it", &llm.Error{Class: llm.ClassBadRequest, Message: "Invalid parameter: 'response_format' of type 'json_schema' is not supported"}, true},
		{"names it in other case", &llm.Error{Class: llm.ClassBadRequest, Message: "Structured Outputs are not available for this model"}, true},
		{"wrapped", fmt.Errorf("row 7: %w", &llm.Error{Class: llm.ClassBadRequest, Message: "json_schema unsupported"}), true},
		{"bad request about something else", &llm.Error{Class: llm.ClassBadRequest, Message: "max_tokens too large"}, false},
		{"names it but is a server error", &llm.Error{Class: llm.ClassServer, Message: "response_format handler crashed"}, false},
		{"not an llm.Error", fmt.Errorf("response_format"), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		if got := llm.RefusesFeature(tt.err, "response_format", "json_schema", "structured output"); got != tt.want {
			t.Errorf("%s: RefusesFeature(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
