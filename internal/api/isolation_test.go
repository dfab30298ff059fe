package api_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// TestIsolation proves on the embedded runtime that a task is its owner's
// alone: for every route on a task (events included), another principal
// gets the same 404 as for a task that does not exist, changes nothing,
// and never sees the task in a list; a request without a valid token gets
// 401 on every route. The owner meanwhile gets real answers.
func TestIsolation(t *testing.T) {
	t.Parallel()
	e := newEmbedded(t)
	// alice's tasks: one split and finished, one still awaiting its sheet.
	if res := e.upload(t, "alice", "mine.csv", goodCSV, map[string]string{"prompt": "{{name}}"}); res.status != http.StatusCreated {
		t.Fatalf("upload = %d %s", res.status, res.body)
	}
	const done, waiting = "0123456789abcdef0123456789abcdef", "1123456789abcdef0123456789abcdef"
	e.finish(t, done)
	if res := send(t, e.handler, "alice", "POST", "/api/tasks", "application/json", []byte(`{"filename": "later.csv", "size": 40}`)); res.status != http.StatusCreated {
		t.Fatalf("create for upload = %d %s", res.status, res.body)
	}
	// bob has one of his own, so his list is not trivially empty.
	if res := e.upload(t, "bob", "his.csv", goodCSV, map[string]string{"prompt": "{{name}}"}); res.status != http.StatusCreated {
		t.Fatalf("bob's upload = %d %s", res.status, res.body)
	}

	type request struct{ method, target, contentType, body string }
	onTask := func(id string) []request {
		return []request{
			{"GET", "/api/tasks/" + id, "", ""},
			{"GET", "/api/tasks/" + id + "/events", "", ""},
			{"GET", "/api/tasks/" + id + "/result", "", ""},
			{"GET", "/api/tasks/" + id + "/preview", "", ""},
			{"POST", "/api/tasks/" + id + "/cancel", "", ""},
			{"POST", "/api/tasks/" + id + "/retry", "application/json", `{"error_class": "server_error"}`},
			{"GET", "/api/tasks/" + id + "/quote", "", ""},
			{"POST", "/api/tasks/" + id + "/start", "application/json", `{"mode": "online"}`},
			{"PUT", "/api/tasks/" + id + "/upload", "text/csv", "name\nx\n"},
		}
	}
	// Every route the handler serves on a task is covered.
	var covered []string
	for _, r := range onTask("{id}") {
		covered = append(covered, r.method+" "+r.target)
	}
	for _, rt := range api.Routes() {
		if strings.Contains(rt[1], "{id}") && !slices.Contains(covered, rt[0]+" "+rt[1]) {
			t.Errorf("route %s %s is not covered by the isolation test", rt[0], rt[1])
		}
	}

	for _, id := range []string{done, waiting, "ffffffffffffffffffffffffffffffff"} {
		for _, r := range onTask(id) {
			res := send(t, e.handler, "bob", r.method, r.target, r.contentType, []byte(r.body))
			if res.status != http.StatusNotFound || res.code(t) != "not_found" || res.message(t) != `no task "`+id+`"` {
				t.Errorf("bob: %s %s = %d %s, want the 404 of a missing task", r.method, r.target, res.status, res.body)
			}
			res = send(t, e.handler, "", r.method, r.target, r.contentType, []byte(r.body))
			if res.status != http.StatusUnauthorized || res.code(t) != "unauthenticated" || res.header.Get("WWW-Authenticate") == "" {
				t.Errorf("no token: %s %s = %d %s, want 401 with a challenge", r.method, r.target, res.status, res.body)
			}
		}
	}
	// Nothing bob tried changed alice's tasks.
	task, err := e.store.GetTask(t.Context(), done)
	if err != nil || task.State != "SUCCEEDED" || task.ExportGen != 0 {
		t.Errorf("alice's task after bob's attempts: %s gen %d (%v), want SUCCEEDED, never reopened", task.State, task.ExportGen, err)
	}
	if rec, err := pipeline.LoadUpload(t.Context(), e.blobs, waiting); err != nil || rec.Uploaded {
		t.Errorf("alice's pending upload after bob's PUT: %+v (%v), want still awaiting", rec, err)
	}

	list := func(who string) []string {
		t.Helper()
		res := send(t, e.handler, who, "GET", "/api/tasks", "", nil)
		if res.status != http.StatusOK {
			t.Fatalf("list as %s = %d %s", who, res.status, res.body)
		}
		var ids []string
		for _, v := range res.json(t)["tasks"].([]any) {
			ids = append(ids, v.(map[string]any)["id"].(string))
		}
		return ids
	}
	if got := list("bob"); len(got) != 1 || got[0] == done {
		t.Errorf("bob's list = %v, want his one task", got)
	}
	if got := list("alice"); !slices.Equal(got, []string{done}) {
		t.Errorf("alice's list = %v, want her split task", got)
	}
	if res := send(t, e.handler, "", "GET", "/api/tasks", "", nil); res.status != http.StatusUnauthorized {
		t.Errorf("list without a token = %d, want 401", res.status)
	}
	if res := e.upload(t, "", "x.csv", goodCSV, nil); res.status != http.StatusUnauthorized {
		t.Errorf("upload without a token = %d, want 401", res.status)
	}

	// The owner gets the real answers.
	for _, r := range []struct {
		request
		want int
	}{
		{request{"GET", "/api/tasks/" + done, "", ""}, http.StatusOK},
		{request{"GET", "/api/tasks/" + done + "/result", "", ""}, http.StatusOK},
		{request{"GET", "/api/tasks/" + done + "/preview", "", ""}, http.StatusOK},
		{request{"GET", "/api/tasks/" + done + "/events", "", ""}, http.StatusOK},
		{request{"POST", "/api/tasks/" + done + "/cancel", "", ""}, http.StatusConflict},
		{request{"POST", "/api/tasks/" + done + "/retry", "", ""}, http.StatusConflict},
		{request{"GET", "/api/tasks/" + waiting, "", ""}, http.StatusOK},
		{request{"GET", "/api/tasks/" + waiting + "/result", "", ""}, http.StatusConflict},
	} {
		if res := send(t, e.handler, "alice", r.method, r.target, r.contentType, []byte(r.body)); res.status != r.want {
			t.Errorf("alice: %s %s = %d %s, want %d", r.method, r.target, res.status, res.body, r.want)
		}
	}
}
