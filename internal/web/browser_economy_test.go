//go:build browser

package web_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserEconomy: on a server that runs provider batches, the page
// offers the mode among the model settings (the deadline only for auto); a
// task started in economy waits for the simulator's batch API, says so,
// and finishes.
func TestBrowserEconomy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base := serveOwn(t, nil, "--batch-poll", "1s")
	in := writeSheet(t, dir, "products.xlsx", 40)
	ctx := newBrowser(t, "en-US")
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, in)
	do(t, ctx, "open the settings", chromedp.WaitVisible(chromedp.ID("task-form")),
		chromedp.Click(chromedp.CSS(`details.advanced summary`)),
		chromedp.WaitVisible(chromedp.ID("mode")),
	)
	choose := func(mode string) {
		t.Helper()
		js := `(() => { const m = document.getElementById("mode"); m.value = "` + mode + `"; m.dispatchEvent(new Event("change")); return true; })()`
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js)); err != nil {
			t.Fatalf("choose %s: %v", mode, err)
		}
	}
	choose("auto")
	do(t, ctx, "the deadline offered for auto", chromedp.WaitVisible(chromedp.ID("deadline_hours")))
	choose("economy")
	do(t, ctx, "no deadline for economy", chromedp.WaitNotVisible(chromedp.ID("deadline_hours")))
	screenshot(t, ctx, "web-economy")
	startWithTemplate(t, ctx, "start in economy", "Economy: {{商品名称}}")
	if mode := text(t, ctx, "#current-mode"); !strings.Contains(mode, "provider's batch API") {
		t.Errorf("the page says %q of the mode, want economy named", mode)
	}
	// While the simulator's batch runs (3 s), the page says it waits on it.
	pctx, stop := within(ctx, 20*time.Second)
	defer stop()
	do(t, pctx, "wait for the page to show the provider batch", chromedp.WaitVisible(chromedp.Search(`//p[@id="current-mode" and contains(., "Waiting on 1 provider batch")]`)))
	screenshot(t, ctx, "web-economy-waiting")
	wctx, cancel := within(ctx, 60*time.Second)
	defer cancel()
	do(t, wctx, "wait for the task to finish", chromedp.WaitVisible(chromedp.CSS(`#current-state[data-state="SUCCEEDED"]`)))
	if done := text(t, ctx, "#stat-done"); done != "40 / 40" {
		t.Errorf("rows done %q, want 40 / 40", done)
	}
	screenshot(t, ctx, "web-economy-done")
}
