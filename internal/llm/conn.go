package llm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"syscall"
	"time"
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
