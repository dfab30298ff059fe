//go:build emulator

package lambdafn_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/lambdafn/splitterfn"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// object returns the content of key in the stack's bucket, or nil and false
// when there is no such object.
func (e *e2e) object(key string) ([]byte, bool) {
	e.t.Helper()
	out, err := e.stack.S3.GetObject(e.t.Context(), &s3.GetObjectInput{Bucket: aws.String(e.res.BucketName), Key: aws.String(key)})
	var nsk *types.NoSuchKey
	if errors.As(err, &nsk) {
		return nil, false
	}
	if err != nil {
		e.t.Fatalf("get %s: %v", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		e.t.Fatalf("read %s: %v", key, err)
	}
	return b, true
}

// wantMoved fails the test unless key is gone from incoming/ and its
// processed/ copy holds body.
func (e *e2e) wantMoved(key string, body []byte) {
	e.t.Helper()
	if _, ok := e.object(key); ok {
		e.t.Errorf("%s is still in incoming/ after the splitter took it", key)
	}
	got, ok := e.object(pipeline.ProcessedKey(key))
	if !ok {
		e.t.Fatalf("%s was not moved to %s", key, pipeline.ProcessedKey(key))
	}
	if !bytes.Equal(got, body) {
		e.t.Errorf("%s holds %d bytes, want the input's %d", pipeline.ProcessedKey(key), len(got), len(body))
	}
}

// TestDropFolderMovesTakenInputs: as in batchgen serve's drop folder, the
// splitter moves an input it took from incoming/ to processed/. A duplicate
// S3 event after the move (S3 delivers at least once) is a quiet no-op;
// the same content dropped again after the task finished is the same task,
// moved again, with no model call, and after its result expired it is
// exported again from the stored rows.
func TestDropFolderMovesTakenInputs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newE2E(t, e2eOptions{rows: 6, batchSize: 3})
	const name = "moved.xlsx"
	key := pipeline.IncomingPrefix + name
	var rowsIn [][]string
	for i := 1; i <= e.rows; i++ {
		rowsIn = append(rowsIn, e2eRow(i, nil))
	}
	body := lambdatest.XLSX(t, lambdatest.Header, rowsIn, "为{{商品名称}}（{{类目}}）写一句文案")
	ev, err := e.stack.Upload(ctx, name, body)
	if err != nil {
		t.Fatal(err)
	}
	id := e.taskID(ev)
	if err := e.stack.Splitter.Handle(ctx, ev); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	e.wantMoved(key, body)

	// The same event again, after the move: the task exists, nothing is
	// left in incoming/, and that is no failure.
	if err := e.stack.Splitter.Handle(ctx, ev); err != nil {
		t.Fatalf("duplicate event after the move: %v", err)
	}
	if _, ok := e.object(pipeline.ErrorFileKey(key)); ok {
		t.Errorf("a duplicate event after the move wrote %s", pipeline.ErrorFileKey(key))
	}
	task, err := e.stack.Store.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if task.State == store.TaskFailed || task.RowsTotal != e.rows {
		t.Fatalf("task after the duplicate event: %s with %d rows (%s), want it split with %d rows", task.State, task.RowsTotal, task.Error, e.rows)
	}
	e.wantMoved(key, body)

	task = e.pump(id, 90*time.Second)
	if task.State != store.TaskSucceeded {
		t.Fatalf("task finished %s (%s)", task.State, task.Error)
	}
	e.checkResult(task.ResultKey, nil)
	calls := e.mock.Stats().Requests

	// Dropped again after it finished: the same task, moved again, no call.
	again, err := e.stack.Upload(ctx, name, body)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.taskID(again); got != id {
		t.Fatalf("the same content dropped again is task %s, want %s", got, id)
	}
	if err := e.stack.Splitter.Handle(ctx, again); err != nil {
		t.Fatalf("re-drop: %v", err)
	}
	e.wantMoved(key, body)

	// Its result expired; dropped again, it is exported again.
	if _, err := e.stack.S3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(e.res.BucketName), Key: aws.String(task.ResultKey)}); err != nil {
		t.Fatal(err)
	}
	if again, err = e.stack.Upload(ctx, name, body); err != nil {
		t.Fatal(err)
	}
	if err := e.stack.Splitter.Handle(ctx, again); err != nil {
		t.Fatalf("re-drop after the result expired: %v", err)
	}
	e.wantMoved(key, body)
	reexported := e.pump(id, 90*time.Second)
	if reexported.State != store.TaskSucceeded || reexported.ExportGen != 1 {
		t.Fatalf("after the re-drop the task is %s at export generation %d, want SUCCEEDED at 1", reexported.State, reexported.ExportGen)
	}
	e.checkResult(reexported.ResultKey, nil)
	if got := e.mock.Stats().Requests; got != calls {
		t.Errorf("the model was called %d more times after the task finished, want none", got-calls)
	}
}

