// Package web is batchgen's browser page: a small framework-free HTML/CSS/JS
// application, embedded in the binary, that uploads a sheet through the HTTP
// API (internal/api), lets the user write the prompt template against the
// sheet's columns, follows the task live over Server-Sent Events and
// downloads the result.
//
// The page holds no rules of its own: the sheet is read by POST /ui/inspect,
// which runs the same reader the pipeline splits with (internal/sheet), so a
// file the CLI would reject is rejected here with the same message, and
// everything else goes through the API.
package web

import (
	"embed"
	"io/fs"
	"log/slog"
	"net/http"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/sheet"
)

//go:embed static
var static embed.FS

// Config wires the page.
type Config struct {
	// Limits are the API's (the value given to api.New): MaxRows and
	// MaxFileBytes bound the sheets POST /ui/inspect reads (zero takes
	// internal/sheet's defaults), so the page rejects what the API would;
	// Models and ModelFixed are what the page offers for a task's model:
	// the allowed models, or no model field when the deployment fixes them
	// (it routes rows to the models its providers file names).
	Limits api.Limits
	// Authenticate, when non-nil, must accept a request to POST /ui/inspect
	// (the API's bearer-token check); a non-nil error answers 401. Nil lets
	// anyone inspect, which suits a loopback-only server. Nothing inspected
	// is stored.
	Authenticate func(r *http.Request) error
	// SampleRows is how many data rows POST /ui/inspect returns for the
	// template preview. Defaults to 3.
	SampleRows int
	// Logger receives internal errors, which clients never see. Defaults to
	// discarding.
	Logger *slog.Logger
	// TempDir is where an uploaded sheet is spooled while it is read.
	// Defaults to os.TempDir().
	TempDir string
	// MaxInlineBytes is the largest sheet the page sends inside one request
	// (POST /ui/inspect and the multipart form of POST /api/tasks), in
	// bytes. The page uploads a larger one to the upload URL of a task it
	// creates with the JSON form of POST /api/tasks, and inspects only the
	// head of a larger CSV/TSV (a workbook, being a zip, cannot be read in
	// part: its columns are checked when it arrives). Set it where a proxy
	// bounds requests: on AWS, Lambda's 6 MB request payload. Zero or less
	// means no bound of its own (Limits.MaxFileBytes).
	MaxInlineBytes int64
}

// PageConfig is the body of GET /ui/config.json: what the page needs to
// know of the server before it sends a sheet. It holds no secret and no
// task data, so it is public like the page.
type PageConfig struct {
	// MaxInlineBytes is Config.MaxInlineBytes, or MaxFileBytes when that
	// sets no bound of its own.
	MaxInlineBytes int64 `json:"max_inline_bytes"`
	// MaxFileBytes is the largest sheet the server accepts at all.
	MaxFileBytes int64 `json:"max_file_bytes"`
	// Models are the models a task may name besides the deployment's
	// default (api.Limits.Models); empty allows the default only.
	Models []string `json:"models,omitempty"`
	// ModelFixed, when set, says why a task names no model
	// (api.Limits.ModelFixed).
	ModelFixed string `json:"model_fixed,omitempty"`
	// CostCaps is set when a task may have a spending cap
	// (api.Limits.CostCaps): the page offers the field.
	CostCaps bool `json:"cost_caps,omitempty"`
	// BatchModes is set when a task may run in economy or auto
	// (api.Limits.BatchModes): the page offers the mode.
	BatchModes bool `json:"batch_modes,omitempty"`
	// Quotes is set when a task may be quoted first (api.Limits.Quotes):
	// the page offers "Quote first".
	Quotes bool `json:"quotes,omitempty"`
}

func (c Config) withDefaults() Config {
	if c.SampleRows <= 0 {
		c.SampleRows = 3
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Limits.MaxFileBytes <= 0 {
		c.Limits.MaxFileBytes = sheet.DefaultMaxFileBytes
	}
	if c.MaxInlineBytes <= 0 || c.MaxInlineBytes > c.Limits.MaxFileBytes {
		c.MaxInlineBytes = c.Limits.MaxFileBytes
	}
	return c
}

// Paths served by New. Mount the handler at "/" beside the API's "/api/":
// it answers only these.
const (
	// PagePath is the page itself.
	PagePath = "/"
	// AssetsPrefix serves the page's scripts and style sheet.
	AssetsPrefix = "/ui/"
	// InspectPath reads an uploaded sheet's header and first rows.
	InspectPath = "/ui/inspect"
	// ConfigPath answers the page's PageConfig.
	ConfigPath = "/ui/config.json"
)

// New returns the page's handler: GET / (the page), GET /ui/... (its
// assets), GET /ui/config.json and POST /ui/inspect. Any other path
// answers 404.
func New(cfg Config) http.Handler {
	cfg = cfg.withDefaults()
	assets, err := fs.Sub(static, "static")
	if err != nil {
		panic("web: embedded assets missing: " + err.Error()) // a build bug
	}
	mux := http.NewServeMux()
	files := http.FileServerFS(assets)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, assets, "index.html")
	})
	mux.Handle("GET /ui/", http.StripPrefix("/ui", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		// The assets change with the binary and are small: revalidate
		// rather than serve a stale script against a newer API.
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})))
	// Under /ui/ so that it is public wherever the assets are (on AWS, the
	// GET /ui/{proxy+} route has no authorizer).
	pageConfig := PageConfig{MaxInlineBytes: cfg.MaxInlineBytes, MaxFileBytes: cfg.Limits.MaxFileBytes,
		Models: cfg.Limits.Models, ModelFixed: cfg.Limits.ModelFixed, CostCaps: cfg.Limits.CostCaps, BatchModes: cfg.Limits.BatchModes, Quotes: cfg.Limits.Quotes}
	mux.HandleFunc("GET "+ConfigPath, func(w http.ResponseWriter, _ *http.Request) {
		api.WriteJSON(w, http.StatusOK, pageConfig)
	})
	ins := &inspector{cfg: cfg}
	mux.Handle("POST "+InspectPath, ins)
	// A GET of the inspect path would otherwise be served as a missing
	// asset; say what it takes instead.
	mux.HandleFunc("GET "+InspectPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		api.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here; use POST")
	})
	return mux
}

// securityHeaders keeps the page from being framed or its assets sniffed,
// and limits scripts to its own.
func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self' https:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
}
