package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// binary is batchgen built once for the tests that run it as a process:
// they kill it, read its exit codes and its stderr as a user would.
var binary string

func TestMain(m *testing.M) {
	// Nearly every test here runs the binary against a model that answers
	// after a delay or paces to a quota, and waits: the package uses about
	// a third of the CPU at -parallel GOMAXPROCS (go test's default). Twice
	// as many at once halves its wall time; an explicit -parallel wins.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		if err := flag.Set("test.parallel", strconv.Itoa(2*runtime.GOMAXPROCS(0))); err != nil {
			fmt.Fprintln(os.Stderr, "set -test.parallel:", err)
			os.Exit(1)
		}
	}
	if raceEnabled {
		// A -race binary sleeps atexit_sleep_ms (1 s by default) before it
		// exits, to give goroutines still running a chance to race. The
		// tests start the binary several hundred times, so that second is
		// most of their wall time; a race found while the command ran still
		// fails it (exit 66).
		if err := os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")); err != nil {
			fmt.Fprintln(os.Stderr, "set GORACE:", err)
			os.Exit(1)
		}
	}
	dir, err := os.MkdirTemp("", "batchgen-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if binary, err = testBinary(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testBinary returns the batchgen binary the tests run: the one named by
// BATCHGEN_TEST_BINARY (scripts/test.sh builds it once for the three
// stages that run this package: unit, chaos and emulator), or one built
// into dir. A named binary must be built as this test binary is, with or
// without -race, and from this module: a stale or foreign one is refused.
func testBinary(dir string) (string, error) {
	if named := os.Getenv("BATCHGEN_TEST_BINARY"); named != "" {
		info, err := buildinfo.ReadFile(named)
		if err == nil {
			err = sameBuild(info, raceEnabled)
		}
		if err != nil {
			return "", fmt.Errorf("BATCHGEN_TEST_BINARY=%s: %w", named, err)
		}
		return named, nil
	}
	binary := filepath.Join(dir, "batchgen")
	args := []string{"build", "-o", binary}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("build batchgen: %w", err)
	}
	return binary, nil
}

type result struct {
	code           int
	stdout, stderr string
}

func runBinary(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	return runCmd(t, exec.CommandContext(ctx, binary, args...))
}

