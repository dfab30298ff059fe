package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/batchgen/batchgen/internal/api"
)

// TestServeTokenlessAnswersOnlyItsOrigin: a `serve` without API tokens trusts every caller that reaches it, so it
// answers only its loopback names and refuses cross-origin changes. Every state-changing route of the API (read
// from its OpenAPI document, so a new route is covered) and the page's inspect is sent a foreign Host (DNS
// rebinding), a foreign Origin and Sec-Fetch-Site: cross-site: each is refused with a 403 naming why. A read with
// a foreign Host is refused too; the page's own same-origin requests and a program's (no browser headers) work.
func TestServeTokenlessAnswersOnlyItsOrigin(t *testing.T) {
	t.Parallel()
	p := startServeWith(t, t.TempDir(), nil, "--provider", "sim")
	base, _ := url.Parse(p.url)

	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	type route struct{ method, path string }
	routes := []route{{"POST", "/ui/inspect"}}
	for path, ops := range doc.Paths {
		for m := range ops {
			if m := strings.ToUpper(m); m != "GET" && m != "HEAD" && m != "OPTIONS" && m != "PARAMETERS" {
				routes = append(routes, route{m, strings.ReplaceAll(path, "{id}", "0123456789abcdef0123456789abcdef")})
			}
		}
	}
	if len(routes) < 5 {
		t.Fatalf("found only %d state-changing routes in the OpenAPI document", len(routes))
	}
	send := func(method, path string, header map[string]string, host string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, p.url+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &body)
		return resp.StatusCode, body.Error.Code
	}
	for _, r := range routes {
		for _, c := range []struct {
			what, host, code string
			header           map[string]string
		}{
			{"a foreign Host", "attacker.example:" + base.Port(), "forbidden_host", nil},
			{"this machine on another port", "127.0.0.1:1", "forbidden_host", nil},
			{"a foreign Origin", "", "cross_origin", map[string]string{"Origin": "https://evil.example"}},
			{"Sec-Fetch-Site: cross-site", "", "cross_origin", map[string]string{"Sec-Fetch-Site": "cross-site"}},
			{"Sec-Fetch-Site: same-site (another local site)", "", "cross_origin", map[string]string{"Sec-Fetch-Site": "same-site"}},
		} {
			if status, code := send(r.method, r.path, c.header, c.host); status != http.StatusForbidden || code != c.code {
				t.Errorf("%s %s with %s: %d %q, want 403 %s", r.method, r.path, c.what, status, code, c.code)
			}
		}
	}
	if status, code := send("GET", "/api/tasks", nil, "rebound.example:"+base.Port()); status != http.StatusForbidden || code != "forbidden_host" {
		t.Errorf("GET /api/tasks with a rebound Host: %d %q, want 403", status, code)
	}
	for _, host := range []string{"", "localhost:" + base.Port(), "LOCALHOST:" + base.Port()} {
		if status, _ := send("GET", "/api/tasks", nil, host); status != http.StatusOK {
			t.Errorf("GET /api/tasks with Host %q: %d, want 200", host, status)
		}
	}

	// The page's own upload (same-origin, as Chromium sends it) and a program's both create a task.
	for i, header := range []map[string]string{
		{"Origin": p.url, "Sec-Fetch-Site": "same-origin"},
		nil,
	} {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", "own.csv")
		_, _ = io.WriteString(fw, "name\nbrick "+strings.Repeat("x", i)+"\n")
		_ = mw.WriteField("prompt", "{{name}}")
		_ = mw.Close()
		req, _ := http.NewRequest("POST", p.url+"/api/tasks", &body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("upload %d (%v): %d, want 201", i, header, resp.StatusCode)
		}
	}
}

// TestDataDirectoryIsPrivate: after a run, the data directory (the database with every row and answer, the
// kept inputs, the results, the cache) is readable by its owner alone: folders 0700, files 0600, an older
// directory's 0755 closed too. The result written beside the input stays an ordinary document.
func TestDataDirectoryIsPrivate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, ".batchgen")
	if err := os.MkdirAll(data, 0o755); err != nil { // as an older version made it
		t.Fatal(err)
	}
	in := productsCSV(t, dir, 12, nil)
	if r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}}", "--sim-latency", "1ms"); r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	n := 0
	err := filepath.WalkDir(data, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n++
		if perm := info.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s is %v: others may read it", path, perm)
		}
		return nil
	})
	if err != nil || n < 4 {
		t.Fatalf("walked %d entries: %v", n, err)
	}
	if info, err := os.Stat(filepath.Join(dir, "skus.result.xlsx")); err != nil || info.Mode().Perm() != 0o644 {
		t.Errorf("the result beside the input: %v, %v; want an ordinary 0644 document", info.Mode().Perm(), err)
	}
}
