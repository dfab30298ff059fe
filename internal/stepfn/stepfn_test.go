package stepfn

import (
	"errors"
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/pipeline"
)

var _ pipeline.ExportStarter = Starter{}

func TestCheckName(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{"task id", "3f1a9c0e5b7d2a4c6e8f", false},
		{"dashes and dots", "task-1.retry_2", false},
		{"unicode", "任务-1", false},
		{"80 characters", strings.Repeat("a", 80), false},
		{"empty", "", true},
		{"81 characters", strings.Repeat("a", 81), true},
		{"space", "a b", true},
		{"slash", "a/b", true},
		{"colon", "a:b", true},
		{"hash", "TASK#1", true},
		{"control", "a\x01b", true},
		{"tab", "a\tb", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkName(tt.in)
			if got := err != nil; got != tt.wantErr {
				t.Fatalf("checkName(%q) = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalidName) {
				t.Errorf("checkName(%q) = %v, want %v", tt.in, err, ErrInvalidName)
			}
		})
	}
}

func TestStartExportRejectsInvalidName(t *testing.T) {
	// Refused before any call: a nil client is never touched.
	err := Starter{StateMachineARN: "arn:aws:states:us-east-1:123456789012:stateMachine:x"}.StartExport(t.Context(), "bad/name", 0)
	if !errors.Is(err, ErrInvalidName) {
		t.Errorf("StartExport(bad/name) = %v, want %v", err, ErrInvalidName)
	}
}
