//go:build browser

package web_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
)

// TestBrowserOffersTheModelsTheServerTakes: the page offers for a task's
// model what the API accepts. A server that routes rows over a providers
// file refuses a task naming a model, so its page shows no model field but
// a line saying why (in the page's language); so does a server without an
// allow-list, which runs its default model only; a server with an
// allow-list suggests those models.
func TestBrowserOffersTheModelsTheServerTakes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	providers := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(providers, []byte("routing: weighted\nproviders:\n  - {name: fast, kind: sim, latency: 50ms, concurrency: 4, weight: 3}\n  - {name: slow, kind: sim, latency: 50ms, concurrency: 2, weight: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	routed := serveOwn(t, nil, "--providers", providers)
	allowed := serveOwn(t, nil, "--allow-models", "gpt-4o-mini,gpt-4o")
	defaultOnly := serveOwn(t, nil)
	in := writeSheet(t, dir, "products.xlsx", 3)

	type modelUI struct {
		FieldShown bool     `json:"fieldShown"`
		NoteShown  bool     `json:"noteShown"`
		Note       string   `json:"note"`
		Options    []string `json:"options"`
	}
	const readModelUI = `(() => ({
		fieldShown: !document.getElementById("model-field").hidden && document.getElementById("model").offsetParent !== null,
		noteShown: !document.getElementById("model-fixed").hidden,
		note: document.getElementById("model-fixed").textContent,
		options: [...document.querySelectorAll("#model-list option")].map(o => o.value),
	}))()`
	look := func(base, language string) modelUI {
		t.Helper()
		ctx := newBrowser(t, language)
		do(t, ctx, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("drop")))
		chooseSheet(t, ctx, in)
		do(t, ctx, "open the model settings", chromedp.WaitVisible(chromedp.ID("task-form")),
			chromedp.Click(chromedp.CSS(`details.advanced summary`)))
		ui, err := chromedp.Run(ctx, chromedp.Evaluate[modelUI](readModelUI))
		if err != nil {
			t.Fatal(err)
		}
		return ui
	}

	got := look(routed, "en-US")
	if got.FieldShown || !got.NoteShown || got.Note == "" {
		t.Errorf("routed server: %+v, want no model field and a note saying why", got)
	}
	if zh := look(routed, "zh-CN"); zh.Note == got.Note || zh.Note == "" {
		t.Errorf("routed server in Chinese: note %q, want it translated (English %q)", zh.Note, got.Note)
	}
	if d := look(defaultOnly, "en-US"); d.FieldShown || !d.NoteShown || d.Note == got.Note || !strings.Contains(d.Note, "default model") {
		t.Errorf("server without an allow-list: %+v, want no model field and a note that it runs its default model", d)
	}
	got = look(allowed, "en-US")
	if !got.FieldShown || got.NoteShown {
		t.Errorf("server with an allow-list: %+v, want the model field and no note", got)
	}
	if diff := cmp.Diff([]string{"gpt-4o-mini", "gpt-4o"}, got.Options); diff != "" {
		t.Errorf("suggested models (-want +got):\n%s", diff)
	}
}
