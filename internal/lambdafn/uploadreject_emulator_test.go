//go:build emulator

package lambdafn_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// TestUploadURLRejectionOnAWS: a sheet PUT to its presigned upload URL
// reaches no API code, so nothing answers the PUT with the reason it is
// refused; the splitter finds it and the task turns FAILED with the CLI's
// message, which GET /api/tasks/{id} (what the web page follows) shows to
// its owner. The page relies on exactly this for sheets over Lambda's
// payload limit.
func TestUploadURLRejectionOnAWS(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newE2E(t, e2eOptions{rows: 2, batchSize: 2})
	h := e.apiFunction()
	body := []byte("sku,name\n") // a header and no rows
	resp, out := lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: "alice", Method: "POST", Target: "/api/tasks", ContentType: "application/json",
		Body: `{"filename": "empty.csv", "size": ` + jsonInt(len(body)) + `, "prompt": "{{name}}"}`})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST = %d %s", resp.StatusCode, out)
	}
	var created api.CreateTaskResponse
	if err := json.Unmarshal(out, &created); err != nil {
		t.Fatal(err)
	}
	// S3 takes any bytes of the signed size and type.
	e.putUpload(created, body)

	key := pipeline.IncomingKey(created.ID, "empty.csv")
	if err := e.stack.Splitter.Handle(ctx, e.uploadedEvent(key)); err != nil {
		t.Fatalf("splitter on a rejected sheet: %v (a rejection is an outcome, not an error to retry)", err)
	}

	resp, out = lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: "alice", Method: "GET", Target: "/api/tasks/" + created.ID})
	var view api.TaskView
	if err := json.Unmarshal(out, &view); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET = %d %s (%v)", resp.StatusCode, out, err)
	}
	if view.Status != "FAILED" || !strings.Contains(view.Error, "empty.csv") || !strings.Contains(view.Error, "no data rows") {
		t.Errorf("task after the splitter = %s %q, want FAILED saying empty.csv has no data rows", view.Status, view.Error)
	}
	if resp, out := lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: "bob", Method: "GET", Target: "/api/tasks/" + created.ID}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("bob reads alice's rejected task: %d %s, want 404", resp.StatusCode, out)
	}
}
