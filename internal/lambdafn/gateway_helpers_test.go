package lambdafn_test

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"

	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
)

// gatewayRequest is one HTTP request as API Gateway (payload 2.0) hands it
// to the api function after its JWT authorizer accepted a token of
// subject sub: the recorded GET event with method, path, body and claims
// replaced.
type gatewayRequest struct {
	sub, method, target, contentType, body string
}

// event builds the API Gateway event of r from the recorded payload.
func (r gatewayRequest) event(t *testing.T) events.APIGatewayV2HTTPRequest {
	t.Helper()
	var ev events.APIGatewayV2HTTPRequest
	readJSON(t, "apigw-v2-get-task.json", &ev)
	u, err := url.Parse(r.target)
	if err != nil {
		t.Fatal(err)
	}
	ev.RawPath, ev.RawQueryString = u.Path, u.RawQuery
	ev.RequestContext.HTTP.Method, ev.RequestContext.HTTP.Path = r.method, u.Path
	ev.PathParameters = map[string]string{"proxy": strings.TrimPrefix(u.Path, "/")}
	ev.Headers = map[string]string{"host": ev.RequestContext.DomainName, "x-forwarded-proto": "https"}
	if r.contentType != "" {
		ev.Headers["content-type"] = r.contentType
	}
	ev.Body, ev.IsBase64Encoded = r.body, false
	if !utf8.ValidString(r.body) {
		ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString([]byte(r.body)), true
	}
	ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{}
	if r.sub != "" {
		ev.RequestContext.Authorizer.JWT = &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{
			Claims: map[string]string{"sub": r.sub, "iss": "https://issuer.test", "client_id": "client"},
		}
	}
	return ev
}

// serveGateway runs r through the Lambda adapter and returns the response
// with its body decoded.
func serveGateway(t *testing.T, h *apifn.Handler, r gatewayRequest) (events.APIGatewayV2HTTPResponse, []byte) {
	t.Helper()
	resp, err := h.Handle(t.Context(), r.event(t))
	if err != nil {
		t.Fatalf("%s %s: Handle: %v", r.method, r.target, err)
	}
	body := []byte(resp.Body)
	if resp.IsBase64Encoded {
		if body, err = base64.StdEncoding.DecodeString(resp.Body); err != nil {
			t.Fatalf("%s %s: body: %v", r.method, r.target, err)
		}
	}
	return resp, body
}
