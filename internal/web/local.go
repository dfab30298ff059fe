package web

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/clip"
)

// LocalOnly guards a server that has no API tokens, and so trusts every caller that can reach it, against the
// callers a browser lets in from elsewhere:
//   - a request whose Host is not this machine's loopback name with the listening port (127.0.0.1, localhost
//     or [::1]) is refused, so a page on another name that DNS rebinding points at 127.0.0.1 can neither start
//     tasks nor read them;
//   - a state-changing request (POST, PUT, DELETE...) a browser marks cross-origin (Sec-Fetch-Site, or an
//     Origin that is not the Host) is refused (net/http's CrossOriginProtection), so a page the user visits
//     cannot submit a form that runs a task on the owner's provider key.
//
// Both refusals are 403s in the API's error shape, naming what was wrong. Programs (curl, scripts) send neither
// a foreign Host nor browser headers, and the page's own requests are same-origin: both are served.
func LocalOnly(next http.Handler, port string) http.Handler {
	csrf := http.NewCrossOriginProtection()
	csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse(w, "cross_origin", "a cross-origin request from "+cmpOrigin(r)+" may not change anything here: "+
			"this server has no API tokens, so only its own page and programs on this machine may use it")
	}))
	guarded := csrf.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host, port) {
			refuse(w, "forbidden_host", "Host "+quoteHost(r.Host)+" is not this server's: without API tokens it answers only "+
				"127.0.0.1:"+port+", localhost:"+port+" and [::1]:"+port)
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a request's Host names the loopback interface with the listening port.
func loopbackHost(host, port string) bool {
	h, p, err := net.SplitHostPort(host)
	if err != nil || p != port {
		return false
	}
	switch strings.ToLower(h) {
	case "127.0.0.1", "localhost", "::1":
		return true
	}
	return false
}

func refuse(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	var body api.ErrorBody
	body.Error.Code, body.Error.Message = code, msg
	_ = json.NewEncoder(w).Encode(body)
}

func cmpOrigin(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" {
		return quoteHost(o)
	}
	return "another site"
}

// quoteHost quotes a client's header for a message, bounded.
func quoteHost(s string) string {
	b, _ := json.Marshal(clip.Runes(s, 80))
	return string(b)
}
