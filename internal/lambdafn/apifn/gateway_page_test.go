package apifn_test

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/web"
)

// TestGatewayServesThePage: the api function, as apiwire builds it, serves
// the web page through API Gateway's adapter as batchgen serve does (one
// handler, web.Site): the page, its assets and the OpenAPI document
// without a token, and POST /ui/inspect only for a principal API Gateway's
// authorizer verified. None of these requests reaches AWS, so no emulator
// is needed.
func TestGatewayServesThePage(t *testing.T) {
	t.Parallel()
	env := awswire.Env{TableName: "batchgen-Table", BucketName: "batchgen-bucket", MaxInputBytes: 100 << 20}
	h, err := apifn.New(awswire.NewDeps(env, aws.Config{Region: "us-east-1"}, "api"))
	if err != nil {
		t.Fatal(err)
	}

	pages := []struct {
		target, wantType, wantBody string
	}{
		{"/", "text/html", "<title>batchgen</title>"},
		{"/ui/app.js", "javascript", "/api/tasks"},
		{"/ui/app.css", "text/css", "{"},
		// Public on AWS too (template.yaml's OpenAPI route has no
		// authorizer): it describes routes, never a task.
		{"/api/openapi.yaml", "application/yaml", "openapi:"},
		// Sheets over Lambda's payload limit go to S3 directly: the page
		// learns the bound here, before it has a token.
		{web.ConfigPath, "application/json", `"max_inline_bytes":` + strconv.Itoa(apifn.InlineUploadBytes)},
	}
	for _, tc := range pages {
		resp, body := lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Method: "GET", Target: tc.target})
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Headers["Content-Type"], tc.wantType) || !strings.Contains(string(body), tc.wantBody) {
			t.Errorf("GET %s without a token = %d %q %.60q, want 200 %s containing %q", tc.target, resp.StatusCode, resp.Headers["Content-Type"], body, tc.wantType, tc.wantBody)
		}
	}

	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, err := mw.CreateFormFile("file", "orders.csv")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write([]byte("name,city\nAda,London\nGrace,Arlington\n"))
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	inspect := lambdatest.GatewayRequest{Method: "POST", Target: web.InspectPath, ContentType: mw.FormDataContentType(), Body: form.String()}

	resp, body := lambdatest.ServeGateway(t, h, inspect)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"unauthorized"`) {
		t.Errorf("POST %s without the authorizer's principal = %d %s, want 401", web.InspectPath, resp.StatusCode, body)
	}

	inspect.Sub = "sub-alice"
	resp, body = lambdatest.ServeGateway(t, h, inspect)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s as sub-alice = %d %s, want 200", web.InspectPath, resp.StatusCode, body)
	}
	var got web.Inspection
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("inspection %s: %v", body, err)
	}
	want := web.Inspection{
		Filename: "orders.csv", Encoding: got.Encoding, Columns: []string{"name", "city"}, Rows: 2,
		Sample: [][]string{{"Ada", "London"}, {"Grace", "Arlington"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("inspection (-want +got):\n%s", diff)
	}
}
