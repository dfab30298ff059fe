package samstack

import (
	"bytes"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// capture is an aws.HTTPClient that keeps the request it is given.
type capture struct{ got *http.Request }

func (c *capture) Do(r *http.Request) (*http.Response, error) {
	c.got = r
	return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
}

// TestEmulatorRequestsGoWhole: a request body the transport cannot see in
// memory (as the SDK's) is handed on as one it can, so that headers and
// body go out in one write, and can be read again for a retry; a body
// over the bound, or none, is handed on as it is.
func TestEmulatorRequestsGoWhole(t *testing.T) {
	const body = `{"QueueUrl":"http://x/q"}`
	var next capture
	c := emulatorHTTPClient{&next}
	r, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", opaque{strings.NewReader(body)})
	if err != nil {
		t.Fatal(err)
	}
	r.ContentLength = int64(len(body))
	if _, err := c.Do(r); err != nil {
		t.Fatal(err)
	}
	if reflect.TypeOf(next.got.Body) != reflect.TypeOf(io.NopCloser(bytes.NewReader(nil))) {
		t.Errorf("body handed on is %T, not io.NopCloser of a *bytes.Reader, which net/http writes with the headers", next.got.Body)
	}
	if b, _ := io.ReadAll(next.got.Body); string(b) != body {
		t.Errorf("body handed on = %q, want %q", b, body)
	}
	again, err := next.got.GetBody()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(again); string(b) != body {
		t.Errorf("GetBody = %q, want %q", b, body)
	}

	big := strings.Repeat("x", maxInMemoryBody+1)
	large := opaque{strings.NewReader(big)}
	r, _ = http.NewRequest(http.MethodPut, "http://127.0.0.1:1/", large)
	r.ContentLength = int64(len(big))
	if _, err := c.Do(r); err != nil {
		t.Fatal(err)
	}
	if next.got.Body != io.ReadCloser(large) {
		t.Error("a body over the bound was read into memory")
	}
}

// opaque is a request body net/http cannot see the length of in memory,
// as the SDK's.
type opaque struct{ io.Reader }

func (opaque) Close() error { return nil }
