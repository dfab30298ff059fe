package apifn_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/lambdafn/apifn"
	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/store"
)

// TestGatewayAuth: through the adapter, the principal is the subject API
// Gateway's authorizer verified; a request without one is refused, and
// another subject's task is not found.
func TestGatewayAuth(t *testing.T) {
	t.Parallel()
	e := lambdatest.NewEnv(t)
	const id = "0123456789abcdef0123456789abcdef"
	if err := e.Store.CreateTask(t.Context(), store.Task{
		ID: id, Owner: "sub-alice", State: store.TaskRunning, Spec: store.TaskSpec{Provider: "sim", BatchSize: 1}, CreatedAt: lambdatest.Epoch,
	}); err != nil {
		t.Fatal(err)
	}
	h := &apifn.Handler{Handler: api.New(api.Config{Store: e.Store, Blobs: e.Blobs, Auth: apifn.GatewayAuth{}, Clock: e.Clock})}
	tests := []struct {
		name, sub  string
		wantStatus int
		wantCode   string
	}{
		{"the owner", "sub-alice", http.StatusOK, ""},
		{"another subject", "sub-bob", http.StatusNotFound, "not_found"},
		{"no authorizer identity", "", http.StatusUnauthorized, "unauthenticated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := lambdatest.ServeGateway(t, h, lambdatest.GatewayRequest{Sub: tc.sub, Method: "GET", Target: "/api/tasks/" + id})
			var got api.ErrorBody
			_ = json.Unmarshal(body, &got)
			if resp.StatusCode != tc.wantStatus || got.Error.Code != tc.wantCode {
				t.Errorf("GET as %q = %d %s, want %d %q", tc.sub, resp.StatusCode, body, tc.wantStatus, tc.wantCode)
			}
		})
	}
}
