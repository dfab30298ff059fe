// Package eventsfn is the events Lambda: the API's task event stream (GET
// /api/tasks/{id}/events, Server-Sent Events) served through a Lambda
// Function URL with response streaming, since API Gateway answers only
// request/response. The conversion is aws-lambda-go's lambdaurl: the
// http.Handler writes into a pipe that Lambda streams to the client as it
// is written. The package is the whole function: New (wire.go) builds it
// from the function's environment and AWS clients for functions/events.
package eventsfn

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdaurl"
)

// Handler serves an http.Handler to Lambda Function URL requests whose
// function is configured with InvokeMode RESPONSE_STREAM.
type Handler struct {
	Handler http.Handler
	Logger  *slog.Logger
}

// malformedBody is the answer to an event that is not an HTTP request, in
// the shape of internal/api's error bodies.
const malformedBody = `{"error":{"code":"bad_request","message":"malformed request"}}` + "\n"

// Handle serves one request, streaming the response body. It never
// returns an error: the Function URL would turn that into a bare 502, while
// a JSON 400 tells the client what to fix.
func (h *Handler) Handle(ctx context.Context, req *events.LambdaFunctionURLRequest) (*events.LambdaFunctionURLStreamingResponse, error) {
	resp, err := lambdaurl.Wrap(h.Handler)(ctx, req)
	if err != nil {
		// The only error lambdaurl returns: the event cannot be made an
		// *http.Request (an invalid method or URL); the handler has not
		// run.
		logger := h.Logger
		if logger == nil {
			logger = slog.New(slog.DiscardHandler)
		}
		logger.WarnContext(ctx, "malformed Function URL event", "request_id", req.RequestContext.RequestID, "error", err)
		return &events.LambdaFunctionURLStreamingResponse{
			StatusCode: http.StatusBadRequest,
			Headers:    map[string]string{"Content-Type": "application/json; charset=utf-8"},
			Body:       strings.NewReader(malformedBody),
		}, nil
	}
	return resp, nil
}