// runCmd runs cmd (the batchgen binary) and returns its exit code and
// output; a binary that could not run at all fails the test.
func runCmd(t *testing.T, cmd *exec.Cmd) result {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run batchgen: %v", err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// productsCSV writes n rows whose prompts are all distinct, so per-prompt
// counts on the mock server are per-row counts.
func productsCSV(t *testing.T, dir string, n int, marker func(i int) string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("sku,商品名称\n")
	for i := 1; i <= n; i++ {
		m := ""
		if marker != nil {
			m = marker(i)
		}
		fmt.Fprintf(&b, "SKU-%05d,商品%d%s\n", i, i, m)
	}
	return writeFile(t, filepath.Join(dir, "skus.csv"), b.String())
}

func readResult(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := excelize.OpenFile(path)
	if err != nil {
		t.Fatalf("open result: %v", err)
	}
	defer f.Close()
	rows, err := f.GetRows(f.GetSheetName(0))
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func TestRunWritesResultInInputOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 150, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "为{{商品名称}}（{{sku}}）写文案", "--sim-latency", "1ms", "--batch-size", "20")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	rows := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	if len(rows) != 151 {
		t.Fatalf("%d rows, want 151", len(rows))
	}
	if got := strings.Join(rows[0], ","); got != "sku,商品名称,output,status,error,error_class,cached,attempts,latency_ms,provider,input_tokens,output_tokens,rerun,batchgen_key" {
		t.Errorf("header = %s", got)
	}
	for i, row := range rows[1:] {
		if row[0] != fmt.Sprintf("SKU-%05d", i+1) || row[3] != "succeeded" {
			t.Fatalf("row %d = %q", i+1, row)
		}
	}
	for _, want := range []string{"rows      150  (succeeded 150, failed 0", "requests  150 this run"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, r.stdout)
		}
	}
	// The same command again continues the same (finished) task: no calls.
	again := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "为{{商品名称}}（{{sku}}）写文案", "--sim-latency", "1ms", "--batch-size", "20")
	if again.code != 0 || !strings.Contains(again.stdout, "requests  0 this run") {
		t.Errorf("rerun: exit %d, stdout:\n%s\nstderr:\n%s", again.code, again.stdout, again.stderr)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	t.Parallel()
	bad := func(name string) string {
		return filepath.Join("..", "..", "internal", "sheet", "testdata", "bad", name)
	}
	tests := []struct {
		name string
		in   string
		args []string
		want string
	}{
		{"pdf renamed xlsx", bad("pdf.xlsx"), nil, "PDF"},
		{"corrupt zip", bad("corrupt.xlsx"), nil, "corrupt.xlsx"},
		{"zip bomb", bad("zipbomb_ratio.xlsx"), nil, "zipbomb_ratio.xlsx"},
		{"legacy xls", bad("legacy.xls"), nil, ".xls"},
		{"password protected", bad("encrypted.xlsx"), nil, "password"},
		{"empty file", bad("empty.csv"), nil, "empty"},
		{"no header", bad("no_header.xlsx"), nil, "header"},
		{"duplicate header", bad("dup_header.xlsx"), nil, "both named"},
		{"blank header", bad("blank_header.xlsx"), nil, "blank_header.xlsx"},
		{"header only", bad("header_only.xlsx"), nil, "no data rows"},
		{"long cell", bad("long_cell.xlsx"), nil, "32767"},
		{"not text in any encoding", bad("binary.csv"), nil, "binary.csv"},
		{"two encodings plausible", filepath.Join("..", "..", "internal", "sheet", "testdata", "encodings", "ambiguous_windows-1252_or_gb18030.csv"), nil,
			"reads plausibly both as windows-1252 (\"ÀÉ\") and as gb18030 (\"郎\"); name the encoding (batchgen run --encoding windows-1252, or --encoding gb18030)"},
		{"too many rows", "", []string{"--max-rows", "3"}, "3"},
		{"unknown placeholder", "", []string{"--prompt", "写{{商品}}"}, `the columns are "sku", "商品名称"`},
		{"unclosed placeholder", "", []string{"--prompt", "写{{商品名称"}, "never closed"},
		{"bad batch size", "", []string{"--batch-size", "0"}, "--batch-size"},
		{"missing input", "/nonexistent/x.xlsx", nil, "no such file"},
		{"ods output", "", []string{"--out", "x.ods"}, ".csv"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			in := tt.in
			if in == "" {
				in = productsCSV(t, dir, 5, nil)
			} else if !strings.HasPrefix(in, "/") {
				// Copy so the data dir default (beside the input) is ours.
				b, err := os.ReadFile(in)
				if err != nil {
					t.Fatal(err)
				}
				in = writeFile(t, filepath.Join(dir, filepath.Base(in)), string(b))
			}
			args := []string{"run", "--in", in, "--prompt", "{{商品名称}}"}
			r := runBinary(t, context.Background(), append(args, tt.args...)...)
			if r.code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", r.code, r.stderr)
			}
			if !strings.Contains(r.stderr, tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, r.stderr)
			}
			if strings.Contains(r.stderr, "panic") || strings.Contains(r.stderr, "goroutine ") {
				t.Errorf("stderr shows a panic:\n%s", r.stderr)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != filepath.Base(in) {
					t.Errorf("rejected input left %s behind", e.Name())
				}
			}
		})
	}
}

func TestRunExitCode3WhenRowsFail(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(mockserver.New(mockserver.Config{}))
	defer srv.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 30, func(i int) string {
		if i%10 == 0 {
			return " [[filter]]"
		}
		return ""
	})
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{商品名称}}", "--provider", "openai", "--base-url", srv.URL+"/v1")
	if r.code != 3 {
		t.Fatalf("exit %d, want 3; stderr:\n%s", r.code, r.stderr)
	}
	rows := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	failed := 0
	for _, row := range rows[1:] {
		if row[3] == "failed" {
			failed++
			if row[5] != "content_filter" || !strings.Contains(row[1], "[[filter]]") {
				t.Errorf("failed row %q: want content_filter on a marked prompt", row)
			}
		}
	}
	if failed != 3 {
		t.Errorf("%d failed rows, want 3", failed)
	}
}

