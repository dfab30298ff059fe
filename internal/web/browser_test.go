//go:build browser

package web_test

// The page in a real headless Chromium against a real `batchgen serve`
// (embedded runtime: SQLite, file blobs, the sim model with latency so the
// progress bar has time to move). Run with
//
//	scripts/ensure-chromium.sh && go test -tags browser ./internal/web
//
// Screenshots land in testdata/artifacts (gitignored) or $BATCHGEN_ARTIFACTS.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"
)

// Rows of the test sheet and the server's pace: 80 rows, 2 calls at a
// time, 150 ms each, is about 6 s of work, long enough for several
// progress events (at most one a second) and polls.
const (
	sheetRows     = 80
	simLatency    = "150ms"
	concurrency   = "2"
	jobDeadline   = 90 * time.Second
	stepDeadline  = 20 * time.Second
	pollProgress  = 40 * time.Millisecond
	batchgenBuild = 3 * time.Minute
)

var sheetColumns = []string{"sku", "商品名称", "类目"}

// binary is cmd/batchgen, built once for the tests of this package.
var binary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary.dir != "" {
		os.RemoveAll(binary.dir)
	}
	os.Exit(code)
}

// serveOwn starts a `batchgen serve` of the test's own, with env added to
// its environment and args to its flags, and stops it when the test ends.
func serveOwn(t *testing.T, env []string, args ...string) string {
	t.Helper()
	url, stop, err := startServe(env, args...)
	if err != nil {
		t.Fatalf("batchgen serve: %v", err)
	}
	t.Cleanup(stop)
	return url
}

func buildBatchgen() (string, error) {
	binary.once.Do(func() {
		binary.dir, binary.err = os.MkdirTemp("", "batchgen-browser-bin-*")
		if binary.err != nil {
			return
		}
		binary.path = filepath.Join(binary.dir, "batchgen")
		ctx, cancel := context.WithTimeout(context.Background(), batchgenBuild)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", binary.path, "github.com/batchgen/batchgen/cmd/batchgen").CombinedOutput()
		if err != nil {
			binary.err = fmt.Errorf("go build ./cmd/batchgen: %v\n%s", err, out)
		}
	})
	return binary.path, binary.err
}

