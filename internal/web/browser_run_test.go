//go:build browser

package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
	"github.com/batchgen/batchgen/internal/pipeline"
)

// pageState is what the test reads off the page while a task runs.
type pageState struct {
	Pct       int    `json:"pct"`
	State     string `json:"state"`
	Done      string `json:"done"`
	Transport string `json:"transport"`
}

const readState = `(() => ({
	pct: +document.getElementById("bar").getAttribute("aria-valuenow"),
	state: document.getElementById("current-state").dataset.state || "",
	done: document.getElementById("stat-done").textContent,
	transport: document.getElementById("transport").dataset.transport || "",
}))()`

// watchProgress reads the bar until the task is in a finished state and
// returns every distinct percentage seen, in order, and the last state. It
// saves one screenshot while the bar is part-way, as shot.
func watchProgress(t *testing.T, ctx context.Context, shot string) ([]int, pageState) {
	t.Helper()
	deadline := time.Now().Add(jobDeadline)
	var seen []int
	var last pageState
	transports := map[string]bool{}
	shotTaken := false
	for time.Now().Before(deadline) {
		st, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readState))
		if err != nil {
			t.Fatalf("read progress: %v", err)
		}
		if len(seen) == 0 || seen[len(seen)-1] != st.Pct {
			seen = append(seen, st.Pct)
		}
		if st.Transport != "" {
			transports[st.Transport] = true
		}
		if !shotTaken && shot != "" && st.Pct >= 25 && st.Pct <= 80 {
			screenshot(t, ctx, shot)
			shotTaken = true
		}
		last = st
		switch st.State {
		case "SUCCEEDED", "PARTIAL", "FAILED", "CANCELLED":
			t.Logf("progress seen: %v; transports: %v", seen, transports)
			return seen, last
		}
		time.Sleep(pollProgress) // sampling the page's own state, not synchronising with it
	}
	t.Fatalf("task did not finish within %s; progress seen %v, last %+v", jobDeadline, seen, last)
	return nil, last
}

// intermediate returns the percentages strictly between 0 and 100.
func intermediate(seen []int) []int {
	var mid []int
	for _, p := range seen {
		if p > 0 && p < 100 {
			mid = append(mid, p)
		}
	}
	return mid
}

// clearTemplate empties the template editor, as select-all and delete do.
var clearTemplate = chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const t = document.getElementById("template"); t.value = ""; t.focus(); return true; })()`))
	return err
})

// startWithTemplate writes tpl into the emptied template editor of the
// chosen sheet, starts the task and waits for the running task's panel.
func startWithTemplate(t *testing.T, ctx context.Context, what, tpl string) {
	t.Helper()
	do(t, ctx, what,
		chromedp.WaitVisible(chromedp.ID("task-form")),
		clearTemplate,
		chromedp.SendKeys(chromedp.ID("template"), tpl),
		chromedp.Click(chromedp.ID("start")),
		chromedp.WaitVisible(chromedp.ID("current")),
	)
}

// TestBrowserRunsASheet is the operator's path: choose a sheet, build the
// template from its columns, start, watch the bar move to 100%, download
// the result and find every row answered, in order.
func TestBrowserRunsASheet(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil)
	ctx := newBrowser(t, "en-US")
	dir := t.TempDir()
	in := writeSheet(t, dir, "products.xlsx", sheetRows)

	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	if got := text(t, ctx, "#new-task h2"); got != "New task" {
		t.Errorf("heading %q, want the English one", got)
	}
	chooseSheet(t, ctx, in)
	do(t, ctx, "wait for the template editor", chromedp.WaitVisible(chromedp.ID("task-form")))

	cols, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#columns .chip")].map(b => b.dataset.column)`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sheetColumns, cols); diff != "" {
		t.Errorf("columns offered as placeholders (-want +got):\n%s", diff)
	}
	if got, want := text(t, ctx, "#file-meta"), fmt.Sprintf("%d rows · 3 columns", sheetRows); !strings.HasPrefix(got, want) {
		t.Errorf("file summary %q, want it to start with %q", got, want)
	}

	// Write the template the way a person does: type, and click the
	// columns to insert their placeholders.
	do(t, ctx, "write the template",
		clearTemplate,
		chromedp.SendKeys(chromedp.ID("template"), "Slogan for "),
		chromedp.Click(chromedp.CSS(`#columns .chip[data-column="商品名称"]`)),
		chromedp.SendKeys(chromedp.ID("template"), " in "),
		chromedp.Click(chromedp.CSS(`#columns .chip[data-column="类目"]`)),
	)
	tmpl, err := chromedp.Run(ctx, chromedp.Value(chromedp.ID("template")))
	if err != nil {
		t.Fatal(err)
	}
	if want := "Slogan for {{商品名称}} in {{类目}}"; tmpl != want {
		t.Fatalf("template %q, want %q", tmpl, want)
	}
	if got, want := text(t, ctx, "#preview"), "Slogan for 绿茶 1 in 饮料"; got != want {
		t.Errorf("preview %q, want %q", got, want)
	}
	screenshot(t, ctx, "web-template")

	do(t, ctx, "start the task", chromedp.Click(chromedp.ID("start")), chromedp.WaitVisible(chromedp.ID("current")))
	seen, last := watchProgress(t, ctx, "web-progress")
	if last.State != "SUCCEEDED" || last.Pct != 100 {
		t.Fatalf("task ended %+v, want SUCCEEDED at 100%%", last)
	}
	if mid := intermediate(seen); len(mid) < 2 {
		t.Errorf("the bar jumped to the end: saw %v, want at least two values between 0 and 100", seen)
	}
	if !slices.IsSorted(seen) {
		t.Errorf("the bar went backwards: %v", seen)
	}
	if want := fmt.Sprintf("%d / %d", sheetRows, sheetRows); last.Done != want {
		t.Errorf("rows done %q, want %q", last.Done, want)
	}

	// The task list shows it, finished.
	do(t, ctx, "wait for the task list", chromedp.WaitVisible(chromedp.CSS(`#tasks tr[data-task] .badge[data-state="SUCCEEDED"]`)))
	screenshot(t, ctx, "web-done")

	got := download(t, ctx, t.TempDir())
	checkResult(t, got, sheetRows)
}

