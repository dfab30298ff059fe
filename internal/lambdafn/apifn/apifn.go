// Package apifn is the api Lambda: API Gateway HTTP API events (payload
// format 2.0) served by an http.Handler (internal/api), so one handler runs
// under net/http locally and behind API Gateway. The package is the whole
// function: its handler (apifn.go) depends on the API and aws-lambda-go
// only, and New (wire.go) builds it from the function's environment and
// AWS clients for functions/api.
package apifn

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
	"github.com/awslabs/aws-lambda-go-api-proxy/core"
	"github.com/awslabs/aws-lambda-go-api-proxy/httpadapter"
)

// Handler serves an http.Handler to API Gateway HTTP API events (payload
// format 2.0), so the same handler runs under net/http locally and behind
// API Gateway. The conversion is aws-lambda-go-api-proxy's httpadapter:
// request bodies arrive decoded, and response bodies that are not valid
// UTF-8 go back base64-encoded.
type Handler struct {
	Handler http.Handler
	Logger  *slog.Logger
}

// APIGatewayRequestContext returns the API Gateway request context (route,
// request id, JWT claims) of a request served through HTTP.
func APIGatewayRequestContext(ctx context.Context) (events.APIGatewayV2HTTPRequestContext, bool) {
	return core.GetAPIGatewayV2ContextFromContext(ctx)
}

// malformedBody is the answer to an event that is not an HTTP request; it
// has the shape of internal/api's error bodies so clients parse one format.
const malformedBody = `{"error":{"code":"bad_request","message":"malformed request"}}` + "\n"

// Handle serves one request. It never returns an error: API Gateway would
// turn that into a bare 500, while a JSON 400 tells the client what to fix.
func (h *Handler) Handle(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	resp, err := httpadapter.NewV2(netHTTPStatus(h.Handler)).ProxyWithContext(ctx, ev)
	if err != nil {
		// With netHTTPStatus the response always has a status, so the
		// adapter's only remaining error is an event it cannot turn into
		// an *http.Request (bad base64 body, invalid method or URL); the
		// handler has not run.
		logger(h.Logger).Warn("malformed API Gateway event", "request_id", ev.RequestContext.RequestID, "error", err)
		return events.APIGatewayV2HTTPResponse{
			StatusCode: http.StatusBadRequest,
			Headers:    map[string]string{"Content-Type": "application/json; charset=utf-8"},
			Body:       malformedBody,
		}, nil
	}
	return resp, nil
}

// netHTTPStatus gives next net/http's status rules, which the adapter's
// writer lacks: a handler that writes nothing answers 200 (the adapter
// would fail the invocation with a 504), the first WriteHeader wins (the
// adapter keeps the last, so a late error could replace a sent status),
// and 1xx statuses are not final (API Gateway cannot return them).
func netHTTPStatus(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if !sw.wrote {
			w.WriteHeader(http.StatusOK)
		}
	})
}

// statusWriter records whether the response status has been set.
type statusWriter struct {
	http.ResponseWriter
	wrote bool
}

// WriteHeader keeps net/http's rules: the first final status wins and 1xx
// statuses are dropped, since API Gateway cannot return them.
func (w *statusWriter) WriteHeader(status int) {
	if w.wrote || status < http.StatusOK {
		return
	}
	w.wrote = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true // the adapter's Write implies 200 itself
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the adapter's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logger returns l, or a logger that drops everything when l is nil.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
