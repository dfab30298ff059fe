package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/web"
)

// TestServeMountsThePage: the page answers at / and its assets under /ui/,
// everything under /api/ reaches the API.
func TestServeMountsThePage(t *testing.T) {
	t.Parallel()
	apiHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Test", "api")
		w.WriteHeader(http.StatusTeapot)
	})
	srv := httptest.NewServer(web.Site(apiHandler, http.NotFoundHandler(), web.Config{}))
	defer srv.Close()
	tests := []struct {
		path       string
		wantStatus int
		wantAPI    bool
		wantBody   string
	}{
		{path: "/", wantStatus: 200, wantBody: "<title>batchgen</title>"},
		{path: "/ui/app.js", wantStatus: 200, wantBody: "/api/tasks"},
		{path: "/api/tasks", wantStatus: http.StatusTeapot, wantAPI: true},
		{path: "/api/tasks/abc/events", wantStatus: http.StatusTeapot, wantAPI: true},
		{path: "/nothing", wantStatus: 404},
	}
	for _, tc := range tests {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.wantStatus || (resp.Header.Get("X-Test") == "api") != tc.wantAPI {
			t.Errorf("GET %s: status %d (api %v), want %d (api %v)", tc.path, resp.StatusCode, resp.Header.Get("X-Test") == "api", tc.wantStatus, tc.wantAPI)
		}
		if !strings.Contains(string(body), tc.wantBody) {
			t.Errorf("GET %s: body lacks %q", tc.path, tc.wantBody)
		}
	}
}

// TestOpenAPIPublished: serve publishes the API's OpenAPI document at
// /api/openapi.yaml without a token, while the rest of /api/ stays the
// API's (and behind its authentication).
func TestOpenAPIPublished(t *testing.T) {
	t.Parallel()
	apiHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusUnauthorized) })
	h := web.Site(apiHandler, http.NotFoundHandler(), web.Config{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/api/openapi.yaml", nil))
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "openapi: 3") || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/yaml") {
		t.Errorf("GET /api/openapi.yaml = %d %q %.40q, want the YAML document", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/api/tasks", nil))
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("GET /api/tasks = %d, want the API handler's answer", rec.Code)
	}
}