// download clicks the download button and returns the saved file.
func download(t *testing.T, ctx context.Context, dir string) string {
	t.Helper()
	dctx, cancel := within(ctx, stepDeadline)
	defer cancel()
	progress := chromedp.Events(dctx, browser.DownloadProgress)
	do(t, ctx, "allow downloads", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
			Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: new(true),
		})
		return err
	}))
	do(t, ctx, "click download", chromedp.WaitEnabled(chromedp.ID("download")), chromedp.Click(chromedp.ID("download")))
	for ev, err := range progress {
		if err != nil {
			t.Fatalf("waiting for the download: %v", err)
		}
		switch ev.State {
		case browser.DownloadProgressStateCompleted:
			return filepath.Join(dir, ev.GUID)
		case browser.DownloadProgressStateCanceled:
			t.Fatal("the download was cancelled")
		}
	}
	t.Fatalf("no completed download within %s", stepDeadline)
	return ""
}

// checkResult opens the downloaded workbook: the input columns, then the
// result columns; one row per input row, in order, each answered.
func checkResult(t *testing.T, file string, rows int) {
	t.Helper()
	f, err := excelize.OpenFile(file)
	if err != nil {
		t.Fatalf("open the downloaded result: %v", err)
	}
	defer f.Close()
	all, err := f.GetRows(f.GetSheetName(0))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != rows+1 {
		t.Fatalf("result has %d rows, want the header and %d", len(all), rows)
	}
	header := all[0]
	if diff := cmp.Diff(append(slices.Clone(sheetColumns), pipeline.ResultColumns[:3]...), header[:len(sheetColumns)+3]); diff != "" {
		t.Errorf("result header (-want +got):\n%s", diff)
	}
	out, status := slices.Index(header, "output"), slices.Index(header, "status")
	for i, row := range all[1:] {
		if want := fmt.Sprintf("SKU-%03d", i+1); row[0] != want {
			t.Errorf("result row %d is %s, want %s (order kept)", i+2, row[0], want)
		}
		if row[status] != "succeeded" || strings.TrimSpace(row[out]) == "" {
			t.Errorf("result row %d: status %q, output %q; want an answer", i+2, row[status], row[out])
		}
	}
}

