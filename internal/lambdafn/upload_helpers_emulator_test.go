//go:build emulator

package lambdafn_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awsops"
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/samstack/localrun"
)

// apiFunction builds the api function as deployed (apiwire, from the
// stack's environment) against the emulator.
func (e *e2e) apiFunction() *apifn.Handler {
	e.t.Helper()
	cfg, err := samstack.Config(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	h, err := apifn.New(awswire.NewDeps(e.stack.Env, cfg, "api"))
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// putUpload PUTs body to a task's presigned upload URL with the signed
// content type, as a client of the JSON form of POST /api/tasks does, and
// fails the test unless S3 takes it.
func (e *e2e) putUpload(created api.CreateTaskResponse, body []byte) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.t.Context(), http.MethodPut, created.UploadURL, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", created.UploadHeaders["Content-Type"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("PUT to the upload URL = %s", resp.Status)
	}
}

// uploadedEvent is the bucket's ObjectCreated notification of the object
// stored under key, with its real size and ETag, as S3 would send it to
// the splitter.
func (e *e2e) uploadedEvent(key string) events.S3Event {
	e.t.Helper()
	head, err := e.stack.S3.HeadObject(e.t.Context(), &s3.HeadObjectInput{Bucket: aws.String(e.res.BucketName), Key: aws.String(key)})
	if err != nil {
		e.t.Fatal(err)
	}
	return localrun.ObjectCreated(samstack.Region, e.res.BucketName, localrun.Object{Key: key, Size: aws.ToInt64(head.ContentLength), ETag: aws.ToString(head.ETag)}, 1)
}

// apiCaller builds the api function as deployed, its AWS calls recorded
// in ops under "api", and returns a call of it as principal sub through
// API Gateway's event, failing the test on any status but want.
func (e *e2e) apiCaller(ops *awsops.Set, sub string) func(method, path, body string, want int) []byte {
	e.t.Helper()
	cfg, err := samstack.Config(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	h, err := apifn.New(awswire.NewDeps(e.stack.Env, ops.For("api").Attach(cfg), "api"))
	if err != nil {
		e.t.Fatal(err)
	}
	return func(method, path, body string, want int) []byte {
		e.t.Helper()
		resp, out := lambdatest.ServeGateway(e.t, h, lambdatest.GatewayRequest{Sub: sub, Method: method, Target: path, ContentType: "application/json", Body: body})
		if resp.StatusCode != want {
			e.t.Fatalf("%s %s = %d %s, want %d", method, path, resp.StatusCode, out, want)
		}
		return out
	}
}

// createThroughAPI creates a task of e.rows rows through call with the
// JSON form of POST /api/tasks (settings: more fields of its body, such as
// `"sample": 4`), PUTs the sheet to its upload URL and runs the splitter
// on the bucket's notification, and returns the task's id.
func (e *e2e) createThroughAPI(call func(method, path, body string, want int) []byte, filename, settings string) string {
	e.t.Helper()
	var sheet [][]string
	for i := 1; i <= e.rows; i++ {
		sheet = append(sheet, e2eRow(i, nil))
	}
	body := lambdatest.XLSX(e.t, lambdatest.Header, sheet, "为{{商品名称}}（{{类目}}）写一句文案")
	var created api.CreateTaskResponse
	req := fmt.Sprintf(`{"filename":%q,"size":%d,%s}`, filename, len(body), settings)
	if err := json.Unmarshal(call("POST", "/api/tasks", req, http.StatusCreated), &created); err != nil {
		e.t.Fatal(err)
	}
	e.putUpload(created, body)
	if err := e.stack.Splitter.Handle(e.t.Context(), e.uploadedEvent(pipeline.IncomingKey(created.ID, filename))); err != nil {
		e.t.Fatalf("splitter: %v", err)
	}
	return created.ID
}
