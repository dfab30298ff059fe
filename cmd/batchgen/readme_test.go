package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"
	"mvdan.cc/sh/v3/syntax"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// readmeExempt are README command lines the test does not run, each with
// the reason; keyed by the line as written.
var readmeExempt = map[string]string{
	"batchgen run --in skus.csv --prompt-file prompt.txt --provider bedrock --model us.amazon.nova-lite-v1:0 --region us-east-1": "needs AWS credentials with Bedrock model access; TestRunBedrock runs these flags through the real SDK against a double of the Converse API",
	"batchgen tasks --table TABLE --dlq-url DLQ_URL":                                "needs a deployed stack's table; TestDLQOnSQS (-tags emulator) runs it against moto",
	"batchgen dlq list --queue-url QUEUE_URL --dlq-url DLQ_URL":                     "needs a deployed stack's queues; TestDLQOnSQS (-tags emulator) runs it against moto",
	"batchgen retry TASK --table TABLE --queue-url QUEUE_URL [--error-class CLASS]": "needs a deployed stack's table and queue; TestRetryOnAWS (-tags emulator) runs it against moto",
}

// readmeCommand is one `batchgen ...` command line of the README.
type readmeCommand struct {
	line int    // 1-based line in README.md
	text string // as written
	args []string
}

// TestReadmeCommands runs every `batchgen ...` command line of README.md's
// code blocks (and the command lines in its inline code, such as the
// Operations table's) against the built binary, with the placeholders
// (TASK, DIR, CLASS) replaced by real values of a prepared data directory,
// and fails on a usage error or any exit code but the expected one. So the
// README cannot drift from the binary.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := readmeCommands(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) < 10 {
		t.Fatalf("found only %d batchgen command lines in README.md; the extraction is broken", len(cmds))
	}

	// The model: the mock server, where the README says --provider openai
	// or anthropic (OPENAI_BASE_URL and ANTHROPIC_BASE_URL point the binary
	// at it, as they would any SDK).
	srv := httptest.NewServer(mockserver.New(mockserver.Config{Latency: time.Millisecond, BatchDelay: 2 * time.Second}))
	t.Cleanup(srv.Close)
	env := append(os.Environ(), "OPENAI_BASE_URL="+srv.URL+"/v1", "OPENAI_API_KEY=test-key",
		"ANTHROPIC_BASE_URL="+srv.URL, "ANTHROPIC_API_KEY=test-key")

	// The files the README's commands name, in a fresh working directory.
	work := t.TempDir()
	writeReadmeInputs(t, work)
	run := func(args ...string) result { return runIn(t, work, env, args...) }
	// A finished task for retry: the README's first example.
	first := run("run", "--in", "skus.xlsx", "--prompt", "为商品{{商品名称}}写一段营销文案", "--sim-latency", "1ms")
	if first.code != 0 {
		t.Fatalf("prepare a finished task: exit %d\n%s", first.code, first.stderr)
	}
	finished := taskIDFrom(t, first.stdout)

	for _, c := range cmds {
		name := fmt.Sprintf("line %d: %s", c.line, c.text)
		if reason, ok := readmeExempt[c.text]; ok && reason != "" {
			t.Logf("exempt: %s (%s)", name, reason)
			continue
		}
		t.Run(name, func(t *testing.T) {
			args := make([]string, len(c.args))
			for i, a := range c.args {
				switch a {
				case "TASK":
					if c.args[0] == "cancel" {
						a = stoppedTask(t, work, env) // a task no run is working, so cancel has something to stop
					} else {
						a = finished
					}
				case "DIR":
					a = ".batchgen"
				case "CLASS":
					a = "content_filter"
				}
				if strings.ToUpper(a) == a && regexp.MustCompile(`^[A-Z_]{3,}$`).MatchString(a) {
					t.Fatalf("placeholder %s has no value in the test; add one", a)
				}
				args[i] = a
			}
			if c.args[0] == "mock-llm" {
				serveMockLLMBriefly(t, work, args)
				return
			}
			if c.args[0] == "serve" {
				serveBriefly(t, work, env, args)
				return
			}
			r := runIn(t, work, env, args...)
			if r.code != 0 {
				t.Errorf("exit %d, want 0\nargs: %q\nstdout:\n%s\nstderr:\n%s", r.code, args, r.stdout, r.stderr)
			}
			if strings.Contains(r.stderr, "--help' for usage") {
				t.Errorf("usage error:\n%s", r.stderr)
			}
		})
	}
}