// TestBrowserRejectsATemplateNamingNoColumn: the preview says which
// placeholder names no column, and so does the server when the task is
// started anyway.
func TestBrowserRejectsATemplateNamingNoColumn(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil)
	ctx := newBrowser(t, "en-US")
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, writeSheet(t, t.TempDir(), "ok.xlsx", 3))
	do(t, ctx, "write a bad template",
		chromedp.WaitVisible(chromedp.ID("task-form")),
		clearTemplate,
		chromedp.SendKeys(chromedp.ID("template"), "Describe {{price}}"),
	)
	if got := text(t, ctx, "#preview"); !strings.Contains(got, "{{price}}") || !strings.Contains(got, "商品名称") {
		t.Errorf("preview %q does not name the unknown placeholder and the columns", got)
	}
	do(t, ctx, "start anyway", chromedp.Click(chromedp.ID("start")), chromedp.WaitVisible(chromedp.ID("error")))
	if got := text(t, ctx, "#error-message"); !strings.Contains(got, "{{price}}") {
		t.Errorf("server's rejection %q does not name {{price}}", got)
	}
}

// TestBrowserFallsBackToPolling: when the event stream cannot be opened
// (a proxy that drops it, a deployment without streaming), the page
// follows the task by polling and still reaches 100%.
func TestBrowserFallsBackToPolling(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil)
	ctx := newBrowser(t, "en-US")
	// Refuse every request for an event stream at the network level.
	blockCtx, stopBlocking := context.WithCancel(ctx)
	paused := chromedp.Events(blockCtx, fetch.RequestPaused)
	do(t, ctx, "block event streams", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/events*"}}})
		return err
	}))
	var blocked sync.WaitGroup
	defer func() { stopBlocking(); blocked.Wait() }()
	blocked.Go(func() {
		for ev, err := range paused {
			if err != nil || blockCtx.Err() != nil {
				return
			}
			_, _ = chromedp.Call(ctx, fetch.FailRequest, fetch.FailRequestParams{RequestID: ev.RequestID, ErrorReason: network.ErrorReasonConnectionRefused})
		}
	})

	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	// Polls come once a second: a longer job gives them more to see.
	chooseSheet(t, ctx, writeSheet(t, t.TempDir(), "poll.xlsx", 2*sheetRows))
	startWithTemplate(t, ctx, "start", "Poll: {{商品名称}}") // not answered from the cache
	seen, last := watchProgress(t, ctx, "")
	if last.State != "SUCCEEDED" || last.Pct != 100 {
		t.Fatalf("task ended %+v, want SUCCEEDED at 100%%", last)
	}
	if last.Transport != "poll" {
		t.Errorf("transport %q, want poll with the stream blocked", last.Transport)
	}
	if mid := intermediate(seen); len(mid) < 2 {
		t.Errorf("polling saw %v, want at least two values between 0 and 100", seen)
	}
	stopBlocking()
}

// setToken types a token into the page's token field and saves it, as a
// user does; an empty token clears it.
func setToken(t *testing.T, ctx context.Context, token string) {
	t.Helper()
	do(t, ctx, "open the token box", chromedp.Click(chromedp.CSS("#token-box summary")), chromedp.WaitVisible(chromedp.ID("token")))
	do(t, ctx, "type the token "+token,
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { document.getElementById("token").value = ""; return true; })()`))
			return err
		}),
		chromedp.SendKeys(chromedp.ID("token"), token),
	)
	do(t, ctx, "save the token", chromedp.Click(chromedp.CSS("#token-form button")))
	pctx, cancel := within(ctx, stepDeadline)
	defer cancel()
	saved, err := chromedp.Run(pctx, chromedp.Poll[bool](fmt.Sprintf(`!document.getElementById("token-box").open && localStorage.getItem("batchgen.token") === %q`, token)))
	if err != nil || !saved {
		st, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify({open: document.getElementById("token-box").open, stored: localStorage.getItem("batchgen.token")})`))
		t.Fatalf("token not saved: %v (%s)", err, st)
	}
}

