package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRunNamesTheEncoding runs a Windows-1252 CSV (whose bytes are valid GB18030 too) as detected and as forced with
// --encoding: the summary and the start line name the encoding, the result holds the text as read, and another
// reading of the same bytes is another task.
func TestRunNamesTheEncoding(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "internal", "sheet", "testdata", "encodings", "excel_fr_windows-1252_also_gb18030.csv"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in := writeFile(t, filepath.Join(dir, "catalogue.csv"), string(data))
	result := filepath.Join(dir, "catalogue.result.xlsx")

	detected := runBinary(t, context.Background(), "run", in, "--prompt", "Décris {{Entrées}}", "--sim-latency", "1ms")
	if detected.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", detected.code, detected.stderr)
	}
	if !strings.Contains(detected.stdout, "input     catalogue.csv  (windows-1252)\n") || !strings.Contains(detected.stderr, ", read as windows-1252 (data:") {
		t.Errorf("the encoding is not named; stdout:\n%s\nstderr:\n%s", detected.stdout, detected.stderr)
	}
	rows := readResult(t, result)
	if diff := cmp.Diff([]string{"Catégorie", "Entrées", "Prix"}, rows[0][:3]); diff != "" {
		t.Errorf("result header (-want +got):\n%s", diff)
	}

	forced := runBinary(t, context.Background(), "run", in, "--encoding", "GB18030", "--prompt", "{{Prix}}", "--sim-latency", "1ms")
	if forced.code != 0 {
		t.Fatalf("--encoding gb18030: exit %d, stderr:\n%s", forced.code, forced.stderr)
	}
	if !strings.Contains(forced.stdout, "(gb18030)") {
		t.Errorf("--encoding gb18030: the encoding is not named:\n%s", forced.stdout)
	}
	if a, b := taskIDFrom(t, detected.stdout), taskIDFrom(t, forced.stdout); a == b {
		t.Errorf("both readings ran as task %s", a)
	}
	if got := readResult(t, result)[0][0]; got != "Cat間orie" {
		t.Errorf("forced gb18030: result header starts %q, want %q", got, "Cat間orie")
	}

	unknown := runBinary(t, context.Background(), "run", in, "--encoding", "klingon", "--prompt", "{{Prix}}")
	if unknown.code != 2 || !strings.Contains(unknown.stderr, `catalogue.csv: unknown encoding "klingon"`) {
		t.Errorf("--encoding klingon: exit %d, stderr:\n%s", unknown.code, unknown.stderr)
	}
}