// TestReadmeMakeTargets: every `make TARGET` the README names is a target
// of the Makefile.
func TestReadmeMakeTargets(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)(?:^|`)make ([a-z][a-z0-9-]*)").FindAllStringSubmatch(string(readme), -1) {
		named[m[1]] = true
	}
	for _, want := range []string{"run", "test"} {
		if !named[want] {
			t.Errorf("the README no longer names make %s; this test expects it to", want)
		}
	}
	for target := range named {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
			t.Errorf("README names make %s, but the Makefile has no such target", target)
		}
	}
}

var (
	inlineCommand = regexp.MustCompile("`(batchgen [^`]+)`")
	// commandWords are the words of the command path; an inline span of
	// only these names a command rather than showing a command line.
	commandWords = map[string]bool{"run": true, "tasks": true, "cancel": true, "retry": true, "dlq": true, "list": true,
		"redrive": true, "mock-llm": true, "serve": true, "help": true, "completion": true, "status": true}
)

// readmeCommands extracts the batchgen command lines: those of the fenced
// code blocks (with their continuations and comments, parsed as shell),
// and the inline code spans that give arguments (`batchgen run` alone, or
// `batchgen ...`, names the command). `a|b` alternatives give one command each, `[...]`
// optional parts are kept.
func readmeCommands(readme string) ([]readmeCommand, error) {
	var out []readmeCommand
	lines := strings.Split(readme, "\n")
	fenced := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			if !strings.HasPrefix(strings.TrimSpace(line), "batchgen ") {
				continue
			}
			start, text := i, strings.TrimSpace(line)
			for strings.HasSuffix(text, `\`) && i+1 < len(lines) {
				i++
				text = strings.TrimSuffix(text, `\`) + " " + strings.TrimSpace(lines[i])
			}
			args, err := shellWords(text)
			if err != nil {
				return nil, fmt.Errorf("README.md:%d: %w", start+1, err)
			}
			out = append(out, readmeCommand{line: start + 1, text: strings.Join(append([]string{"batchgen"}, args...), " "), args: args})
			continue
		}
		for _, m := range inlineCommand.FindAllStringSubmatch(line, -1) {
			text := strings.NewReplacer(`\|`, "|", "[", "", "]", "").Replace(m[1])
			for _, alt := range alternatives(text) {
				args, err := shellWords(alt)
				if err != nil {
					return nil, fmt.Errorf("README.md:%d: %w", i+1, err)
				}
				namesOnly := true
				for _, a := range args {
					namesOnly = namesOnly && (commandWords[a] || a == "...")
				}
				if namesOnly {
					continue
				}
				out = append(out, readmeCommand{line: i + 1, text: m[1], args: args})
			}
		}
	}
	return out, nil
}

// alternatives expands the first word with `|` choices: `completion
// bash|zsh|fish` is three command lines.
func alternatives(text string) []string {
	words := strings.Fields(text)
	for i, w := range words {
		if strings.Contains(w, "|") {
			var out []string
			for _, choice := range strings.Split(w, "|") {
				ws := append([]string{}, words...)
				ws[i] = choice
				out = append(out, alternatives(strings.Join(ws, " "))...)
			}
			return out
		}
	}
	return []string{text}
}

// shellWords parses one command line as the shell would and returns its
// words after "batchgen", quotes removed, a trailing comment dropped.
func shellWords(text string) ([]string, error) {
	f, err := syntax.NewParser().Parse(strings.NewReader(text), "")
	if err != nil {
		return nil, err
	}
	if len(f.Stmts) != 1 {
		return nil, fmt.Errorf("%q: want one command", text)
	}
	call, ok := f.Stmts[0].Cmd.(*syntax.CallExpr)
	if !ok || len(call.Args) == 0 {
		return nil, fmt.Errorf("%q: not a simple command", text)
	}
	var words []string
	for _, w := range call.Args {
		s, err := literal(w)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", text, err)
		}
		words = append(words, s)
	}
	if words[0] != "batchgen" {
		return nil, fmt.Errorf("%q does not start with batchgen", text)
	}
	return words[1:], nil
}

// literal is a word's value with its quotes removed; expansions are
// refused (a README command line should be runnable as written).
func literal(w *syntax.Word) (string, error) {
	var b strings.Builder
	for _, p := range w.Parts {
		switch p := p.(type) {
		case *syntax.Lit:
			b.WriteString(p.Value)
		case *syntax.SglQuoted:
			b.WriteString(p.Value)
		case *syntax.DblQuoted:
			for _, q := range p.Parts {
				lit, ok := q.(*syntax.Lit)
				if !ok {
					return "", errors.New("an expansion inside double quotes")
				}
				b.WriteString(lit.Value)
			}
		default:
			return "", fmt.Errorf("word part %T is not a literal", p)
		}
	}
	return b.String(), nil
}

// writeReadmeInputs writes the files the README's commands name.
func writeReadmeInputs(t *testing.T, dir string) {
	t.Helper()
	f := excelize.NewFile()
	defer f.Close()
	rows := [][]any{{"商品名称", "类目"}, {"保温杯", "家居"}, {"蓝牙耳机", "数码"}, {"帆布包", "箱包"}}
	for i, r := range rows {
		if err := f.SetSheetRow("Sheet1", fmt.Sprintf("A%d", i+1), &r); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.SaveAs(filepath.Join(dir, "skus.xlsx")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "skus.csv"), "商品名称,类目\n保温杯,家居\n蓝牙耳机,数码\n")
	// The worked example of typed columns: the repository's own files.
	if err := os.MkdirAll(filepath.Join(dir, "examples"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"products.csv", "product-schema.json"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "examples", name))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "examples", name), string(b))
	}
	writeFile(t, filepath.Join(dir, "prompt.txt"), "为商品{{商品名称}}（类目：{{类目}}）写一段 50 字以内的营销文案\n")
	// The README's providers-sim.yaml, as shown there.
	writeFile(t, filepath.Join(dir, "providers-sim.yaml"), "routing: weighted\nproviders:\n  - {name: fast, kind: sim, latency: 50ms, concurrency: 8, weight: 3}\n  - {name: slow, kind: sim, latency: 300ms, concurrency: 4, weight: 1}\n")
	// The README's prices.yaml, as shown there.
	writeFile(t, filepath.Join(dir, "prices.yaml"), "models:\n  gpt-4o-mini: {input_per_mtok: 0.15, output_per_mtok: 0.60, cached_input_per_mtok: 0.075}\n  qwen2.5:7b: {input_per_mtok: 0.02, output_per_mtok: 0.02}\n")
}