// TestKillAndResume kills a running job with SIGKILL several times and then
// lets it finish: every row ends with exactly one result, in order, and the
// model saw no second successful call for a row that already had a result
// (beyond the calls in flight at each kill).
func TestKillAndResume(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{Latency: 15 * time.Millisecond})
	watch := newCallWatch(mock)
	srv := httptest.NewServer(watch)
	defer srv.Close()
	dir := t.TempDir()
	const rows, concurrency, kills = 300, 4, 3
	in := productsCSV(t, dir, rows, nil)
	args := []string{"run", "--in", in, "--prompt", "{{sku}} {{商品名称}}", "--provider", "openai", "--base-url", srv.URL + "/v1",
		"--concurrency", fmt.Sprint(concurrency), "--batch-size", "25", "--quiet"}

	for k := 1; k <= kills; k++ {
		cmd := exec.Command(binary, args...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		target := int64(k * rows / (kills + 1))
		select {
		case <-watch.reached(target):
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("kill %d: only %d calls succeeded; stderr:\n%s", k, mock.Stats().Succeeded, errb.String())
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
	}
	twice := finishAndCheckResumed(t, mock, dir, rows, args)
	// Only calls in flight at a kill may be paid twice.
	if twice > kills*concurrency {
		t.Errorf("%d rows paid twice, more than the %d calls that can be in flight at %d kills", twice, kills*concurrency, kills)
	}
}

// TestRPMPacingAvoids429 runs a job against a mock server whose quota
// matches --rpm, enforced per second: paced evenly, the job gets no 429.
func TestRPMPacingAvoids429(t *testing.T) {
	t.Parallel()
	const rpm = 2400 // 40 per second
	mock := mockserver.New(mockserver.Config{Latency: 20 * time.Millisecond, Quota: rpm/60 + 3, QuotaWindow: time.Second})
	srv := httptest.NewServer(mock)
	defer srv.Close()
	dir := t.TempDir()
	in := productsCSV(t, dir, 160, nil)
	r := runBinary(t, context.Background(), "run", "--in", in, "--prompt", "{{sku}}", "--provider", "openai", "--base-url", srv.URL+"/v1",
		"--rpm", fmt.Sprint(rpm), "--concurrency", "16", "--quiet")
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	st := mock.Stats()
	if st.RateLimited != 0 {
		t.Errorf("%d requests got 429 although paced at the quota", st.RateLimited)
	}
	if st.Succeeded != 160 {
		t.Errorf("%d calls succeeded, want 160", st.Succeeded)
	}
}

// TestUnwritableOutputKeepsTask: an output path that cannot be written
// fails with exit 1 and a clear message; the task stays finished, so the
// next run with a good path writes the result without calling the model.
func TestUnwritableOutputKeepsTask(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := productsCSV(t, dir, 20, nil)
	args := []string{"run", "--in", in, "--prompt", "{{sku}}", "--sim-latency", "1ms"}
	r := runBinary(t, context.Background(), append(args, "--out", filepath.Join(dir, "missing-dir", "out.xlsx"))...)
	if r.code != 1 || !strings.Contains(r.stderr, "no such file or directory") || !strings.Contains(r.stderr, "run the same command again") {
		t.Fatalf("exit %d, want 1 with a clear message; stderr:\n%s", r.code, r.stderr)
	}
	r = runBinary(t, context.Background(), append(args, "--out", filepath.Join(dir, "out.xlsx"))...)
	if r.code != 0 || !strings.Contains(r.stdout, "requests  0 this run") {
		t.Fatalf("rerun: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// finishAndCheckResumed runs a killed job to the end and checks what every
// kill test promises: every row has exactly one result, in input order, and
// reached the model. It returns how many rows were paid for twice (calls in
// flight at a kill), for the caller to bound.
func finishAndCheckResumed(t *testing.T, mock *mockserver.Server, dir string, rows int, args []string) int {
	t.Helper()
	r := runBinary(t, context.Background(), args...)
	if r.code != 0 {
		t.Fatalf("final run: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	out := readResult(t, filepath.Join(dir, "skus.result.xlsx"))
	if len(out) != rows+1 {
		t.Fatalf("%d result rows, want %d", len(out)-1, rows)
	}
	for i, row := range out[1:] {
		if row[0] != fmt.Sprintf("SKU-%05d", i+1) || row[3] != "succeeded" {
			t.Fatalf("row %d = %q", i+1, row)
		}
	}
	st := mock.Stats()
	if len(st.PerPrompt) != rows {
		t.Errorf("%d distinct prompts reached the model, want %d", len(st.PerPrompt), rows)
	}
	twice := 0
	for p, s := range st.PerPrompt {
		if s.Succeeded == 0 {
			t.Errorf("prompt %q never succeeded", p)
		}
		if s.Succeeded > 1 {
			twice++
		}
	}
	t.Logf("%d model calls for %d rows; %d rows paid twice (in flight at a kill)", st.Requests, rows, twice)
	return twice
}

// moneyIn reads the first amount pattern captures in text; a text without
// one fails the test.
func moneyIn(t *testing.T, pattern, text string) float64 {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no %s in:\n%s", pattern, text)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sameBuild says whether info is a build of cmd/batchgen with -race as
// race says.
func sameBuild(info *debug.BuildInfo, race bool) error {
	built := false
	for _, s := range info.Settings {
		built = built || (s.Key == "-race" && s.Value == "true")
	}
	if info.Path != "github.com/batchgen/batchgen/cmd/batchgen" || built != race {
		return fmt.Errorf("built from %s with -race=%t; these tests want cmd/batchgen with -race=%t", info.Path, built, race)
	}
	return nil
}

// TestTestBinaryRefusesAnotherBuild: BATCHGEN_TEST_BINARY naming anything
// but a cmd/batchgen build with this test binary's -race setting is
// refused, saying what it is, rather than run in batchgen's place.
func TestTestBinaryRefusesAnotherBuild(t *testing.T) {
	if named := os.Getenv("BATCHGEN_TEST_BINARY"); named != "" && binary != named {
		t.Errorf("binary %s, want the named %s", binary, named)
	}
	for _, path := range []string{filepath.Join(t.TempDir(), "absent"), "/bin/sh"} {
		t.Setenv("BATCHGEN_TEST_BINARY", path)
		if got, err := testBinary(t.TempDir()); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("testBinary with BATCHGEN_TEST_BINARY=%s: %q, %v; want a refusal naming it", path, got, err)
		}
	}
	race := func(v string) []debug.BuildSetting { return []debug.BuildSetting{{Key: "-race", Value: v}} }
	for _, c := range []struct {
		name string
		info debug.BuildInfo
		race bool
		ok   bool
	}{
		{"race build for race tests", debug.BuildInfo{Path: "github.com/batchgen/batchgen/cmd/batchgen", Settings: race("true")}, true, true},
		{"plain build for plain tests", debug.BuildInfo{Path: "github.com/batchgen/batchgen/cmd/batchgen"}, false, true},
		{"plain build for race tests", debug.BuildInfo{Path: "github.com/batchgen/batchgen/cmd/batchgen"}, true, false},
		{"race build for plain tests", debug.BuildInfo{Path: "github.com/batchgen/batchgen/cmd/batchgen", Settings: race("true")}, false, false},
		{"another command", debug.BuildInfo{Path: "github.com/batchgen/batchgen/cmd/batchgen-bench", Settings: race("true")}, true, false},
	} {
		if err := sameBuild(&c.info, c.race); (err == nil) != c.ok {
			t.Errorf("%s: sameBuild = %v, want ok %t", c.name, err, c.ok)
		}
	}
}
