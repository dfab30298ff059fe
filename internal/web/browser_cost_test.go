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

// TestBrowserMaxCost: on a server that holds a task to a spending cap, the
// page offers the cap among the model settings; a task started with one
// stops at it, and the page says why.
func TestBrowserMaxCost(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prices := filepath.Join(dir, "prices.yaml")
	if err := os.WriteFile(prices, []byte("models:\n  sim-1: {input_per_mtok: 1000, output_per_mtok: 1000}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := serveOwn(t, nil, "--prices", prices)
	in := writeSheet(t, dir, "products.xlsx", 60)
	ctx := newBrowser(t, "en-US")
	do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
	chooseSheet(t, ctx, in)
	do(t, ctx, "set a cap", chromedp.WaitVisible(chromedp.ID("task-form")),
		chromedp.Click(chromedp.CSS(`details.advanced summary`)),
		chromedp.WaitVisible(chromedp.ID("max_cost_usd")),
		chromedp.SendKeys(chromedp.ID("max_tokens"), "50"),
		chromedp.SendKeys(chromedp.ID("max_cost_usd"), "0.5"),
	)
	screenshot(t, ctx, "web-max-cost")
	startWithTemplate(t, ctx, "start with the cap", "Capped: {{商品名称}}")
	wctx, cancel := within(ctx, 60*time.Second)
	defer cancel()
	do(t, wctx, "wait for the task to stop at its cap", chromedp.WaitVisible(chromedp.CSS(`#current-state[data-state="CANCELLED"]`)))
	if why := text(t, ctx, "#current-reason"); !strings.Contains(why, "max cost $0.5000 reached") {
		t.Errorf("the page says %q, want the cap named", why)
	}
	// The rows answered before the stop count, though their batches never
	// finished: the partial result's recount.
	if done := text(t, ctx, "#stat-done"); done == "0 / 60" || !strings.HasSuffix(done, "/ 60") {
		t.Errorf("rows done %q, want the rows answered before the cap stopped the task", done)
	}
	screenshot(t, ctx, "web-max-cost-stopped")
}