// TestBrowserUsesTheToken: against a server with tokens, the page without
// one says it needs one; with alice's token it runs her sheet and lists her
// task; with bob's token the list is empty, since her task is not his.
func TestBrowserUsesTheToken(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, []string{"BATCHGEN_API_TOKENS=alice:alice-secret-0001-xyz,bob:bob-secret-0002-xyzw"})
	ctx := newBrowser(t, "en-US")
	sheet := writeSheet(t, t.TempDir(), "alice.xlsx", 6)
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))

	chooseSheet(t, ctx, sheet)
	do(t, ctx, "wait for the error", chromedp.WaitVisible(chromedp.ID("error")))
	if got, want := text(t, ctx, "#error-title"), "The server needs a valid API token (top right)."; got != want {
		t.Errorf("without a token: %q, want %q", got, want)
	}

	setToken(t, ctx, "alice-secret-0001-xyz")
	chooseSheet(t, ctx, sheet)
	startWithTemplate(t, ctx, "start as alice", "Name {{商品名称}}")
	if _, last := watchProgress(t, ctx, ""); last.State != "SUCCEEDED" {
		t.Fatalf("alice's task ended %+v", last)
	}
	do(t, ctx, "alice's list", chromedp.WaitVisible(chromedp.CSS(`#tasks tr[data-task]`)))
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#tasks tr[data-task]").length`)); n != 1 {
		t.Errorf("alice sees %d tasks, want 1", n)
	}

	setToken(t, ctx, "bob-secret-0002-xyzw")
	do(t, ctx, "bob's empty list", chromedp.WaitVisible(chromedp.ID("tasks-empty")))
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#tasks tr[data-task]").length`)); n != 0 {
		t.Errorf("bob sees %d tasks, want none of alice's", n)
	}
}

// TestBrowserCancels: Cancel, clicked twice (the first click asks), stops a running task before its
// last row; the partial result, once written, can be downloaded and holds
// every input row, the ones never started marked so.
func TestBrowserCancels(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil)
	ctx := newBrowser(t, "en-US")
	rows := 120 // twice the usual, so the cancel lands well before the end
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, writeSheet(t, t.TempDir(), "long.xlsx", rows))
	// A template no other test uses: the server answers a prompt it has
	// seen from its cache, and this task must take its time.
	startWithTemplate(t, ctx, "start", "Cancel me: {{商品名称}}")
	pctx, cancel := within(ctx, jobDeadline)
	defer cancel()
	if _, err := chromedp.Run(pctx, chromedp.Poll[bool](`+document.getElementById("bar").getAttribute("aria-valuenow") > 0`)); err != nil {
		t.Fatalf("wait for the first rows: %v", err)
	}
	// The first click asks, the second cancels.
	do(t, ctx, "cancel", chromedp.WaitEnabled(chromedp.ID("cancel")), chromedp.Click(chromedp.ID("cancel")))
	if got := text(t, ctx, "#cancel"); !strings.Contains(got, "again") {
		t.Errorf("the first click on Cancel should ask to confirm; the button reads %q", got)
	}
	do(t, ctx, "confirm the cancel", chromedp.Click(chromedp.ID("cancel")))
	_, last := watchProgress(t, ctx, "")
	if last.State != "CANCELLED" {
		t.Fatalf("task ended %+v, want CANCELLED", last)
	}
	if last.Pct >= 100 {
		t.Errorf("a cancelled task shows %d%%", last.Pct)
	}
	if got := text(t, ctx, "#current-state"); got != "cancelled" {
		t.Errorf("state reads %q", got)
	}

	file := download(t, ctx, t.TempDir())
	f, err := excelize.OpenFile(file)
	if err != nil {
		t.Fatalf("open the partial result: %v", err)
	}
	defer f.Close()
	all, err := f.GetRows(f.GetSheetName(0))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != rows+1 {
		t.Fatalf("partial result has %d rows, want the header and all %d", len(all), rows)
	}
	status := slices.Index(all[0], "status")
	counts := map[string]int{}
	for _, row := range all[1:] {
		counts[row[status]]++
	}
	if counts["succeeded"] == 0 || counts["not_started"] == 0 {
		t.Errorf("partial result statuses %v, want some succeeded and some not_started", counts)
	}
}

