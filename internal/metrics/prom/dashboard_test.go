package prom_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/metrics/prom"
)

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var metricName = regexp.MustCompile(`\bbatchgen_[a-z0-9_]+`)

// TestGrafanaDashboard: infra/grafana/batchgen.json is strict JSON with
// unique panel ids, and every metric its queries name is one the
// Prometheus registry exports (a histogram's _bucket, _sum and _count
// included), so a renamed metric cannot leave a panel empty.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "infra", "grafana", "batchgen.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard lacks a title, uid or panels: %+v", d)
	}

	reg := prom.New(nil)
	for _, def := range metrics.Catalog {
		switch def.Kind {
		case metrics.KindCounter:
			reg.Add(def.Name, 1)
		case metrics.KindHistogram:
			reg.Observe(def.Name, 1)
		case metrics.KindGauge:
			reg.Set(def.Name, 1)
		}
	}
	fams, err := reg.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[f.GetName()+s] = true
			}
		}
	}

	ids := map[int]bool{}
	queried := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			names := metricName.FindAllString(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q query %s names no batchgen metric: %s", p.Title, q.RefID, q.Expr)
			}
			for _, n := range names {
				queried[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
				if !exported[n] {
					t.Errorf("panel %q queries %s, which the registry does not export", p.Title, n)
				}
			}
		}
	}
	// Every family of the catalog is on the dashboard somewhere.
	for _, def := range metrics.Catalog {
		if !queried[def.Prom] {
			t.Errorf("no panel shows %s (%s)", def.Prom, def.Name)
		}
	}
}
