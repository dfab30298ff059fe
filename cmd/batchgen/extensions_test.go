package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xuri/excelize/v2"
)

// TestRunAcceptsExtensionsInAnyCase runs inputs saved as Windows and Excel users name them. The format comes from
// the content; the name only picks tab separation (.TSV) and the default result name.
func TestRunAcceptsExtensionsInAnyCase(t *testing.T) {
	t.Parallel()
	const csv = "sku,商品名称\nA1,积木\nA2,拼图\n"
	workbook := func(t *testing.T) string {
		f := excelize.NewFile()
		defer f.Close()
		for i, row := range [][]any{{"sku", "商品名称"}, {"A1", "积木"}, {"A2", "拼图"}} {
			cell, _ := excelize.CoordinatesToCellName(1, i+1)
			if err := f.SetSheetRow("Sheet1", cell, &row); err != nil {
				t.Fatal(err)
			}
		}
		buf, err := f.WriteToBuffer()
		if err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	cases := []struct {
		in, content, out, wantResult string
	}{
		{in: "SKUS.CSV", content: csv, wantResult: "SKUS.result.xlsx"},
		{in: "skus.Csv", content: csv, wantResult: "skus.result.xlsx"},
		{in: "SKUS.XLSX", wantResult: "SKUS.result.xlsx"},
		{in: "skus.Xlsx", wantResult: "skus.result.xlsx"},
		{in: "SKUS.TSV", content: strings.ReplaceAll(csv, ",", "\t"), wantResult: "SKUS.result.xlsx"},
		{in: "skus.xlsx", out: "RESULT.XLSX", wantResult: "RESULT.XLSX"},
	}
	for _, c := range cases {
		t.Run(c.in+"->"+c.wantResult, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			content := c.content
			if content == "" {
				content = workbook(t)
			}
			in := writeFile(t, filepath.Join(dir, c.in), content)
			args := []string{"run", "--in", in, "--prompt", "为{{商品名称}}写文案", "--sim-latency", "1ms"}
			if c.out != "" {
				args = append(args, "--out", filepath.Join(dir, c.out))
			}
			r := runBinary(t, context.Background(), args...)
			if r.code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
			}
			rows := readResult(t, filepath.Join(dir, c.wantResult))
			if len(rows) != 3 || rows[1][0] != "A1" || rows[2][1] != "拼图" || rows[2][3] != "succeeded" {
				t.Errorf("result rows = %q", rows)
			}
			if _, err := os.Stat(filepath.Join(dir, c.wantResult)); err != nil {
				t.Error(err)
			}
		})
	}
}