// TestBrowserRerunsFailedRows: rows the model refuses (the mock's content
// filter) leave the task PARTIAL; "Rerun failed rows" sends those rows, and
// only those, to the model again, and the page follows the rerun to its end.
func TestBrowserRerunsFailedRows(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{Latency: 20 * time.Millisecond})
	model := httptest.NewServer(mock)
	defer model.Close()
	base := serveOwn(t, []string{"OPENAI_API_KEY=test-key"}, "--provider", "openai", "--base-url", model.URL+"/v1")
	ctx := newBrowser(t, "en-US")

	rows, refused := 12, []int{4, 9}
	file := writeSheet(t, t.TempDir(), "refusals.xlsx", rows)
	f, err := excelize.OpenFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refused {
		if err := f.SetCellValue("Sheet1", fmt.Sprintf("B%d", r+1), fmt.Sprintf("绿茶 %d %s", r, mockserver.DefaultFilterMarker)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Save(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, file)
	startWithTemplate(t, ctx, "start", "{{商品名称}}")
	if _, last := watchProgress(t, ctx, ""); last.State != "PARTIAL" {
		t.Fatalf("task ended %+v, want PARTIAL", last)
	}
	if got := text(t, ctx, "#stat-failed"); got != strconv.Itoa(len(refused)) {
		t.Errorf("failed rows %q, want %d", got, len(refused))
	}
	before := mock.Stats().Requests

	// Every state the page shows from here on, in order: without it the
	// first run's PARTIAL with 2 failed, still on the page, would pass for
	// the rerun's end had the page never shown the rerun.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](watchStates)); err != nil {
		t.Fatalf("watch the shown state: %v", err)
	}
	do(t, ctx, "rerun", chromedp.WaitEnabled(chromedp.ID("retry")), chromedp.Click(chromedp.ID("retry")))
	// The rerun reopens the task and sends the failed rows again: wait for
	// the model to have seen them, then for the page to show the end.
	deadline := time.Now().Add(jobDeadline)
	for mock.Stats().Requests-before < int64(len(refused)) {
		if time.Now().After(deadline) {
			t.Fatalf("the rerun sent %d calls within %s, want %d", mock.Stats().Requests-before, jobDeadline, len(refused))
		}
		time.Sleep(pollProgress) // polling the model's counter with a deadline
	}
	if _, last := watchProgress(t, ctx, ""); last.State != "PARTIAL" {
		t.Fatalf("rerun ended %+v, want PARTIAL again (the model still refuses those rows)", last)
	}
	if got := mock.Stats().Requests - before; got != int64(len(refused)) {
		t.Errorf("the rerun sent %d calls, want %d: only the failed rows", got, len(refused))
	}
	// The page may show the first run's PARTIAL, or the rerun's counters
	// on their way, when it is first read after the calls (seen once under
	// load: PARTIAL with 0 failed): it must come to the rerun's end.
	want := strconv.Itoa(len(refused))
	var st pageState
	var failed string
	for settle := time.Now().Add(stepDeadline); ; time.Sleep(pollProgress) {
		var err error
		if st, err = chromedp.Run(ctx, chromedp.Evaluate[pageState](readState)); err != nil {
			t.Fatalf("read the page: %v", err)
		}
		failed = text(t, ctx, "#stat-failed")
		if failed == want && st.State == "PARTIAL" || time.Now().After(settle) {
			break
		}
	}
	if failed != want || st.State != "PARTIAL" {
		t.Errorf("after the rerun the page shows %s with %q failed rows, want PARTIAL with %s", st.State, failed, want)
	}
	shown, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.statesShown`))
	if err != nil {
		t.Fatalf("read the states shown: %v", err)
	}
	if reopened := slices.IndexFunc(shown, func(s string) bool { return s != "PARTIAL" }); reopened < 0 || !slices.Contains(shown[reopened:], "PARTIAL") {
		t.Errorf("states the page showed after the rerun click: %q; want the reopened task, then PARTIAL again", shown)
	}
}

// watchStates records in window.statesShown each state the page shows
// (#current-state's data-state) from the moment it is evaluated.
const watchStates = `(() => {
	const el = document.getElementById("current-state");
	window.statesShown = [];
	new MutationObserver(() => window.statesShown.push(el.dataset.state || "")).
		observe(el, {attributes: true, attributeFilter: ["data-state"]});
	return true;
})()`

// TestBrowserResultSentBackIn: the result of a page upload, edited (two rows
// flagged in its rerun column, one answer cleared) and chosen again, is
// recognised before it starts (the template it carries in its prompt sheet
// fills the editor), only those three rows go to the model, and the task
// says what became of its rows.
func TestBrowserResultSentBackIn(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{Latency: 5 * time.Millisecond})
	model := httptest.NewServer(mock)
	defer model.Close()
	base := serveOwn(t, []string{"OPENAI_API_KEY=test-key"}, "--provider", "openai", "--base-url", model.URL+"/v1")
	ctx := newBrowser(t, "en-US")
	dir := t.TempDir()

	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, writeSheet(t, dir, "teas.xlsx", 12))
	startWithTemplate(t, ctx, "start", "Copy for {{商品名称}}")
	if _, last := watchProgress(t, ctx, ""); last.State != "SUCCEEDED" {
		t.Fatalf("task ended %+v", last)
	}

	// The user's edits to the downloaded result.
	firstID, result := downloadLatest(t, base)
	f, err := excelize.OpenReader(bytes.NewReader(result))
	if err != nil {
		t.Fatal(err)
	}
	header, _ := f.GetRows("Sheet1")
	col := func(name string) string {
		c, _ := excelize.ColumnNumberToName(slices.Index(header[0], name) + 1)
		return c
	}
	for _, edit := range [][2]string{{col("rerun") + "3", "again"}, {col("rerun") + "8", "shorter"}, {col("output") + "5", ""}} {
		if err := f.SetCellStr("Sheet1", edit[0], edit[1]); err != nil {
			t.Fatal(err)
		}
	}
	edited := filepath.Join(dir, "teas.result.xlsx")
	if err := f.SaveAs(edited); err != nil {
		t.Fatal(err)
	}
	f.Close()

	calls := mock.Stats().Requests
	do(t, ctx, "start over", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, edited)
	do(t, ctx, "inspect", chromedp.WaitVisible(chromedp.ID("task-form")))
	if meta := text(t, ctx, "#file-meta"); !strings.Contains(meta, "continues task "+firstID+": 3 rows to run (9 kept, 0 changed, 1 cleared, 2 flagged, 0 failed)") {
		t.Errorf("file line %q, want the result recognised before it starts", meta)
	}
	if tpl, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("template").value`)); err != nil || tpl != "Copy for {{商品名称}}" {
		t.Errorf("template %q (%v), want the one the result carries", tpl, err)
	}
	screenshot(t, ctx, "result-sent-back-in")
	do(t, ctx, "start the rerun", chromedp.Click(chromedp.ID("start")), chromedp.WaitVisible(chromedp.ID("current")))
	if _, last := watchProgress(t, ctx, ""); last.State != "SUCCEEDED" {
		t.Fatalf("rerun ended %+v", last)
	}
	if got := mock.Stats().Requests - calls; got != 3 {
		t.Errorf("%d model calls for the result sent back in, want 3", got)
	}
	if got := text(t, ctx, "#current-rerun"); !strings.Contains(got, "Continues task "+firstID+": 3 rows sent again") || !strings.Contains(got, "9 kept") {
		t.Errorf("task line %q, want what became of the rows", got)
	}
}

