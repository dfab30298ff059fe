package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// TestRunWritesCSV: --out x.csv writes a CSV result of a CSV that German Excel saved (Windows-1252, semicolons):
// UTF-8 with a byte-order mark, the input's delimiter, every input field as it was, then the result columns. Sent
// back in with one row flagged in its rerun column, only that row goes to the model.
func TestRunWritesCSV(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("..", "..", "internal", "sheet", "testdata", "encodings", "excel_de_windows-1252.csv"))
	if err != nil {
		t.Fatal(err)
	}
	in := writeFile(t, filepath.Join(dir, "artikel.csv"), string(src))
	out := filepath.Join(dir, "artikel.result.csv")
	args := []string{"run", in, "--prompt", "Beschreibe {{Artikel}}", "--sim-latency", "1ms", "--quiet"}
	r := runBinary(t, context.Background(), append(args, "--out", out)...)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	first := taskIDFrom(t, r.stdout)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	text, ok := strings.CutPrefix(string(b), "\uFEFF")
	if !ok {
		t.Fatalf("no UTF-8 byte-order mark: %q", b[:min(len(b), 8)])
	}
	lines := strings.Split(strings.TrimSuffix(text, "\r\n"), "\r\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "Artikel;Größe;Beschreibung;output;status;") ||
		!strings.HasPrefix(lines[1], "Müsli;500 g;Hafer, Nüsse und Äpfel;") || !strings.HasPrefix(lines[2], "Straße;groß;„schön“ – 5 €;") {
		t.Fatalf("result lines:\n%s", strings.Join(lines, "\n"))
	}
	if !strings.Contains(lines[1], ";succeeded;") {
		t.Errorf("row 2 did not succeed: %s", lines[1])
	}

	// Flag row 3: the empty rerun column is the one before the key, the last field.
	i := strings.LastIndex(lines[2], ";")
	lines[2] = lines[2][:i] + "noch einmal" + lines[2][i:]
	writeFile(t, out, "\uFEFF"+strings.Join(lines, "\r\n")+"\r\n")
	again := filepath.Join(dir, "again.csv")
	r = runBinary(t, context.Background(), "run", out, "--prompt", "Beschreibe {{Artikel}}", "--sim-latency", "1ms", "--out", again)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "is a result sent back in: continues task "+first+": 1 rows to run: 1 kept, 0 changed, 0 cleared, 1 flagged") ||
		!strings.Contains(r.stdout, "requests  1 this run") {
		t.Errorf("sent back in: stdout\n%s\nstderr\n%s", r.stdout, r.stderr)
	}
	// The task says what became of the rows.
	st := runBinary(t, context.Background(), "status", taskIDFrom(t, r.stdout), "--data", filepath.Join(dir, ".batchgen"))
	if !strings.Contains(st.stdout, "a result sent back in: continues task "+first+": 1 rows to run: 1 kept, 0 changed, 0 cleared, 1 flagged, 0 failed") {
		t.Errorf("status of the task sent back in:\n%s%s", st.stdout, st.stderr)
	}
	b, err = os.ReadFile(again)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(b), "\r\n"); got != 3 || strings.Contains(string(b), "noch einmal") || !strings.Contains(string(b), "Straße;groß;„schön“ – 5 €;") {
		t.Errorf("the rerun's result (%d lines):\n%s", got, b)
	}

	// --out names a kind of file batchgen writes.
	if r := runBinary(t, context.Background(), append(args, "--out", filepath.Join(dir, "x.ods"))...); r.code == 0 || !strings.Contains(r.stderr, ".csv") {
		t.Errorf("--out x.ods: exit %d, stderr %s", r.code, r.stderr)
	}
}

// TestServeDropResultCSV: with --drop-result-format csv a sheet dropped into the folder gets a CSV result named
// after it, in its delimiter.
func TestServeDropResultCSV(t *testing.T) {
	t.Parallel()
	model := mockserver.New(mockserver.Config{Latency: time.Millisecond})
	mock := httptest.NewServer(model)
	t.Cleanup(mock.Close)
	data := t.TempDir()
	startServe(t, data, mock, "--prompt", "Copy for {{name}}", "--drop-result-format", "csv")
	dropCSV(t, data, "semi.csv", "sku;name\r\n1;Müsli\r\n2;Straße\r\n")
	result := filepath.Join(data, "results", "semi.result.csv")
	waitFor(t, "the CSV result of semi.csv", func() bool { return exists(result) })
	b, err := os.ReadFile(result)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimPrefix(string(b), "\uFEFF"), "\r\n")
	if !strings.HasPrefix(string(b), "\uFEFF") || len(lines) != 4 || !strings.HasPrefix(lines[0], "sku;name;output;status;") ||
		!strings.HasPrefix(lines[2], "2;Straße;") || !strings.Contains(lines[2], ";succeeded;") {
		t.Errorf("result:\n%s", b)
	}
}

// TestServeDropResultBackIn: a result taken from the drop folder's results/, edited (one row flagged in its
// rerun column) and dropped back into incoming/, continues as a task: the template it carries in its prompt
// sheet is used (the drop had it from --prompt), and only the flagged row goes to the model.
func TestServeDropResultBackIn(t *testing.T) {
	t.Parallel()
	model := mockserver.New(mockserver.Config{Latency: time.Millisecond})
	mock := httptest.NewServer(model)
	t.Cleanup(mock.Close)
	data := t.TempDir()
	startServe(t, data, mock, "--prompt", "Copy for {{name}}")
	dropCSV(t, data, "teas.csv", rowsCSV(6, "tea"))
	first := filepath.Join(data, "results", "teas.result.xlsx")
	waitFor(t, "the result of teas.csv", func() bool { return exists(first) })

	f, err := excelize.OpenFile(first)
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := f.GetRows(f.GetSheetName(0))
	col, _ := excelize.ColumnNumberToName(slices.Index(rows[0], "rerun") + 1)
	if err := f.SetCellStr(f.GetSheetName(0), col+"4", "again"); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := f.Write(&b); err != nil {
		t.Fatal(err)
	}
	f.Close()
	calls := model.Stats().Requests
	dropCSV(t, data, "teas.edited.xlsx", b.String())
	again := filepath.Join(data, "results", "teas.edited.result.xlsx")
	waitFor(t, "the result of the edited result", func() bool { return exists(again) })
	if got := model.Stats().Requests - calls; got != 1 {
		t.Errorf("%d model calls for the result dropped back in, want 1 (the flagged row)", got)
	}
	back := readResult(t, again)
	if len(back) != 7 || !slices.Equal(back[0], rows[0]) {
		t.Fatalf("result of the result: %d rows, header %q", len(back), back[0])
	}
}
