package apifn_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/store"
)

// seen is what the echo handler saw of a request.
type seen struct {
	Method, Path, RawQuery, RequestURI, Host, RemoteAddr, Proto string
	Query                                                       map[string][]string
	ContentType, Authorization                                  string
	Custom, Cookies                                             []string
	Body                                                        string
	ContentLength                                               int64
	RequestID, Sub                                              string
}

func echo(got *seen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		*got = seen{
			Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, RequestURI: r.RequestURI, Host: r.Host,
			RemoteAddr: r.RemoteAddr, Proto: r.Proto, Query: r.URL.Query(),
			ContentType: r.Header.Get("Content-Type"), Authorization: r.Header.Get("Authorization"),
			Custom: r.Header.Values("X-Custom"),
			Body:   string(body), ContentLength: r.ContentLength,
		}
		for _, c := range r.Cookies() {
			got.Cookies = append(got.Cookies, c.Name+"="+c.Value)
		}
		if rc, ok := apifn.APIGatewayRequestContext(r.Context()); ok {
			got.RequestID = rc.RequestID
			if rc.Authorizer != nil && rc.Authorizer.JWT != nil {
				got.Sub = rc.Authorizer.JWT.Claims["sub"]
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func TestHTTPRequest(t *testing.T) {
	t.Parallel()
	const host = "a1b2c3d4e5.execute-api.us-east-1.amazonaws.com"
	tests := []struct {
		name string
		file string
		edit func(*events.APIGatewayV2HTTPRequest)
		want seen
	}{
		{
			name: "GET with a JWT",
			file: "apigw-v2-get-task.json",
			want: seen{
				Method: "GET", Path: "/api/tasks/0123456789abcdef0123456789abcdef", RequestURI: "/api/tasks/0123456789abcdef0123456789abcdef",
				// The adapter gives RemoteAddr the bare source IP, without
				// net/http's ":port".
				Host: host, RemoteAddr: "203.0.113.7", Proto: "HTTP/1.1",
				Query: map[string][]string{}, Authorization: "Bearer eyJraWQiOiJ...",
				RequestID: "YcX9PhZ7IAMEVgA=", Sub: "7f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f8",
			},
		},
		{
			name: "POST with JSON and cookies",
			file: "apigw-v2-post-task.json",
			want: seen{
				Method: "POST", Path: "/api/tasks", RequestURI: "/api/tasks",
				Host: host, RemoteAddr: "203.0.113.7", Proto: "HTTP/1.1",
				Query: map[string][]string{}, ContentType: "application/json", Cookies: []string{"session=abc123", "theme=dark"},
				Authorization: "Bearer eyJraWQiOiJ...",
				Body:          `{"filename": "商品 list.xlsx", "size": 18342, "prompt": "为商品{{商品名称}}写一段营销文案"}`, ContentLength: 107,
				RequestID: "YcYA1hZ8IAMEVhA=", Sub: "7f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f8",
			},
		},
		{
			name: "base64 body, repeated query and header values",
			file: "apigw-v2-list-base64.json",
			want: seen{
				Method: "GET", Path: "/api/tasks", RawQuery: "limit=2&state=RUNNING&state=PARTIAL",
				RequestURI: "/api/tasks?limit=2&state=RUNNING&state=PARTIAL",
				Host:       host, RemoteAddr: "2001:db8::7", Proto: "HTTP/1.1",
				// Repeated query parameters survive: the raw query string is used.
				Query:       map[string][]string{"limit": {"2"}, "state": {"RUNNING", "PARTIAL"}},
				ContentType: "application/octet-stream",
				// API Gateway joins repeated headers with commas; the
				// adapter splits them again (except single-value headers).
				Custom: []string{"one", "two"},
				Body:   "\x00\x01\x02\x03\xff\xfe\xfd", ContentLength: 7,
				RequestID: "YcYB2hZ9IAMEVjA=",
			},
		},
		{
			// API Gateway always sends a rooted rawPath; the adapter roots
			// one that is not rather than refusing the event.
			name: "relative path is rooted",
			file: "apigw-v2-get-task.json",
			edit: func(ev *events.APIGatewayV2HTTPRequest) { ev.RawPath = "api/tasks"; ev.RawQueryString = "limit=1" },
			want: seen{
				Method: "GET", Path: "/api/tasks", RawQuery: "limit=1", RequestURI: "/api/tasks?limit=1",
				Host: host, RemoteAddr: "203.0.113.7", Proto: "HTTP/1.1",
				Query: map[string][]string{"limit": {"1"}}, Authorization: "Bearer eyJraWQiOiJ...",
				RequestID: "YcX9PhZ7IAMEVgA=", Sub: "7f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f8",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var ev events.APIGatewayV2HTTPRequest
			lambdatest.ReadJSON(t, tc.file, &ev)
			if tc.edit != nil {
				tc.edit(&ev)
			}
			var got seen
			resp, err := (&apifn.Handler{Handler: echo(&got)}).Handle(t.Context(), ev)
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("status = %d %q, want 204", resp.StatusCode, resp.Body)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHTTPRequestContextOutsideHandle(t *testing.T) {
	t.Parallel()
	if rc, ok := apifn.APIGatewayRequestContext(t.Context()); ok {
		t.Errorf("APIGatewayRequestContext of a plain context = %+v, true; want false", rc)
	}
}

func TestHTTPResponse(t *testing.T) {
	t.Parallel()
	xlsxBytes := []byte("PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00\xff\xfe")
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    events.APIGatewayV2HTTPResponse
	}{
		{
			name: "JSON stays text",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json; charset=utf-8")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"task_id":"商品"}`)
			},
			want: events.APIGatewayV2HTTPResponse{
				StatusCode: 201,
				Headers:    map[string]string{"Content-Type": "application/json; charset=utf-8"},
				Body:       `{"task_id":"商品"}`,
			},
		},
		{
			name: "a workbook is base64",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet")
				_, _ = w.Write(xlsxBytes)
			},
			want: events.APIGatewayV2HTTPResponse{
				StatusCode:      200,
				Headers:         map[string]string{"Content-Type": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"},
				Body:            base64.StdEncoding.EncodeToString(xlsxBytes),
				IsBase64Encoded: true,
			},
		},
		{
			name: "invalid UTF-8 text is base64",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				_, _ = w.Write([]byte{'a', 0xff})
			},
			want: events.APIGatewayV2HTTPResponse{
				StatusCode: 200, Headers: map[string]string{"Content-Type": "text/plain"},
				Body: "Yf8=", IsBase64Encoded: true,
			},
		},
		{
			// Any valid UTF-8 survives the JSON string API Gateway reads,
			// whatever the Content-Type.
			name: "UTF-8 octets stay text",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				_, _ = w.Write([]byte("a\x00b"))
			},
			want: events.APIGatewayV2HTTPResponse{
				StatusCode: 200, Headers: map[string]string{"Content-Type": "application/octet-stream"},
				Body: "a\x00b",
			},
		},
		{
			name: "content type is sniffed when unset",
			handler: func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, "hello")
			},
			want: events.APIGatewayV2HTTPResponse{
				StatusCode: 200, Headers: map[string]string{"Content-Type": "text/plain; charset=utf-8"},
				Body: "hello",
			},
		},
		{
			name: "cookies and repeated headers",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.SetCookie(w, &http.Cookie{Name: "a", Value: "1"})
				http.SetCookie(w, &http.Cookie{Name: "b", Value: "2", HttpOnly: true})
				w.Header().Add("Vary", "Accept")
				w.Header().Add("Vary", "Authorization")
				w.WriteHeader(http.StatusNoContent)
			},
			want: events.APIGatewayV2HTTPResponse{
				StatusCode: 204, Headers: map[string]string{"Vary": "Accept,Authorization"},
				Cookies: []string{"a=1", "b=2; HttpOnly"},
			},
		},
		{
			name: "first final status wins, as in net/http",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusEarlyHints)
				w.WriteHeader(http.StatusAccepted)
				w.WriteHeader(http.StatusInternalServerError)
			},
			want: events.APIGatewayV2HTTPResponse{StatusCode: 202},
		},
		{
			name: "a handler that writes nothing answers 200 with its headers",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Cache-Control", "no-store")
				http.SetCookie(w, &http.Cookie{Name: "a", Value: "1"})
			},
			want: events.APIGatewayV2HTTPResponse{
				StatusCode: 200, Headers: map[string]string{"Cache-Control": "no-store"}, Cookies: []string{"a=1"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var ev events.APIGatewayV2HTTPRequest
			lambdatest.ReadJSON(t, "apigw-v2-get-task.json", &ev)
			got, err := (&apifn.Handler{Handler: tc.handler}).Handle(t.Context(), ev)
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("response mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHTTPMalformedEvent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(*events.APIGatewayV2HTTPRequest)
	}{
		{"bad base64 body", func(ev *events.APIGatewayV2HTTPRequest) { ev.Body, ev.IsBase64Encoded = "%%%", true }},
		{"invalid method", func(ev *events.APIGatewayV2HTTPRequest) { ev.RequestContext.HTTP.Method = "GET TASKS" }},
		{"invalid path escape", func(ev *events.APIGatewayV2HTTPRequest) { ev.RawPath = "/api/tasks/%zz" }},
		{"invalid domain name", func(ev *events.APIGatewayV2HTTPRequest) { ev.RequestContext.DomainName = "bad host" }},
	}
	want := events.APIGatewayV2HTTPResponse{
		StatusCode: http.StatusBadRequest,
		Headers:    map[string]string{"Content-Type": "application/json; charset=utf-8"},
		Body:       `{"error":{"code":"bad_request","message":"malformed request"}}` + "\n",
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var ev events.APIGatewayV2HTTPRequest
			lambdatest.ReadJSON(t, "apigw-v2-post-task.json", &ev)
			tc.edit(&ev)
			called := false
			var logs bytes.Buffer
			h := &apifn.Handler{
				Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }),
				Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
			}
			resp, err := h.Handle(t.Context(), ev)
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if called {
				t.Error("the handler was called for a malformed event")
			}
			if diff := cmp.Diff(want, resp); diff != "" {
				t.Errorf("response mismatch (-want +got):\n%s", diff)
			}
			var body api.ErrorBody
			if err := json.Unmarshal([]byte(resp.Body), &body); err != nil || body.Error.Code != "bad_request" {
				t.Errorf("body %q is not the API's JSON error body", resp.Body)
			}
			if !strings.Contains(logs.String(), "malformed API Gateway event") || !strings.Contains(logs.String(), "YcYA1hZ8IAMEVhA=") {
				t.Errorf("log = %q, want the warning with the request id", logs.String())
			}
		})
	}
}