// downloadLatest fetches the id and the result of the newest task through the API.
func downloadLatest(t *testing.T, base string) (string, []byte) {
	t.Helper()
	var list struct {
		Tasks []struct {
			ID string `json:"id"`
		} `json:"tasks"`
	}
	res, err := http.Get(base + "/api/tasks")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(res.Body).Decode(&list)
	res.Body.Close()
	if err != nil || len(list.Tasks) == 0 {
		t.Fatalf("list tasks: %v (%d)", err, len(list.Tasks))
	}
	res, err = http.Get(base + "/api/tasks/" + list.Tasks[0].ID + "/result")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("result: %d %v", res.StatusCode, err)
	}
	return list.Tasks[0].ID, b
}

// TestBrowserDeclaresAnswerColumns: the editor adds typed answer columns (an enum with its values, a required
// yes/no, a date) and removes one, and the model settings ask for five rows a call; the task runs with them, and
// the downloaded result has a column of each type instead of output, every row answered. A result sent back in brings its columns back into the editor from its own prompt sheet.
func TestBrowserDeclaresAnswerColumns(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil)
	ctx := newBrowser(t, "en-US")
	dir := t.TempDir()
	in := writeSheet(t, dir, "products.xlsx", sheetRows)
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, in)
	do(t, ctx, "wait for the template editor", chromedp.WaitVisible(chromedp.ID("task-form")))
	row := func(n int, rest string) string { return fmt.Sprintf(`#outcols .outcol:nth-child(%d) %s`, n, rest) }
	do(t, ctx, "declare four columns and remove one",
		chromedp.Click(chromedp.ID("outcol-add")), chromedp.SendKeys(chromedp.CSS(row(1, ".outcol-name")), "band"),
		chooseType(1, "enum"),
		chromedp.WaitVisible(chromedp.CSS(row(1, ".outcol-values"))),
		chromedp.SendKeys(chromedp.CSS(row(1, ".outcol-values")), "low|mid|high"),
		chromedp.Click(chromedp.ID("outcol-add")), chromedp.SendKeys(chromedp.CSS(row(2, ".outcol-name")), "dropped"),
		chromedp.Click(chromedp.ID("outcol-add")), chromedp.SendKeys(chromedp.CSS(row(3, ".outcol-name")), "giftable"),
		chooseType(3, "boolean"),
		chromedp.Click(chromedp.CSS(row(3, ".outcol-required input"))),
		chromedp.Click(chromedp.ID("outcol-add")), chromedp.SendKeys(chromedp.CSS(row(4, ".outcol-name")), "launched"),
		chooseType(4, "date"),
		chromedp.Click(chromedp.CSS(row(2, ".outcol-remove"))),
	)
	do(t, ctx, "five rows a call",
		chromedp.Click(chromedp.CSS("details.advanced summary")),
		chromedp.WaitVisible(chromedp.ID("rows_per_call")),
		chromedp.SendKeys(chromedp.ID("rows_per_call"), "5"),
	)
	screenshot(t, ctx, "web-answer-columns")
	startWithTemplate(t, ctx, "start", "Describe {{商品名称}}")
	if _, last := watchProgress(t, ctx, "web-columns-progress"); last.State != "SUCCEEDED" {
		t.Fatalf("task ended %+v", last)
	}
	resp, err := http.Get(base + "/api/tasks")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Tasks []struct {
			RowsPerCall int `json:"rows_per_call"`
		} `json:"tasks"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || len(list.Tasks) == 0 || list.Tasks[0].RowsPerCall != 5 {
		t.Errorf("the task as the API lists it: %+v (%v), want rows_per_call 5", list, err)
	}
	file := download(t, ctx, t.TempDir())
	f, err := excelize.OpenFile(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sh := f.GetSheetName(0)
	all, _ := f.GetRows(sh)
	if diff := cmp.Diff(append(slices.Clone(sheetColumns), "band", "giftable", "launched", "status"), all[0][:len(sheetColumns)+4]); diff != "" {
		t.Fatalf("result header (-want +got):\n%s", diff)
	}
	n := len(sheetColumns)
	for r := 2; r <= sheetRows+1; r++ {
		band, _ := f.GetCellValue(sh, cellRef(n+1, r))
		gift, _ := f.GetCellType(sh, cellRef(n+2, r))
		date, _ := f.GetCellValue(sh, cellRef(n+3, r))
		if !slices.Contains([]string{"low", "mid", "high"}, band) || gift != excelize.CellTypeBool || len(date) != 10 {
			t.Fatalf("row %d: band %q, giftable of type %v, launched %q", r, band, gift, date)
		}
	}

	// The result, chosen again, brings its columns back into the editor.
	do(t, ctx, "open the page again", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	back := filepath.Join(dir, "products.result.xlsx")
	if err := os.Rename(file, back); err != nil {
		t.Fatal(err)
	}
	chooseSheet(t, ctx, back)
	do(t, ctx, "wait for the template editor", chromedp.WaitVisible(chromedp.ID("task-form")))
	names, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#outcols .outcol-name")].map(i => i.value)`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"band", "giftable", "launched"}, names); diff != "" {
		t.Errorf("columns in the editor after choosing the result (-want +got):\n%s", diff)
	}
	if meta := text(t, ctx, "#file-meta"); !strings.Contains(meta, fmt.Sprintf("0 rows to run (%d kept", sheetRows)) {
		t.Errorf("file summary %q, want every row kept", meta)
	}
}

// chooseType picks a type in the n-th answer column's list, as a person's choice fires change.
func chooseType(n int, typ string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
			`(() => { const s = document.querySelector("#outcols .outcol:nth-child(%d) .outcol-type"); s.value = %q; return s.dispatchEvent(new Event("change")); })()`, n, typ)))
		return err
	})
}

func cellRef(col, row int) string {
	ref, _ := excelize.CoordinatesToCellName(col, row)
	return ref
}
