//go:build browser

package web_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
)

// inlineLimit is the --max-inline-bytes of the server these tests start:
// far below the test sheets, as Lambda's payload limit is below a large
// sheet on AWS, so the page must take the upload-URL path.
const inlineLimit = 1024

// apiCalls records the page's requests to the API and the inspect route,
// and refuses a sheet sent inline in a multipart POST /api/tasks: a test
// that passes has proved the page never sent one.
type apiCalls struct {
	mu    sync.Mutex
	calls []string // "METHOD /path"
}

func (c *apiCalls) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// recordAPICalls intercepts the tab's requests to /api/ and /ui/inspect
// until the test ends.
func recordAPICalls(t *testing.T, ctx context.Context) *apiCalls {
	t.Helper()
	rec := &apiCalls{}
	watchCtx, stop := context.WithCancel(ctx)
	paused := chromedp.Events(watchCtx, fetch.RequestPaused)
	do(t, ctx, "intercept API requests", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/api/*"}, {URLPattern: "*/ui/inspect"}}})
		return err
	}))
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	wg.Go(func() {
		for ev, err := range paused {
			if err != nil || watchCtx.Err() != nil {
				return
			}
			u, _ := url.Parse(ev.Request.URL)
			ct := ""
			for k, v := range ev.Request.Headers {
				if strings.EqualFold(k, "Content-Type") {
					ct, _ = v.(string)
				}
			}
			call := ev.Request.Method + " " + u.Path
			if ev.Request.Method == "POST" && u.Path == "/api/tasks" && strings.HasPrefix(ct, "multipart/") {
				call += " multipart"
				_, _ = chromedp.Call(ctx, fetch.FailRequest, fetch.FailRequestParams{RequestID: ev.RequestID, ErrorReason: network.ErrorReasonBlockedByClient})
			} else {
				_, _ = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
			}
			rec.mu.Lock()
			rec.calls = append(rec.calls, call)
			rec.mu.Unlock()
		}
	})
	return rec
}

// writeCSV writes the test sheet as CSV: the same columns and rows as
// writeSheet's workbook.
func writeCSV(t *testing.T, dir, name string, rows int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(strings.Join(sheetColumns, ",") + "\n")
	for i := 1; i <= rows; i++ {
		fmt.Fprintf(&b, "SKU-%03d,绿茶 %d,饮料\n", i, i)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

var uploadPath = regexp.MustCompile(`^PUT /api/tasks/[0-9a-f]+/upload$`)

// uploads counts the PUTs of a sheet to its task's upload endpoint.
func uploads(calls []string) int {
	n := 0
	for _, c := range calls {
		if uploadPath.MatchString(c) {
			n++
		}
	}
	return n
}

// TestBrowserUploadsLargeSheets: with a server whose inline limit is below
// the sheets (as Lambda's payload limit is on AWS), the page creates the
// task with the JSON form of POST /api/tasks and PUTs the sheet to its
// upload URL, never inline; a large CSV is inspected from its head, a large
// workbook not at all, and both run to the end.
func TestBrowserUploadsLargeSheets(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil, "--max-inline-bytes", fmt.Sprint(inlineLimit))
	ctx := newBrowser(t, "en-US")
	calls := recordAPICalls(t, ctx)
	dir := t.TempDir()

	tests := []struct {
		name      string
		file      string
		wantMeta  string   // #file-meta starts with
		wantChips []string // the column buttons
		template  string
		preview   string
	}{
		{
			name: "csv, read from its head", file: writeCSV(t, dir, "large.csv", sheetRows),
			wantMeta: "2 KB · 3 columns (read from its first rows", wantChips: sheetColumns,
			template: "Upload CSV: {{商品名称}}", preview: "Upload CSV: 绿茶 1",
		},
		{
			name: "workbook, read on arrival", file: writeSheet(t, dir, "large.xlsx", sheetRows),
			wantMeta: "too large to read before the upload", wantChips: []string{},
			template: "Upload xlsx: {{商品名称}}", preview: "The first prompt can be shown once the sheet's columns are known",
		},
	}
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fi, err := os.Stat(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() <= inlineLimit {
				t.Fatalf("%s is %d bytes: the test needs it above the inline limit %d", tc.file, fi.Size(), inlineLimit)
			}
			before := len(calls.list())
			chooseSheet(t, ctx, tc.file)
			wctx, cancel := within(ctx, stepDeadline)
			_, err = chromedp.Run(wctx, chromedp.Poll[bool](`!document.getElementById("task-form").hidden`))
			cancel()
			if err != nil {
				t.Fatalf("no template editor (%v): meta %q, error %q %q; requests %v", err, text(t, ctx, "#file-meta"), text(t, ctx, "#error-title"), text(t, ctx, "#error-message"), calls.list()[before:])
			}
			if got := text(t, ctx, "#file-meta"); !strings.Contains(got, tc.wantMeta) {
				t.Errorf("file summary %q, want it to say %q", got, tc.wantMeta)
			}
			chips, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#columns .chip")].map(b => b.dataset.column)`))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantChips, chips); diff != "" {
				t.Errorf("columns offered (-want +got):\n%s", diff)
			}
			do(t, ctx, "write the template", clearTemplate, chromedp.SendKeys(chromedp.ID("template"), tc.template))
			if got := text(t, ctx, "#preview"); !strings.HasPrefix(got, tc.preview) {
				t.Errorf("preview %q, want it to start with %q", got, tc.preview)
			}
			do(t, ctx, "start", chromedp.Click(chromedp.ID("start")), chromedp.WaitVisible(chromedp.ID("current")))
			// The previous task stays on show until this one is created.
			wctx, cancel = within(ctx, stepDeadline)
			_, err = chromedp.Run(wctx, chromedp.Poll[bool](fmt.Sprintf(`document.getElementById("current-name").textContent === %q`, filepath.Base(tc.file))))
			cancel()
			if err != nil {
				t.Fatalf("the task of %s is not on show: %v", filepath.Base(tc.file), err)
			}
			_, last := watchProgress(t, ctx, "")
			if want := fmt.Sprintf("%d / %d", sheetRows, sheetRows); last.State != "SUCCEEDED" || last.Pct != 100 || last.Done != want {
				t.Fatalf("task ended %+v, want SUCCEEDED at 100%% with %s rows", last, want)
			}
			got := calls.list()[before:]
			if slices.Contains(got, "POST /api/tasks multipart") || uploads(got) != 1 || !slices.Contains(got, "POST /api/tasks") {
				t.Errorf("requests %v, want POST /api/tasks (JSON) and one PUT of the sheet to its upload URL, no multipart POST", got)
			}
		})
	}
	// The result of the last one is whole and in order.
	checkResult(t, download(t, ctx, t.TempDir()), sheetRows)
}

