package lambdafn

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
)

// HTTP serves an http.Handler to API Gateway HTTP API events (payload
// format 2.0), so the same handler runs under net/http locally and behind
// API Gateway. Request bodies arrive decoded; response bodies that are not
// UTF-8 text go back base64-encoded.
type HTTP struct {
	Handler http.Handler
	Logger  *slog.Logger
}

type requestContextKey struct{}

// APIGatewayRequestContext returns the API Gateway request context (route,
// request id, JWT claims) of a request served through HTTP.
func APIGatewayRequestContext(ctx context.Context) (events.APIGatewayV2HTTPRequestContext, bool) {
	rc, ok := ctx.Value(requestContextKey{}).(events.APIGatewayV2HTTPRequestContext)
	return rc, ok
}

// Handle serves one request. It never returns an error: API Gateway would
// turn that into a bare 500, while the handler's own answer is better.
func (h *HTTP) Handle(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	req, err := NewHTTPRequest(ctx, ev)
	if err != nil {
		discard(h.Logger).Warn("malformed API Gateway event", "request_id", ev.RequestContext.RequestID, "error", err)
		return events.APIGatewayV2HTTPResponse{
			StatusCode: http.StatusBadRequest,
			Headers:    map[string]string{"Content-Type": "application/json; charset=utf-8"},
			Body:       `{"error":{"code":"bad_request","message":"malformed request"}}` + "\n",
		}, nil
	}
	w := NewResponseRecorder()
	h.Handler.ServeHTTP(w, req)
	return w.Response(), nil
}

// NewHTTPRequest converts an API Gateway v2 event into a server-side
// *http.Request carrying ctx and, for APIGatewayRequestContext, the event's
// request context.
func NewHTTPRequest(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (*http.Request, error) {
	method := ev.RequestContext.HTTP.Method
	if method == "" {
		return nil, fmt.Errorf("event has no requestContext.http.method")
	}
	rawPath := ev.RawPath
	if rawPath == "" {
		rawPath = "/"
	}
	target := rawPath
	if ev.RawQueryString != "" {
		target += "?" + ev.RawQueryString
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, fmt.Errorf("event path %q: %w", target, err)
	}
	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		if body, err = base64.StdEncoding.DecodeString(ev.Body); err != nil {
			return nil, fmt.Errorf("event body: base64: %w", err)
		}
	}
	ctx = context.WithValue(ctx, requestContextKey{}, ev.RequestContext)
	req, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	// A server-side request: the fields net/http's server would set.
	req.URL = u
	req.RequestURI = u.RequestURI()
	req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/1.1", 1, 1
	if p := ev.RequestContext.HTTP.Protocol; p != "" {
		if major, minor, ok := http.ParseHTTPVersion(p); ok {
			req.Proto, req.ProtoMajor, req.ProtoMinor = p, major, minor
		}
	}
	// Header values with several occurrences arrive joined by commas,
	// which is equivalent for every header the API reads.
	for k, v := range ev.Headers {
		req.Header.Set(k, v)
	}
	if len(ev.Cookies) > 0 {
		req.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}
	req.ContentLength = int64(len(body))
	req.Host = req.Header.Get("Host")
	if req.Host == "" {
		req.Host = ev.RequestContext.DomainName
	}
	if ip := ev.RequestContext.HTTP.SourceIP; ip != "" {
		req.RemoteAddr = net.JoinHostPort(ip, "0")
	}
	return req, nil
}

// ResponseRecorder is an http.ResponseWriter that buffers a response for
// API Gateway.
type ResponseRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

// NewResponseRecorder returns an empty recorder.
func NewResponseRecorder() *ResponseRecorder {
	return &ResponseRecorder{header: http.Header{}}
}

// Header returns the response headers.
func (r *ResponseRecorder) Header() http.Header { return r.header }

// WriteHeader records the status; like net/http, only the first call
// counts, and informational (1xx) statuses are not the response's.
func (r *ResponseRecorder) WriteHeader(status int) {
	if r.status != 0 || status < 200 {
		return
	}
	r.status = status
}

// Write buffers body bytes, implying status 200 if none was set.
func (r *ResponseRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	return r.body.Write(p)
}

// Response converts the recorded response. Set-Cookie headers become
// Cookies; other repeated headers are joined with commas. A body whose
// Content-Type is not text, or that is not valid UTF-8, is base64-encoded.
func (r *ResponseRecorder) Response() events.APIGatewayV2HTTPResponse {
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	body := r.body.Bytes()
	if r.header.Get("Content-Type") == "" && len(body) > 0 {
		r.header.Set("Content-Type", http.DetectContentType(body))
	}
	resp := events.APIGatewayV2HTTPResponse{StatusCode: status, Headers: map[string]string{}}
	for k, vs := range r.header {
		if k == "Set-Cookie" {
			resp.Cookies = append(resp.Cookies, vs...)
			continue
		}
		resp.Headers[k] = strings.Join(vs, ",")
	}
	if _, ok := resp.Headers["Content-Length"]; !ok && len(body) > 0 {
		resp.Headers["Content-Length"] = strconv.Itoa(len(body))
	}
	if isText(r.header.Get("Content-Type")) && utf8.Valid(body) {
		resp.Body = string(body)
	} else {
		resp.Body = base64.StdEncoding.EncodeToString(body)
		resp.IsBase64Encoded = true
	}
	return resp
}

// isText reports whether a Content-Type names a textual body that API
// Gateway can carry as a JSON string.
func isText(contentType string) bool {
	if contentType == "" {
		return true // no body
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	switch {
	case strings.HasPrefix(mt, "text/"),
		strings.HasSuffix(mt, "+json"), strings.HasSuffix(mt, "+xml"):
		return true
	}
	switch mt {
	case "application/json", "application/javascript", "application/xml", "application/x-www-form-urlencoded", "image/svg+xml":
		return true
	}
	return false
}