type urlPresigner struct{}

func (urlPresigner) PresignPut(_ context.Context, key string, _ time.Duration, _ int64, _ string) (string, error) {
	return "https://bucket.test/" + key, nil
}

func (urlPresigner) PresignGet(_ context.Context, key string, _ time.Duration) (string, error) {
	return "https://bucket.test/" + key, nil
}

// TestHTTPServesTheAPI runs the real API behind the adapter: create a task
// from the POST payload, then follow it with the GET payload.
func TestHTTPServesTheAPI(t *testing.T) {
	t.Parallel()
	e := lambdatest.NewEnv(t)
	h := &apifn.Handler{Handler: api.New(api.Config{
		Store: e.Store, Blobs: e.Blobs, Presigner: urlPresigner{}, Auth: apifn.GatewayAuth{}, Clock: e.Clock,
		DefaultSpec: store.TaskSpec{Provider: "sim", BatchSize: 100},
		NewID:       func() string { return "0123456789abcdef0123456789abcdef" },
	})}
	var post, get events.APIGatewayV2HTTPRequest
	lambdatest.ReadJSON(t, "apigw-v2-post-task.json", &post)
	lambdatest.ReadJSON(t, "apigw-v2-get-task.json", &get)

	resp, err := h.Handle(t.Context(), post)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST = %d %q, %v; want 201", resp.StatusCode, resp.Body, err)
	}
	var created api.CreateTaskResponse
	if err := json.Unmarshal([]byte(resp.Body), &created); err != nil {
		t.Fatal(err)
	}
	if created.UploadURL != "https://bucket.test/incoming/0123456789abcdef0123456789abcdef/商品 list.xlsx" {
		t.Errorf("upload_url = %q", created.UploadURL)
	}
	if got := created.UploadHeaders["Content-Length"]; got != "18342" {
		t.Errorf("upload_headers Content-Length = %q, want the posted size 18342", got)
	}

	resp, err = h.Handle(t.Context(), get)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET = %d %q, %v; want 200", resp.StatusCode, resp.Body, err)
	}
	var view api.TaskView
	if err := json.Unmarshal([]byte(resp.Body), &view); err != nil {
		t.Fatal(err)
	}
	if view.Status != api.StateAwaitingUpload || view.Source != "商品 list.xlsx" {
		t.Errorf("task = %s %q, want AWAITING_UPLOAD for the posted file", view.Status, view.Source)
	}
	if !strings.HasPrefix(resp.Headers["Content-Type"], "application/json") || resp.IsBase64Encoded {
		t.Errorf("JSON answer went out as %q base64=%v", resp.Headers["Content-Type"], resp.IsBase64Encoded)
	}

	// The API's own JSON errors pass through with their status.
	missing := get
	missing.RawPath = "/api/tasks/ffffffffffffffffffffffffffffffff"
	resp, err = h.Handle(t.Context(), missing)
	if err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET missing = %d %q, %v; want 404", resp.StatusCode, resp.Body, err)
	}
	var apiErr api.ErrorBody
	if err := json.Unmarshal([]byte(resp.Body), &apiErr); err != nil || apiErr.Error.Code != "not_found" {
		t.Errorf("GET missing body = %q, want the not_found JSON error", resp.Body)
	}
}
