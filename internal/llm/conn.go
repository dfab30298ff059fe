package llm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/batchgen/batchgen/internal/clock"
)

// IsConnectionError reports failures of the connection itself (reset,
// refused, aborted, broken pipe, a body cut short), including those that
// surface while a response body is read and are no net.Error. Every
// provider adapter classes them alike: retryable, not the provider's answer.
func IsConnectionError(err error) bool {
	for _, target := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.ECONNABORTED, syscall.EPIPE} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// HTTPClient is the client an HTTP provider adapter sends with when it is
// given none: its connection pool keeps up to 256 idle connections per
// host, because the default of 2 makes every concurrent worker beyond the
// second dial anew.
func HTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 256
	return &http.Client{Transport: t}
}

// CheckBaseURL refuses a base URL that is not an absolute http(s) URL,
// naming the provider; the URL is shown without its query and user info,
// which may carry a key.
func CheckBaseURL(provider, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s base URL %q: want an absolute http or https URL", provider, RedactURL(raw))
	}
	return nil
}

// CallFailure classifies a failed call that brought no error answer the
// adapter could read: ctx is the caller's (its cancel is returned wrapped
// as is, not a row failure), callCtx the call's own with timeout (its end
// is ClassTimeout); anything else is a connection failure or
// llm.Classify's verdict, with key hidden from its text. httpResp, when
// the answer arrived but could not be read, lends its status. what names
// the call in messages ("chat completion").
func CallFailure(ctx, callCtx context.Context, timeout time.Duration, err error, httpResp *http.Response, key, what string) error {
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case errors.Is(callCtx.Err(), context.DeadlineExceeded):
		msg := "model call timed out"
		if ctx.Err() == nil {
			msg = fmt.Sprintf("model call timed out after %v", timeout)
		}
		return &Error{Class: ClassTimeout, Message: msg, Err: callCtx.Err()}
	}
	err = HideKey(err, key)
	var e *Error
	if IsConnectionError(err) {
		e = &Error{Class: ClassConnection, Message: err.Error(), Err: err}
	} else {
		e = Classify(fmt.Errorf("%s: %w", what, err))
	}
	if httpResp != nil && e.StatusCode == 0 {
		// The answer arrived but could not be read or decoded.
		e.StatusCode = httpResp.StatusCode
	}
	return e
}

// Conn is how an HTTP provider adapter reaches its API. Each adapter's
// Config embeds it, so the fields, what they mean and their defaults are
// written once; what differs between adapters (the SDK, its error types,
// the rate-limit headers) stays in the adapter.
type Conn struct {
	// BaseURL is the API root, in the form the adapter's SDK takes it.
	// Defaults to the adapter's DefaultBaseURL.
	BaseURL string
	// APIKey is sent as the SDK sends it. It never appears in errors.
	// Empty sends none (local servers).
	APIKey string
	// Model is used when a Request names none.
	Model string
	// Timeout bounds each call; 0 leaves only the caller's ctx. A call that
	// runs out of it fails with ClassTimeout.
	Timeout time.Duration
	// HTTPClient sends the requests. Defaults to HTTPClient().
	HTTPClient *http.Client
	// Clock turns reset times and HTTP-date Retry-After into durations.
	// Defaults to clock.Real.
	Clock clock.Clock
	// Logger says, once, that the model refused structured outputs.
	// Defaults to discarding.
	Logger *slog.Logger
}

// Open returns c with its defaults filled in, defaultBaseURL among them.
// It fails only on a BaseURL that is not an absolute http(s) URL, naming
// provider.
func (c Conn) Open(provider, defaultBaseURL string) (Conn, error) {
	if c.BaseURL == "" {
		c.BaseURL = defaultBaseURL
	}
	if err := CheckBaseURL(provider, c.BaseURL); err != nil {
		return c, err
	}
	if c.HTTPClient == nil {
		c.HTTPClient = HTTPClient()
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// CallContext returns the context one call runs under: ctx bounded by
// Timeout when it is set. The caller defers the cancel.
func (c Conn) CallContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.Timeout > 0 {
		return context.WithTimeout(ctx, c.Timeout)
	}
	return ctx, func() {}
}

// ModelFor returns the model req is sent to: its own, else Model. With
// neither, the row cannot be asked: a ClassBadRequest naming provider.
func (c Conn) ModelFor(req Request, provider string) (string, error) {
	switch {
	case req.Model != "":
		return req.Model, nil
	case c.Model != "":
		return c.Model, nil
	}
	return "", &Error{Class: ClassBadRequest, Message: "no model configured for the " + provider + " provider"}
}

// Clean removes the API key from a provider's message and bounds its length.
func (c Conn) Clean(msg string) string { return CleanMessage(msg, c.APIKey) }

// ErrorMessage is the user-facing message of an error answer: the
// provider's message, else the status and its text, with tag (the
// provider's error code or type, for searching its docs) appended when the
// message does not already name it; cleaned.
func (c Conn) ErrorMessage(status int, tag, message string) string {
	msg := strings.TrimSpace(message)
	if msg == "" {
		msg = strings.TrimSpace(fmt.Sprintf("%d %s", status, http.StatusText(status)))
	}
	if tag != "" && !strings.Contains(msg, tag) {
		msg += " (" + tag + ")"
	}
	return c.Clean(msg)
}

// Failure classifies a failed call whose error is not an error answer the
// SDK decoded (the adapter has looked for its own error type first): an
// answer with an error status the SDK could not decode (a proxy's HTML
// page) is still classed by its status through fromStatus; anything else
// goes to CallFailure. what names the call in messages.
func (c Conn) Failure(ctx, callCtx context.Context, err error, httpResp *http.Response, what string,
	fromStatus func(status int, h http.Header) *Error) error {
	if httpResp != nil && httpResp.StatusCode >= 400 {
		return fromStatus(httpResp.StatusCode, httpResp.Header)
	}
	return CallFailure(ctx, callCtx, c.Timeout, err, httpResp, c.APIKey, what)
}

// ResponseHeader is r's header, nil without a response (an SDK error
// carries the response it decoded, when there was one).
func ResponseHeader(r *http.Response) http.Header {
	if r == nil {
		return nil
	}
	return r.Header
}