// runIn runs the binary in dir with env.
func runIn(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir, cmd.Env = dir, env
	return runCmd(t, cmd)
}

// stoppedTask starts a slow job in dir's data directory and SIGKILLs it
// once its task exists: a RUNNING task that no process is working.
func stoppedTask(t *testing.T, dir string, env []string) string {
	t.Helper()
	name := fmt.Sprintf("slow-%d.csv", time.Now().UnixNano())
	var b strings.Builder
	b.WriteString("商品名称\n")
	for i := range 50 {
		fmt.Fprintf(&b, "%s 商品%d\n", name, i) // content of its own: a new task
	}
	writeFile(t, filepath.Join(dir, name), b.String())
	cmd := exec.Command(binary, "run", "--in", name, "--prompt", "{{商品名称}}", "--sim-latency", "1h", "--batch-size", "10")
	cmd.Dir, cmd.Env = dir, env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGKILL); _ = cmd.Wait() }()
	started := regexp.MustCompile(`started task ([0-9a-f]{20})`)
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if m := started.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, stderr) }()
			return m[1]
		}
	}
	t.Fatalf("the slow job never reported its task")
	return ""
}

// serveMockLLMBriefly runs the README's mock-llm command on a free port,
// waits for it to listen, and stops it as Ctrl-C would.
func serveMockLLMBriefly(t *testing.T, dir string, args []string) {
	t.Helper()
	for i, a := range args {
		if a == "--addr" && i+1 < len(args) {
			args[i+1] = "127.0.0.1:0"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Dir = dir
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(line, "listening on http://127.0.0.1:") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("mock-llm did not start: %q %v\n%s", line, err, stderr.String())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("mock-llm stopped with %v, want exit 0\n%s", err, stderr.String())
	}
}

// serveBriefly runs the README's serve command on a free loopback port,
// waits for it to listen and answer, and stops it as Ctrl-C would: it must
// exit 0.
func serveBriefly(t *testing.T, dir string, env []string, args []string) {
	t.Helper()
	args = append([]string{}, args...)
	addr := false
	for i, a := range args {
		if a == "--addr" && i+1 < len(args) {
			args[i+1], addr = "127.0.0.1:0", true
		}
	}
	if !addr {
		args = append(args, "--addr", "127.0.0.1:0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Dir, cmd.Env = dir, env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := listenLine.FindStringSubmatch(line)
	if err != nil || m == nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("serve did not start: %q %v\n%s", line, err, stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	resp, err := http.Get(m[1] + "/")
	if err != nil {
		t.Errorf("GET /: %v", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /: %d, want the page", resp.StatusCode)
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve stopped with %v, want exit 0\n%s", err, stderr.String())
	}
}

// TestReadmeWorkedExample runs the README's worked example of typed columns and compares the result workbook, cell
// by cell, with the table the README shows as its real output.
func TestReadmeWorkedExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var want [][]string
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| P-00") {
			var cells []string
			for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
				cells = append(cells, strings.TrimSpace(c))
			}
			want = append(want, cells)
		}
	}
	if len(want) != 6 {
		t.Fatalf("found %d rows of the worked example's table in README.md, want 6", len(want))
	}
	work := t.TempDir()
	writeReadmeInputs(t, work)
	res := runIn(t, work, os.Environ(), "run", "--in", "examples/products.csv", "--prompt", "Product: {{description}}. Classify it for our catalogue.",
		"--columns", "category:enum(kitchen|electronics|clothing)!, price_band:enum(budget|mid|premium)!, giftable:boolean!, summary:text!")
	if res.code != 0 {
		t.Fatalf("exit %d\n%s", res.code, res.stderr)
	}
	f, err := excelize.OpenFile(filepath.Join(work, "examples", "products.result.xlsx"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := f.GetRows(f.GetSheetName(0))
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		got := rows[i+1][:len(w)]
		if strings.Join(got, " | ") != strings.Join(w, " | ") {
			t.Errorf("row %d:\n README %q\n result %q", i+2, w, got)
		}
	}
}