// TestDropFolderSidecarAndRejection: a CSV (no prompt sheet; the stack has
// no default prompt) takes its template from the sidecar prompt file
// beside it, as in batchgen serve's drop folder; one without a sidecar is
// rejected, its error file written and the input moved to processed/ all
// the same. The sidecar stays where the user put it, as locally.
func TestDropFolderSidecarAndRejection(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newE2E(t, e2eOptions{rows: 3, batchSize: 3})
	const template = "给{{商品名称}}写一句文案"
	sheet := lambdatest.CSVBytes(lambdatest.Header, lambdatest.Rows(3))
	if _, err := e.stack.Upload(ctx, "with-prompt.prompt.txt", []byte(template+"\n")); err != nil {
		t.Fatal(err)
	}
	withEv, err := e.stack.Upload(ctx, "with-prompt.csv", sheet)
	if err != nil {
		t.Fatal(err)
	}
	withoutEv, err := e.stack.Upload(ctx, "without-prompt.csv", sheet)
	if err != nil {
		t.Fatal(err)
	}
	// accept hands ev to the handler, as S3 invokes it, then delivers it
	// once more straight to its Intake for the outcome and task id (a
	// sidecar is part of what names the task).
	accept := func(ev events.S3Event) (string, pipeline.IntakeResult) {
		t.Helper()
		key := ev.Records[0].S3.Object.Key
		if err := e.stack.Splitter.Handle(ctx, ev); err != nil {
			t.Fatalf("splitter on %s: %v", key, err)
		}
		res, err := e.stack.Splitter.Intake.Accept(ctx, key, splitterfn.ObjectVersion(ev.Records[0].S3.Object))
		if err != nil {
			t.Fatalf("accept %s again: %v", key, err)
		}
		return key, res
	}

	withKey, res := accept(withEv)
	if res.Moved {
		t.Errorf("the second delivery of %s moved it again; it was moved by the first", withKey)
	}
	task, err := e.stack.Store.GetTask(ctx, res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if task.State == store.TaskFailed || task.Spec.Prompt != template {
		t.Errorf("task of %s: %s (%s) with template %q, want it split with the sidecar's %q", withKey, task.State, task.Error, task.Spec.Prompt, template)
	}
	e.wantMoved(withKey, sheet)
	if _, ok := e.object(pipeline.SidecarPromptKey(withKey)); !ok {
		t.Errorf("the sidecar %s is gone; the drop folder leaves it where the user put it", pipeline.SidecarPromptKey(withKey))
	}

	withoutKey, res := accept(withoutEv)
	if res.Outcome != pipeline.IntakeIgnored || !res.Taken {
		t.Errorf("second delivery of the rejected %s = %+v, want a taken duplicate", withoutKey, res)
	}
	task, err = e.stack.Store.GetTask(ctx, res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if task.State != store.TaskFailed || !strings.Contains(task.Error, "no prompt") {
		t.Errorf("task of %s: %s (%q), want FAILED for want of a prompt", withoutKey, task.State, task.Error)
	}
	reason, ok := e.object(pipeline.ErrorFileKey(withoutKey))
	if !ok || !strings.Contains(string(reason), "no prompt") {
		t.Errorf("error file %s = %q (present %v), want the reason", pipeline.ErrorFileKey(withoutKey), reason, ok)
	}
	e.wantMoved(withoutKey, sheet)
}
