//go:build browser

package web_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

// chromiumPath is the browser the tests drive: $BATCHGEN_CHROMIUM, else
// Debian's /usr/bin/chromium, which scripts/ensure-chromium.sh installs. A
// missing browser fails the test: the browser tests never skip.
func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("BATCHGEN_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no Chromium at %s (%v): run scripts/ensure-chromium.sh, or set BATCHGEN_CHROMIUM", p, err)
	}
	return p
}

// newBrowser starts a headless Chromium with a fresh profile and returns a
// tab. language, when set, is what navigator.language reports. The flags
// keep Chromium from calling home: on a closed network its background
// connections are refused and slow everything down.
func newBrowser(t *testing.T, language string) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.NoSandbox, // CI runs as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	}
	if language != "" {
		opts = append(opts, chromedp.Flag("lang", language), chromedp.Flag("accept-lang", language))
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start Chromium: %v", err)
	}
	if language != "" {
		// navigator.language follows the emulated locale; the flags above
		// cover the Accept-Language header.
		if _, err := chromedp.Call(ctx, emulation.SetLocaleOverride, emulation.SetLocaleOverrideParams{Locale: language}); err != nil {
			t.Fatalf("emulate locale %s: %v", language, err)
		}
	}
	return ctx
}

// artifactsDir is where screenshots go: $BATCHGEN_ARTIFACTS, else
// testdata/artifacts (gitignored).
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("BATCHGEN_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("testdata", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// screenshot saves the whole page as <name>.png in the artifacts folder.
func screenshot(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	file := filepath.Join(artifactsDir(t), name+".png")
	if err := os.WriteFile(file, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", file)
	return file
}

// within bounds a browser step: a page that never gets there fails the
// test instead of hanging it.
func within(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}
