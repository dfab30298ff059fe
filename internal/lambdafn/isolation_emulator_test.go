//go:build emulator

package lambdafn_test

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// TestAPIIsolationOnAWS runs the api function as deployed, through the
// API Gateway v2 adapter against the emulated stack (DynamoDB, S3, SQS,
// Step Functions), with the principals API Gateway's JWT authorizer would
// pass on: alice creates tasks through the presigned upload URL and as a
// multipart form, they run to the end; bob gets the 404 of a missing task
// on every route of hers and never sees them in his list; a request
// without an authorizer identity gets 401.
func TestAPIIsolationOnAWS(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newE2E(t, e2eOptions{rows: 4, batchSize: 2})
	h := e.apiFunction()
	call := func(sub, method, target, contentType string, body []byte) (int, []byte) {
		t.Helper()
		resp, out := lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: sub, Method: method, Target: target, ContentType: contentType, Body: string(body)})
		return resp.StatusCode, out
	}
	sheetBody := lambdatest.XLSX(t, lambdatest.Header, [][]string{{"brick", "toys"}, {"ball", "toys"}}, "{{商品名称}}")

	// 1. The upload URL: alice asks for it, PUTs the sheet to S3, the
	// bucket's event starts the splitter.
	status, out := call("alice", "POST", "/api/tasks", "application/json", []byte(`{"filename": "alice.xlsx", "size": `+jsonInt(len(sheetBody))+`}`))
	if status != http.StatusCreated {
		t.Fatalf("POST = %d %s", status, out)
	}
	var created api.CreateTaskResponse
	if err := json.Unmarshal(out, &created); err != nil {
		t.Fatal(err)
	}
	// Before the sheet arrives, the task is alice's alone as well.
	if status, out := call("bob", "GET", "/api/tasks/"+created.ID, "", nil); status != http.StatusNotFound {
		t.Errorf("bob reads alice's pending task: %d %s, want 404", status, out)
	}
	e.putUpload(created, sheetBody)
	split := func(key string) {
		t.Helper()
		if err := e.stack.Splitter.Handle(ctx, e.uploadedEvent(key)); err != nil {
			t.Fatalf("splitter: %v", err)
		}
	}
	split(pipeline.IncomingKey(created.ID, "alice.xlsx"))
	e.pump(created.ID, 90*time.Second)

	// 2. The multipart form: the api function checks the sheet and puts
	// it in the bucket itself; the event does the rest.
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	part, err := mw.CreateFormFile("file", "alice-form.xlsx")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := part.Write(sheetBody); err != nil {
		t.Fatal(err)
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	status, out = call("alice", "POST", "/api/tasks", mw.FormDataContentType(), form.Bytes())
	if status != http.StatusCreated {
		t.Fatalf("multipart POST = %d %s", status, out)
	}
	var posted api.TaskView
	if err := json.Unmarshal(out, &posted); err != nil || posted.Status != api.StateUploaded {
		t.Fatalf("multipart POST answered %s (%v), want the task UPLOADED", out, err)
	}
	split(pipeline.IncomingKey(posted.ID, "alice-form.xlsx"))

	// A bad sheet is refused with the core's message before anything is
	// stored.
	status, out = call("alice", "POST", "/api/tasks", "application/json", nil)
	if status != http.StatusBadRequest {
		t.Errorf("empty POST = %d %s, want 400", status, out)
	}

	for _, id := range []string{created.ID, posted.ID} {
		for _, r := range []struct{ method, target string }{
			{"GET", "/api/tasks/" + id},
			{"GET", "/api/tasks/" + id + "/events"},
			{"GET", "/api/tasks/" + id + "/result"},
			{"GET", "/api/tasks/" + id + "/preview"},
			{"POST", "/api/tasks/" + id + "/cancel"},
			{"POST", "/api/tasks/" + id + "/retry"},
			{"PUT", "/api/tasks/" + id + "/upload"},
		} {
			status, out := call("bob", r.method, r.target, "text/csv", []byte("a\n1\n"))
			var body api.ErrorBody
			_ = json.Unmarshal(out, &body)
			if status != http.StatusNotFound || body.Error.Message != `no task "`+id+`"` {
				t.Errorf("bob: %s %s = %d %s, want the 404 of a missing task", r.method, r.target, status, out)
			}
			if status, out := call("", r.method, r.target, "", nil); status != http.StatusUnauthorized {
				t.Errorf("no identity: %s %s = %d %s, want 401", r.method, r.target, status, out)
			}
		}
	}
	list := func(sub string) []string {
		t.Helper()
		// The owner index is eventually consistent: poll until it settles.
		var ids []string
		deadline := time.Now().Add(10 * time.Second)
		for {
			status, out := call(sub, "GET", "/api/tasks", "", nil)
			if status != http.StatusOK {
				t.Fatalf("list as %s = %d %s", sub, status, out)
			}
			var l api.TaskList
			if err := json.Unmarshal(out, &l); err != nil {
				t.Fatal(err)
			}
			ids = ids[:0]
			for _, v := range l.Tasks {
				ids = append(ids, v.ID)
			}
			if sub != "alice" || len(ids) == 2 || time.Now().After(deadline) {
				return ids
			}
		}
	}
	if got := list("bob"); len(got) != 0 {
		t.Errorf("bob's list = %v, want empty", got)
	}
	if got := list("alice"); !slices.Contains(got, created.ID) || !slices.Contains(got, posted.ID) {
		t.Errorf("alice's list = %v, want both her tasks", got)
	}

	// alice herself gets the finished task, its preview and a redirect to
	// the presigned result.
	status, out = call("alice", "GET", "/api/tasks/"+created.ID, "", nil)
	var view api.TaskView
	if err := json.Unmarshal(out, &view); status != http.StatusOK || err != nil || view.RowsTotal != 2 || (view.Status != "SUCCEEDED" && view.Status != "PARTIAL") {
		t.Errorf("alice's task = %d %s (%v), want her finished 2-row task", status, out, err)
	}
	if status, out := call("alice", "GET", "/api/tasks/"+created.ID+"/preview", "", nil); status != http.StatusOK || !strings.Contains(string(out), "brick") {
		t.Errorf("alice's preview = %d %s", status, out)
	}
	resp2, _ := lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: "alice", Method: "GET", Target: "/api/tasks/" + created.ID + "/result"})
	if resp2.StatusCode != http.StatusFound || !strings.Contains(resp2.Headers["Location"], "X-Amz-Signature") {
		t.Errorf("alice's result = %d Location %q, want 302 to a presigned URL", resp2.StatusCode, resp2.Headers["Location"])
	}
}

func jsonInt(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
