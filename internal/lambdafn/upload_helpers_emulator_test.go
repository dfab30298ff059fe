//go:build emulator

package lambdafn_test

import (
	"bytes"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
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