// startServe starts `batchgen serve` on a free loopback port with a fresh
// data directory and the sim model (args may choose another, or a
// providers file), and returns its base URL once it listens.
func startServe(env []string, args ...string) (string, func(), error) {
	bin, err := buildBatchgen()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "batchgen-browser-*")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data", filepath.Join(dir, "data"), "--batch-size", "10", "--log-level", "warn")
	if !slices.Contains(args, "--providers") {
		// A providers file gives each provider's model settings instead.
		cmd.Args = append(cmd.Args, "--sim-latency", simLatency, "--sim-jitter", "0s", "--concurrency", concurrency)
	}
	cmd.Args = append(cmd.Args, args...)
	dieWithTest(cmd)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cleanup()
		return "", nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &lockedWriter{w: &stderr}
	if err := cmd.Start(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("start: %w", err)
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		cleanup()
	}
	// The server prints "listening on http://HOST:PORT" once it listens;
	// the reader goes on draining stdout so the server never blocks on it.
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`listening on (http://[^\s]+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		close(found)
	}()
	select {
	case url, ok := <-found:
		if !ok {
			stop()
			return "", nil, fmt.Errorf("exited before listening; stderr:\n%s", stderr.String())
		}
		return url, stop, nil
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, fmt.Errorf("did not say it listens within 30s; stderr:\n%s", stderr.String())
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// writeSheet writes the test workbook: sku, 商品名称, 类目, with rows
// numbered so the result's order can be checked.
func writeSheet(t *testing.T, dir, name string, rows int) string {
	t.Helper()
	f := excelize.NewFile()
	defer f.Close()
	header := make([]any, len(sheetColumns))
	for i, c := range sheetColumns {
		header[i] = c
	}
	if err := f.SetSheetRow("Sheet1", "A1", &header); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= rows; i++ {
		row := []any{fmt.Sprintf("SKU-%03d", i), fmt.Sprintf("绿茶 %d", i), "饮料"}
		if err := f.SetSheetRow("Sheet1", "A"+strconv.Itoa(i+1), &row); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, name)
	if err := f.SaveAs(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// chooseSheet sets the file input, as a drop or the file picker does.
func chooseSheet(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	sctx, cancel := within(ctx, stepDeadline)
	defer cancel()
	if err := chromedp.Do(sctx, chromedp.SetUploadFiles(chromedp.ID("file"), []string{path})); err != nil {
		t.Fatalf("choose %s: %v", path, err)
	}
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	sctx, cancel := within(ctx, stepDeadline)
	defer cancel()
	s, err := chromedp.Run(sctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := within(ctx, stepDeadline)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestBrowserShowsWhyAFileIsRejected: a sheet the reader refuses and a
// file that is not a sheet each show the reason in words; a good sheet
// after them clears it.
func TestBrowserShowsWhyAFileIsRejected(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil)
	ctx := newBrowser(t, "en-US")
	dir := t.TempDir()
	headerOnly := filepath.Join(dir, "empty.csv")
	notSheet := filepath.Join(dir, "notes.txt")
	for path, content := range map[string]string{headerOnly: "sku,name\n", notSheet: "hello"} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))

	chooseSheet(t, ctx, headerOnly)
	do(t, ctx, "wait for the error", chromedp.WaitVisible(chromedp.ID("error")))
	if got := text(t, ctx, "#error-title"); got != "The file was not accepted." {
		t.Errorf("error title %q", got)
	}
	if got := text(t, ctx, "#error-message"); !strings.Contains(got, "empty.csv") || !strings.Contains(got, "no data rows") {
		t.Errorf("error message %q does not say the file has no data rows", got)
	}
	screenshot(t, ctx, "web-rejected")

	chooseSheet(t, ctx, notSheet)
	do(t, ctx, "wait for the type error", chromedp.WaitVisible(chromedp.ID("error")))
	if got := text(t, ctx, "#error-message"); !strings.Contains(got, ".xlsx") {
		t.Errorf("a .txt file: message %q does not name the accepted kinds", got)
	}

	// A good sheet after the bad ones clears the message and offers its
	// columns.
	chooseSheet(t, ctx, writeSheet(t, dir, "good.xlsx", 3))
	do(t, ctx, "wait for the template editor", chromedp.WaitVisible(chromedp.ID("task-form")), chromedp.WaitNotVisible(chromedp.ID("error")))
	cols, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#columns .chip")].map(b => b.dataset.column)`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sheetColumns, cols); diff != "" {
		t.Errorf("columns offered as placeholders (-want +got):\n%s", diff)
	}
}

// TestBrowserSpeaksChinese: a browser whose language is Chinese gets the
// page in Chinese, rejections included, and can switch to English.
func TestBrowserSpeaksChinese(t *testing.T) {
	t.Parallel()
	base := serveOwn(t, nil)
	ctx := newBrowser(t, "zh-CN")
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	lang, err := chromedp.Run(ctx, chromedp.Evaluate[string](`navigator.language`))
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string]string{"#new-task h2": "新建任务", "#tasks-card h2": "我的任务", ".drop-main": "把表格拖到这里，或点击选择文件"}
	for sel, want := range checks {
		if got := text(t, ctx, sel); got != want {
			t.Errorf("navigator.language %s: %s reads %q, want %q", lang, sel, got, want)
		}
	}
	bad := filepath.Join(t.TempDir(), "空.csv")
	if err := os.WriteFile(bad, []byte("商品\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	chooseSheet(t, ctx, bad)
	do(t, ctx, "wait for the error", chromedp.WaitVisible(chromedp.ID("error")))
	if got := text(t, ctx, "#error-title"); got != "文件未被接受。" {
		t.Errorf("error title %q, want the Chinese one", got)
	}
	screenshot(t, ctx, "web-zh")

	do(t, ctx, "switch to English", chromedp.Click(chromedp.CSS(`.lang-btn[data-lang="en"]`)))
	if got := text(t, ctx, "#new-task h2"); got != "New task" {
		t.Errorf("after switching to English the heading reads %q", got)
	}
	if got := text(t, ctx, "#error-title"); got != "The file was not accepted." {
		t.Errorf("after switching to English the error title reads %q", got)
	}
}
