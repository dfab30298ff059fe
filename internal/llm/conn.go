package llm

import (
	"errors"
	"io"
	"syscall"
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
