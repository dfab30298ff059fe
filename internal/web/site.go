package web

import (
	"net/http"

	"github.com/batchgen/batchgen/internal/api"
)

// Site is the one handler batchgen serves over HTTP, locally (batchgen
// serve) and on AWS (the api function behind API Gateway), so the page and
// the API behave the same on both: paths under /api/ go to apiHandler,
// which authenticates every request; /api/openapi.yaml is public; the page
// (/ and its assets under /ui/) is public too, since a browser must load it
// before it has a token, while POST /ui/inspect is held to
// page.Authenticate, which callers set to the API's authenticator (see
// Authenticate). A non-nil metrics handler is mounted at GET /metrics.
func Site(apiHandler, metrics http.Handler, page Config) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/api/", apiHandler)
	// The API's OpenAPI document describes routes, not data: it is public,
	// like the page, so clients and tools can read it before they have a
	// token.
	mux.HandleFunc("GET /api/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml; charset=utf-8")
		_, _ = w.Write(api.OpenAPI())
	})
	if metrics != nil {
		// Prometheus scrapes the engine's metrics here; they hold counts
		// and durations only, never a task's content, but they say how busy
		// the deployment is and which models it calls: behind a token when
		// the server has tokens (the scraper's bearer_token).
		if auth := page.Authenticate; auth != nil {
			open := metrics
			metrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := auth(r); err != nil {
					w.Header().Set("WWW-Authenticate", `Bearer realm="batchgen"`)
					http.Error(w, "metrics need an API token: "+err.Error(), http.StatusUnauthorized)
					return
				}
				open.ServeHTTP(w, r)
			})
		}
		mux.Handle("GET /metrics", metrics)
	}
	mux.Handle("/", New(page))
	return mux
}

// Authenticate adapts the API's authenticator to Config.Authenticate, so
// POST /ui/inspect admits exactly the callers the API admits.
func Authenticate(a api.Authenticator) func(r *http.Request) error {
	return func(r *http.Request) error { _, err := a.Authenticate(r); return err }
}
