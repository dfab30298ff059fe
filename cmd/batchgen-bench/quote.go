package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
)

// measureQuote: issue 19's quote. `batchgen quote` on a sheet, then `batchgen
// run` with the same flags, against mock-llm standing in for OpenAI at
// gpt-4o-mini's list price: how far the quoted cost (the sample's and the
// rows left's) lies from what the run reports, on the bundled example and
// on 2,000 rows of the bench's five-column sheet.
func measureQuote(ctx context.Context, r *run) ([]Figure, error) {
	m, err := r.mock(ctx, "--latency", "0")
	if err != nil {
		return nil, err
	}
	defer m.Stop()
	five, err := r.xlsxFive(2000)
	if err != nil {
		return nil, err
	}
	sheets := []struct {
		id, name, in, prompt string
	}{
		{"quote-example", "the bundled example (200 rows)", filepath.Join("examples", "skus.xlsx"), "为商品{{商品名称}}写一段营销文案"},
		// The SKU makes every row's question its own; without it the rows
		// ask a few questions many times, each answered once.
		{"quote-bench", "2,000 rows of five columns", five, "为{{商品名称}}（{{SKU}}，{{类目}}，{{颜色}}）写一段突出{{卖点}}的文案"},
		{"quote-repeated", "2,000 rows asking few questions, many times", five, "为{{商品名称}}（{{类目}}，{{颜色}}）写一段突出{{卖点}}的文案"},
	}
	var figs []Figure
	for _, s := range sheets {
		args := []string{"--in", s.in, "--data", r.dir("data-" + s.id), "--out", filepath.Join(r.dir("out-"+s.id), "result.xlsx"),
			"--prompt", s.prompt, "--provider", "openai", "--base-url", m.URL, "--model", "gpt-4o-mini", "--rpm", "60000", "--quiet"}
		q, err := r.timed(ctx, r.bin, append([]string{"quote"}, args...)...)
		if err != nil {
			return nil, fmt.Errorf("quote %s: %w", s.name, err)
		}
		spent, err1 := money(`they cost \$([0-9.]+)`, q.stdout)
		rest, err2 := money(`online +\$([0-9.]+)`, q.stdout)
		run, err3 := r.timed(ctx, r.bin, append([]string{"run"}, args...)...)
		if err3 != nil {
			return nil, fmt.Errorf("run %s after its quote: %w", s.name, err3)
		}
		actual, err4 := money(`estimated cost \$([0-9.]+)`, run.stdout)
		for _, err := range []error{err1, err2, err4} {
			if err != nil {
				return nil, fmt.Errorf("%s: %w\nquote:\n%s\nrun:\n%s", s.name, err, q.stdout, run.stdout)
			}
		}
		quoted := spent + rest
		figs = append(figs, Figure{ID: s.id, Name: "quote: cost quoted vs the run's, " + s.name + " (|quoted - run| / run)",
			Value: math.Abs(quoted-actual) / actual, Better: AtMost, Bound: 0.15,
			Detail: fmt.Sprintf("quoted $%.6f (a sample of 20, kept, then the rows left), the run reported $%.6f; mock-llm as OpenAI at gpt-4o-mini's price", quoted, actual)})
	}
	return figs, nil
}

// money reads the first dollar amount pattern captures in text.
func money(pattern, text string) (float64, error) {
	m := regexp.MustCompile(pattern).FindStringSubmatch(text)
	if m == nil {
		return 0, fmt.Errorf("no %s", pattern)
	}
	return strconv.ParseFloat(m[1], 64)
}
