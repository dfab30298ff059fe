//go:build browser

package web_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserQuoteFirst: "Quote first" holds the task while a sample of
// its rows is answered, then shows what the rest costs and takes online,
// in economy and in auto, each with its Start; starting economy runs the
// rest through the simulator's batch API to the end.
func TestBrowserQuoteFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prices := filepath.Join(dir, "prices.yaml")
	if err := os.WriteFile(prices, []byte("models:\n  sim-1: {input_per_mtok: 1000, output_per_mtok: 1000}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := serveOwn(t, nil, "--prices", prices, "--batch-poll", "1s")
	in := writeSheet(t, dir, "products.xlsx", 60)
	ctx := newBrowser(t, "en-US")
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, in)
	do(t, ctx, "ask for a quote first",
		chromedp.WaitVisible(chromedp.ID("quote-first")),
		clearTemplate,
		chromedp.SendKeys(chromedp.ID("template"), "Quoted: {{商品名称}}"),
		chromedp.Click(chromedp.ID("quote-first")),
		chromedp.WaitVisible(chromedp.ID("current")),
	)
	qctx, stop := within(ctx, 30*time.Second)
	defer stop()
	do(t, qctx, "wait for the plans", chromedp.WaitVisible(chromedp.ID("plans-table")))
	if st := text(t, ctx, "#current-state"); st != "quote ready" {
		t.Errorf("state %q, want quote ready (held)", st)
	}
	status := text(t, ctx, "#quote-status")
	if !strings.Contains(status, "Measured on 20 answered rows") || !strings.Contains(status, "40 rows left") {
		t.Errorf("quote status %q, want 20 rows measured and 40 left", status)
	}
	online := text(t, ctx, `#plans tr[data-plan="online"]`)
	economy := text(t, ctx, `#plans tr[data-plan="economy"]`)
	auto := text(t, ctx, `#plans tr[data-plan="auto"]`)
	if !strings.Contains(online, "$") || !strings.Contains(online, "about") || !strings.Contains(economy, "$") || !strings.Contains(economy, "batch window") || !strings.Contains(auto, "done within 6 h") {
		t.Errorf("plans:\n%s\n%s\n%s\nwant cost and time for online, economy and auto (6 h)", online, economy, auto)
	}
	if done := text(t, ctx, "#stat-done"); done != "20 / 60" {
		t.Errorf("rows done %q while held, want the sample's 20 / 60", done)
	}
	screenshot(t, ctx, "web-quote")
	do(t, ctx, "start economy", chromedp.Click(chromedp.CSS(`#plans tr[data-plan="economy"] button`)))
	wctx, cancel := within(ctx, 60*time.Second)
	defer cancel()
	do(t, wctx, "wait for the task to finish", chromedp.WaitVisible(chromedp.CSS(`#current-state[data-state="SUCCEEDED"]`)))
	if done := text(t, ctx, "#stat-done"); done != "60 / 60" {
		t.Errorf("rows done %q, want 60 / 60", done)
	}
	if mode := text(t, ctx, "#current-mode"); !strings.Contains(mode, "provider's batch API") || strings.Contains(mode, "Waiting") {
		t.Errorf("the page says %q of the finished task's mode, want economy and no wait", mode)
	}
	screenshot(t, ctx, "web-quote-done")
}
