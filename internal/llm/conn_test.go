package llm_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
)

// TestConnOpenFillsTheDefaults: what every HTTP adapter gets when its
// Config leaves a field empty, and the refusal of a base URL that is no
// absolute http(s) URL, its key hidden.
func TestConnOpenFillsTheDefaults(t *testing.T) {
	t.Parallel()
	c, err := llm.Conn{}.Open("openai", "https://api.example.com/v1")
	if err != nil {
		t.Fatal(err)
	}
	if c.BaseURL != "https://api.example.com/v1" || c.HTTPClient == nil || c.Clock == nil || c.Logger == nil {
		t.Errorf("Open left a default unset: %+v", c)
	}
	_, err = llm.Conn{BaseURL: "ftp://user:secret@host/x"}.Open("anthropic", "https://api.example.com")
	if err == nil || !strings.Contains(err.Error(), "anthropic base URL") || strings.Contains(err.Error(), "secret") {
		t.Errorf("Open of an ftp URL: %v, want a refusal naming the provider without the password", err)
	}
}

// TestConnErrorMessage: the message of an error answer, as every adapter
// shows it.
func TestConnErrorMessage(t *testing.T) {
	t.Parallel()
	c := llm.Conn{APIKey: "sk-secret-123"}
	tests := []struct {
		status       int
		tag, message string
		want         string
	}{
		{429, "rate_limit_exceeded", "Slow down", "Slow down (rate_limit_exceeded)"},
		{429, "rate_limit_exceeded", "rate_limit_exceeded: slow down", "rate_limit_exceeded: slow down"},
		{502, "", "  ", "502 Bad Gateway"},
	}
	for _, tc := range tests {
		if got := c.ErrorMessage(tc.status, tc.tag, tc.message); got != tc.want {
			t.Errorf("ErrorMessage(%d, %q, %q) = %q, want %q", tc.status, tc.tag, tc.message, got, tc.want)
		}
	}
	if got := c.ErrorMessage(401, "", "bad key sk-secret-123"); !strings.HasPrefix(got, "bad key") || strings.Contains(got, "sk-secret-123") {
		t.Errorf("ErrorMessage of a message with the key: %q, want it without the key", got)
	}
}

// TestConnModelFor: the request's model wins, the Config's is the
// default, and neither is a bad request naming the provider.
func TestConnModelFor(t *testing.T) {
	t.Parallel()
	c := llm.Conn{Model: "default-1"}
	if m, err := c.ModelFor(llm.Request{Model: "asked-2"}, "OpenAI"); m != "asked-2" || err != nil {
		t.Errorf("ModelFor a request with a model: %q, %v", m, err)
	}
	if m, err := c.ModelFor(llm.Request{}, "OpenAI"); m != "default-1" || err != nil {
		t.Errorf("ModelFor a request without: %q, %v", m, err)
	}
	var le *llm.Error
	if _, err := (llm.Conn{}).ModelFor(llm.Request{}, "Anthropic"); !errors.As(err, &le) || le.Class != llm.ClassBadRequest || !strings.Contains(le.Message, "Anthropic") {
		t.Errorf("ModelFor with no model anywhere: %v, want a bad request naming Anthropic", err)
	}
}

// TestConnFailure: an answer with an error status the SDK could not
// decode is classed by its status; a call that ran out of its timeout is
// a timeout.
func TestConnFailure(t *testing.T) {
	t.Parallel()
	c := llm.Conn{Timeout: time.Millisecond}
	fromStatus := func(status int, _ http.Header) *llm.Error {
		return &llm.Error{Class: llm.ClassOfStatus(status), StatusCode: status}
	}
	resp := &http.Response{StatusCode: http.StatusBadGateway}
	var le *llm.Error
	if err := c.Failure(context.Background(), context.Background(), errors.New("decode"), resp, "call", fromStatus); !errors.As(err, &le) || le.Class != llm.ClassServer || le.StatusCode != 502 {
		t.Errorf("Failure of an undecodable 502: %v", err)
	}
	callCtx, cancel := c.CallContext(context.Background())
	defer cancel()
	<-callCtx.Done()
	if err := c.Failure(context.Background(), callCtx, callCtx.Err(), nil, "call", fromStatus); !errors.As(err, &le) || le.Class != llm.ClassTimeout {
		t.Errorf("Failure of a call past its timeout: %v", err)
	}
}
