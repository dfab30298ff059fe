//go:build emulator

package lambdafn_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awsemu"
	"github.com/batchgen/batchgen/internal/awsemu/localrun"
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/awswire/apiwire"
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
	cfg, err := awsemu.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := apiwire.New(awswire.NewDeps(e.stack.Env, cfg, "api"))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("sku,name\n") // a header and no rows
	resp, out := serveGateway(t, h, gatewayRequest{sub: "alice", method: "POST", target: "/api/tasks", contentType: "application/json",
		body: `{"filename": "empty.csv", "size": ` + jsonInt(len(body)) + `, "prompt": "{{name}}"}`})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST = %d %s", resp.StatusCode, out)
	}
	var created api.CreateTaskResponse
	if err := json.Unmarshal(out, &created); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, created.UploadURL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", created.UploadHeaders["Content-Type"])
	put, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	put.Body.Close()
	if put.StatusCode != http.StatusOK {
		t.Fatalf("PUT to the upload URL = %s: S3 takes any bytes of the signed size and type", put.Status)
	}

	key := api.IncomingKey(created.ID, "empty.csv")
	head, err := e.stack.S3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(e.res.BucketName), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	ev := localrun.ObjectCreated(awsemu.Region, e.res.BucketName, localrun.Object{Key: key, Size: aws.ToInt64(head.ContentLength), ETag: aws.ToString(head.ETag)}, 1)
	if err := e.stack.Splitter.Handle(ctx, ev); err != nil {
		t.Fatalf("splitter on a rejected sheet: %v (a rejection is an outcome, not an error to retry)", err)
	}

	resp, out = serveGateway(t, h, gatewayRequest{sub: "alice", method: "GET", target: "/api/tasks/" + created.ID})
	var view api.TaskView
	if err := json.Unmarshal(out, &view); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET = %d %s (%v)", resp.StatusCode, out, err)
	}
	if view.Status != "FAILED" || !strings.Contains(view.Error, "empty.csv") || !strings.Contains(view.Error, "no data rows") {
		t.Errorf("task after the splitter = %s %q, want FAILED saying empty.csv has no data rows", view.Status, view.Error)
	}
	if resp, out := serveGateway(t, h, gatewayRequest{sub: "bob", method: "GET", target: "/api/tasks/" + created.ID}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("bob reads alice's rejected task: %d %s, want 404", resp.StatusCode, out)
	}
}