// TestBrowserShowsWhyAnUploadIsRefused: a sheet that goes to its upload URL
// is checked when it arrives, and the reason it is refused shows in plain
// words, as for a sheet sent inline.
func TestBrowserShowsWhyAnUploadIsRefused(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil, "--max-inline-bytes", fmt.Sprint(inlineLimit))
	ctx := newBrowser(t, "en-US")
	calls := recordAPICalls(t, ctx)
	dir := t.TempDir()
	notABook := filepath.Join(dir, "photo.xlsx")
	if err := os.WriteFile(notABook, append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 4*inlineLimit)...), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, file, template string
		wantTitle            string
		wantMessage          []string
	}{
		{
			name: "a template naming no column", file: writeSheet(t, dir, "products.xlsx", 40), template: "Describe {{price}}",
			wantTitle: "The file was not accepted.", wantMessage: []string{"{{price}}", "商品名称"},
		},
		{
			name: "content that is no spreadsheet", file: notABook, template: "{{商品名称}}",
			wantTitle: "This kind of file cannot be read.", wantMessage: []string{"photo.xlsx"},
		},
	}
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(calls.list())
			if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const b = document.getElementById("file-clear"); if (!b.closest("[hidden]")) b.click(); return true; })()`)); err != nil {
				t.Fatalf("choose another file: %v", err)
			}
			chooseSheet(t, ctx, tc.file)
			do(t, ctx, "start",
				chromedp.WaitVisible(chromedp.ID("task-form")),
				clearTemplate,
				chromedp.SendKeys(chromedp.ID("template"), tc.template),
				chromedp.Click(chromedp.ID("start")),
				chromedp.WaitVisible(chromedp.ID("error")),
			)
			if got := text(t, ctx, "#error-title"); got != tc.wantTitle {
				t.Errorf("error title %q, want %q", got, tc.wantTitle)
			}
			msg := text(t, ctx, "#error-message")
			for _, s := range tc.wantMessage {
				if !strings.Contains(msg, s) {
					t.Errorf("error message %q does not say %q", msg, s)
				}
			}
			if got := calls.list()[before:]; uploads(got) != 1 {
				t.Errorf("requests %v, want the sheet PUT to its upload URL once", got)
			}
		})
	}
	screenshot(t, ctx, "web-upload-refused")
}

// TestBrowserUploadsWithTheToken: against a server with tokens, the page's
// PUT to the server's own upload endpoint carries the caller's token (a
// presigned URL elsewhere never gets it), so the uploaded task is alice's
// and runs.
func TestBrowserUploadsWithTheToken(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, []string{"BATCHGEN_API_TOKENS=alice:alice-secret-0001-xyz"}, "--max-inline-bytes", fmt.Sprint(inlineLimit))
	ctx := newBrowser(t, "en-US")
	calls := recordAPICalls(t, ctx)
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	setToken(t, ctx, "alice-secret-0001-xyz")
	chooseSheet(t, ctx, writeCSV(t, t.TempDir(), "alice-large.csv", sheetRows))
	startWithTemplate(t, ctx, "start", "Token upload: {{商品名称}}")
	if _, last := watchProgress(t, ctx, ""); last.State != "SUCCEEDED" {
		t.Fatalf("alice's uploaded task ended %+v (error %q)", last, text(t, ctx, "#error-message"))
	}
	if got := calls.list(); uploads(got) != 1 || slices.Contains(got, "POST /api/tasks multipart") {
		t.Errorf("requests %v, want one PUT to the upload URL and no multipart POST", got)
	}
	do(t, ctx, "alice's list", chromedp.WaitVisible(chromedp.CSS(`#tasks tr[data-task] .badge[data-state="SUCCEEDED"]`)))
}
