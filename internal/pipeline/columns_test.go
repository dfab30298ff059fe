package pipeline_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/store"
)

// productColumns is the README's worked example: a category, a price band, a yes/no and a one-line summary, plus
// a date, a score and a list so that every cell type is written.
var productColumns = schema.Columns{
	{Name: "category", Type: schema.Enum, Values: []string{"家居", "数码", "服饰"}, Required: true},
	{Name: "price_band", Type: schema.Enum, Values: []string{"low", "mid", "high"}},
	{Name: "giftable", Type: schema.Boolean, Required: true},
	{Name: "summary", Type: schema.Text, Required: true, Description: "one line"},
	{Name: "launched", Type: schema.Date},
	{Name: "score", Type: schema.Number},
	{Name: "units", Type: schema.Integer},
	{Name: "tags", Type: schema.List},
}

// splitWithColumns splits n product rows into a task declaring cols.
func (e *env) splitWithColumns(label string, n int, cols schema.Columns, format store.ResultFormat) pipeline.SplitParams {
	e.t.Helper()
	spec := store.TaskSpec{Prompt: "为{{name}}（{{id}}）归类", Provider: "sim", BatchSize: 10, Columns: cols, ResultFormat: format}
	p := pipeline.SplitParams{
		TaskID: pipeline.DeriveTaskID(label, spec), Source: "in.csv", Spec: spec,
		Path: e.writeCSV("in.csv", []string{"id", "name"}, productRows(n)),
	}
	if _, err := e.splitter.Split(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// TestDeclaredColumnsBecomeTypedCells runs a task declaring every type on the simulator and opens its result as
// Excel would: one column per declared column in order instead of output, each cell of its type, the sim's text
// quoting the row's prompt, and the numeric bookkeeping as numbers.
func TestDeclaredColumnsBecomeTypedCells(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{Concurrency: 4})
	p := e.splitWithColumns("typed", 25, productColumns, store.ResultWorkbook)
	done := e.runToCompletion(context.Background(), p.TaskID)
	if done.State != store.TaskSucceeded {
		t.Fatalf("state %s, want SUCCEEDED", done.State)
	}
	f := openResult(t, e, done)
	sh := f.GetSheetName(0)
	rows, err := f.GetRows(sh)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string{"id", "name"}, productColumns.Names()...)
	want = append(want, pipeline.ResultColumns[1:]...)
	if diff := cmp.Diff(want, rows[0]); diff != "" {
		t.Fatalf("header (-want +got):\n%s", diff)
	}
	col := func(name string) int { return slices.Index(rows[0], name) + 1 }
	for r := 2; r <= 26; r++ {
		cell := func(name string) (string, excelize.CellType) {
			ref, _ := excelize.CoordinatesToCellName(col(name), r)
			v, _ := f.GetCellValue(sh, ref)
			typ, _ := f.GetCellType(sh, ref)
			return v, typ
		}
		if v, _ := cell("status"); v != "succeeded" {
			t.Fatalf("row %d: status %q", r, v)
		}
		if v, typ := cell("category"); !slices.Contains(productColumns[0].Values, v) || !isText(typ) {
			t.Errorf("row %d: category %q (%v), want one of the values, as text", r, v, typ)
		}
		if v, typ := cell("giftable"); (v != "TRUE" && v != "FALSE") || typ != excelize.CellTypeBool {
			t.Errorf("row %d: giftable %q (%v), want a boolean", r, v, typ)
		}
		if v, _ := cell("summary"); !strings.Contains(v, fmt.Sprintf("商品%d", r-1)) {
			t.Errorf("row %d: summary %q does not quote the row's prompt", r, v)
		}
		if v, typ := cell("launched"); !isISODate(v) || isText(typ) {
			t.Errorf("row %d: launched %q (%v), want a date cell shown as YYYY-MM-DD", r, v, typ)
		}
		for _, n := range []string{"score", "units", "attempts", "latency_ms", "input_tokens", "output_tokens"} {
			if v, typ := cell(n); v != "" && isText(typ) {
				t.Errorf("row %d: %s %q is text, want a number", r, n, v)
			}
		}
		if v, typ := cell("tags"); !strings.Contains(v, "; ") || !isText(typ) {
			t.Errorf("row %d: tags %q (%v), want items joined with \"; \" as text", r, v, typ)
		}
	}
}

// TestDeclaredColumnsInEveryResultFormat: the user's own workbook gets the typed columns beside its own, the CSV
// result their text, in both with an input column of the same name kept apart (batchgen_ prefix).
func TestDeclaredColumnsInEveryResultFormat(t *testing.T) {
	t.Parallel()
	cols := schema.Columns{{Name: "name", Type: schema.Text}, {Name: "launched", Type: schema.Date}, {Name: "ok", Type: schema.Boolean}}
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{Concurrency: 2})
	p := e.splitWithColumns("csv", 5, cols, store.ResultCSV)
	done := e.runToCompletion(context.Background(), p.TaskID)
	rc, err := e.blobs.Open(context.Background(), done.ResultKey)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimPrefix(string(b), "\uFEFF"), "\r\n")
	if !strings.HasPrefix(lines[0], "id,name,batchgen_name,launched,ok,status,") {
		t.Errorf("CSV header %q", lines[0])
	}
	fields := strings.Split(lines[1], ",")
	if !isISODate(fields[3]) || (fields[4] != "TRUE" && fields[4] != "FALSE") || fields[5] != "succeeded" {
		t.Errorf("CSV row %q", lines[1])
	}
}

// TestDeclaredColumnsSentBackIn: a result of declared columns sent back in keeps every answer (read back from its
// typed cells to the same answer) and asks again only for the row whose answer was edited into a wrong shape and
// the row whose input changed.
func TestDeclaredColumnsSentBackIn(t *testing.T) {
	t.Parallel()
	provider := newCounting(sim.New(sim.Config{}))
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 4})
	p := e.splitWithColumns("back", 12, productColumns, store.ResultWorkbook)
	first := e.runToCompletion(context.Background(), p.TaskID)
	before, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: first.ID, FromNo: 1, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}

	f := openResult(t, e, first)
	sh := f.GetSheetName(0)
	header, _ := f.GetRows(sh)
	score := slices.Index(header[0], "score") + 1
	ref, _ := excelize.CoordinatesToCellName(score, 3)
	must(t, f.SetCellValue(sh, ref, "very high")) // row 2's answer, edited into something that is not a number
	must(t, f.SetCellValue(sh, "B5", "另一个商品"))    // row 4's input changed
	back := filepath.Join(e.dir, "back.xlsx")
	must(t, f.SaveAs(back))

	spec := store.TaskSpec{Prompt: p.Spec.Prompt, Provider: "sim", BatchSize: 10, Columns: productColumns}
	again := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID("back-again", spec), Source: "back.xlsx", Spec: spec, Path: back}
	v, err := pipeline.Validate(again)
	if err != nil {
		t.Fatal(err)
	}
	if v.Rerun == nil || v.Rerun.Kept != 10 || v.Rerun.Cleared != 1 || v.Rerun.Changed != 1 {
		t.Fatalf("rerun counts %+v, want 10 kept, 1 cleared (the edited answer), 1 changed", v.Rerun)
	}
	if _, err := e.splitter.Split(context.Background(), again); err != nil {
		t.Fatal(err)
	}
	calls := len(provider.snapshot())
	second := e.runToCompletion(context.Background(), again.TaskID)
	if second.State != store.TaskSucceeded {
		t.Fatalf("state %s", second.State)
	}
	after, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: second.ID, FromNo: 1, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range after {
		if i == 1 || i == 3 {
			continue
		}
		if r.Output != before[i].Output {
			t.Errorf("row %d kept %s, was %s", r.No, r.Output, before[i].Output)
		}
	}
	if got := len(provider.snapshot()) - calls; got != 1 {
		t.Errorf("%d new prompts were sent, want 1 (the changed row; the edited one repeats a prompt)", got)
	}
}

// invalidFirst answers a row's first `bad` calls with a broken answer (a number where text is wanted, a missing
// required column), then as the simulator does; it records the corrections each call carried.
type invalidFirst struct {
	sim  *sim.Provider
	bad  int
	mu   sync.Mutex
	seen map[string][]llm.Request
}

func (p *invalidFirst) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	p.mu.Lock()
	n := len(p.seen[req.Prompt])
	p.seen[req.Prompt] = append(p.seen[req.Prompt], req)
	p.mu.Unlock()
	if n < p.bad {
		return llm.Response{Text: fmt.Sprintf(`{"category": "玩具", "giftable": "maybe", "try": %d}`, n), Usage: llm.Usage{InputTokens: 100, OutputTokens: 10}}, nil
	}
	resp, err := p.sim.Generate(ctx, req)
	resp.Usage = llm.Usage{InputTokens: 100, OutputTokens: 10}
	return resp, err
}

// TestInvalidAnswersAreAskedAgain: an answer that does not fit is asked again at once in the same conversation,
// with what was wrong; a row that gets it right succeeds with every call's tokens; a row still wrong when its
// round's calls are spent fails as invalid_output with its last answer kept, and no later round asks again.
func TestInvalidAnswersAreAskedAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		bad        int
		wantState  store.RowState
		wantCalls  int
		wantTokens int64
	}{
		{"right on the second ask", 1, store.RowSucceeded, 2, 200},
		{"right on the third", 2, store.RowSucceeded, 3, 300},
		{"never right", 99, store.RowFailed, 3, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := &invalidFirst{sim: sim.New(sim.Config{}), bad: tc.bad, seen: map[string][]llm.Request{}}
			e := newEnv(t, p, pipeline.GeneratorConfig{Concurrency: 2, CallsPerRound: 3, Rounds: 3, RetryDelays: []time.Duration{time.Millisecond}, ErrorDelay: time.Millisecond})
			sp := e.splitWithColumns("invalid-"+tc.name, 4, productColumns, store.ResultWorkbook)
			done := e.runToCompletion(context.Background(), sp.TaskID)
			rows, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: done.ID, FromNo: 1, Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				if r.State != tc.wantState || r.Attempts != tc.wantCalls || r.InputTokens != tc.wantTokens {
					t.Errorf("row %d: %s after %d calls, %d input tokens; want %s after %d, %d", r.No, r.State, r.Attempts, r.InputTokens,
						tc.wantState, tc.wantCalls, tc.wantTokens)
				}
				if tc.wantState == store.RowFailed {
					if r.ErrorClass != string(llm.ClassInvalidOutput) || !strings.Contains(r.Error, `"category": want one of "家居", "数码", "服饰", got text "玩具"`) ||
						!strings.Contains(r.Error, `"try": 2`) {
						t.Errorf("row %d: %s %q, want invalid_output naming the problems and keeping the last answer", r.No, r.ErrorClass, r.Error)
					}
				} else if _, err := productColumns.Validate(r.Output); err != nil {
					t.Errorf("row %d succeeded with %s: %v", r.No, r.Output, err)
				}
			}
			for prompt, reqs := range p.seen {
				if len(reqs) != tc.wantCalls {
					t.Errorf("%s: %d calls, want %d (no later round)", prompt, len(reqs), tc.wantCalls)
				}
				for i, req := range reqs {
					if len(req.Corrections) != i {
						t.Fatalf("%s call %d carries %d corrections, want %d", prompt, i+1, len(req.Corrections), i)
					}
					if i > 0 && (!strings.Contains(req.Corrections[i-1].FollowUp, `"giftable": want true or false, got text "maybe"`) ||
						req.Corrections[i-1].Answer != fmt.Sprintf(`{"category": "玩具", "giftable": "maybe", "try": %d}`, i-1)) {
						t.Errorf("%s call %d: correction %+v", prompt, i+1, req.Corrections[i-1])
					}
				}
			}
		})
	}
}

// TestColumnsAreInTheCacheKey: an answer of one shape never answers the same prompt asked in another, and a task
// without columns keys its cache as before columns existed (caches filled then still answer).
func TestColumnsAreInTheCacheKey(t *testing.T) {
	temp := 0.5
	req := llm.Request{Model: "m", System: "s", Prompt: "p", Temperature: &temp, MaxTokens: 9}
	before, _ := json.Marshal(struct {
		Provider    string   `json:"p"`
		Model       string   `json:"m"`
		System      string   `json:"s"`
		Prompt      string   `json:"u"`
		Temperature *float64 `json:"t,omitempty"`
		TopP        *float64 `json:"tp,omitempty"`
		MaxTokens   int      `json:"mt,omitempty"`
	}{"sim", "m", "s", "p", &temp, nil, 9})
	sum := sha256.Sum256(before)
	plain := pipeline.CacheKey("sim", req, 0)
	if plain != hex.EncodeToString(sum[:]) {
		t.Error("the key of a request without columns changed: caches filled before would no longer answer")
	}
	req.Columns = schema.Columns{{Name: "a", Type: schema.Text}}
	typed := pipeline.CacheKey("sim", req, 0)
	req.Columns = schema.Columns{{Name: "a", Type: schema.Number}}
	if plain == typed || typed == pipeline.CacheKey("sim", req, 0) {
		t.Error("the cache key ignores the columns")
	}
}

// TestBadColumnsAreRefusedBeforeAnythingIsWritten: a declaration Check refuses never reaches the store.
func TestBadColumnsAreRefusedBeforeAnythingIsWritten(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, pipeline.GeneratorConfig{})
	spec := store.TaskSpec{Prompt: "{{id}}", Provider: "sim", BatchSize: 10, Columns: schema.Columns{{Name: "a", Type: schema.Enum}}}
	p := pipeline.SplitParams{TaskID: "bad-columns", Source: "in.csv", Spec: spec, Path: e.writeCSV("in.csv", []string{"id"}, [][]string{{"1"}})}
	_, err := e.splitter.Split(context.Background(), p)
	var rejected *pipeline.RejectedError
	if !errors.As(err, &rejected) || !strings.Contains(err.Error(), `the output columns: column 1 ("a"): an enum needs at least one value`) {
		t.Fatalf("split = %v", err)
	}
	if _, err := e.store.GetTask(context.Background(), "bad-columns"); err == nil {
		t.Error("a task was written")
	}
}

func openResult(t *testing.T, e *env, task store.Task) *excelize.File {
	t.Helper()
	r, err := e.blobs.Open(context.Background(), task.ResultKey)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := excelize.OpenReader(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func isText(typ excelize.CellType) bool {
	return typ == excelize.CellTypeInlineString || typ == excelize.CellTypeSharedString
}

func isISODate(s string) bool {
	_, err := time.Parse(time.DateOnly, s)
	return err == nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestWorkbookDeclaresColumns: a workbook whose prompt sheet carries a table of output columns below the template
// runs with them when the request declares none; the result carries template and table in its own prompt sheet,
// so sent back in as it is every row is kept, with no flags at all.
func TestWorkbookDeclaresColumns(t *testing.T) {
	t.Parallel()
	provider := newCounting(sim.New(sim.Config{}))
	e := newEnv(t, provider, pipeline.GeneratorConfig{Concurrency: 2})
	f := excelize.NewFile()
	must(t, f.SetSheetRow("Sheet1", "A1", &[]any{"id", "name"}))
	for i, r := range productRows(6) {
		must(t, f.SetSheetRow("Sheet1", fmt.Sprintf("A%d", i+2), &[]any{r[0], r[1]}))
	}
	_, err := f.NewSheet("prompt")
	must(t, err)
	for ref, v := range map[string]string{"A1": "为{{name}}归类", "A3": "column", "B3": "type", "C3": "description",
		"A4": "category", "B4": "enum(家居|数码)!", "A5": "launched", "B5": "date", "C5": "first on sale"} {
		must(t, f.SetCellValue("prompt", ref, v))
	}
	in := filepath.Join(e.dir, "book.xlsx")
	must(t, f.SaveAs(in))

	split := func(label, path string) store.Task {
		spec := store.TaskSpec{Provider: "sim", BatchSize: 4}
		p := pipeline.SplitParams{TaskID: pipeline.DeriveTaskID(label, spec), Source: filepath.Base(path), Spec: spec, Path: path}
		if _, err := e.splitter.Split(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		return e.runToCompletion(context.Background(), p.TaskID)
	}
	first := split("book", in)
	want := schema.Columns{{Name: "category", Type: schema.Enum, Values: []string{"家居", "数码"}, Required: true},
		{Name: "launched", Type: schema.Date, Description: "first on sale"}}
	if diff := cmp.Diff(want, first.Spec.Columns); diff != "" {
		t.Fatalf("the task's columns (-want +got):\n%s", diff)
	}
	result := openResult(t, e, first)
	rows, _ := result.GetRows("Sheet1")
	if !slices.Equal(rows[0][2:4], []string{"category", "launched"}) {
		t.Errorf("result header %q", rows[0])
	}
	back := filepath.Join(e.dir, "back.xlsx")
	must(t, result.SaveAs(back))
	calls := len(provider.snapshot())
	second := split("back", back)
	if second.Rerun == nil || second.Rerun.Kept != 6 || len(provider.snapshot()) != calls {
		t.Errorf("sent back in: rerun %+v, %d new calls; want all 6 kept", second.Rerun, len(provider.snapshot())-calls)
	}
	if diff := cmp.Diff(want, second.Spec.Columns); diff != "" {
		t.Errorf("the result's own prompt sheet declares (-want +got):\n%s", diff)
	}
}

// TestIntakeSidecarColumns: a drop-folder input takes its columns from <name>.columns.txt (short form or JSON) beside it
// when the workbook declares none, before the deployment's; a sidecar that is no declaration rejects the input,
// naming the file and the column.
func TestIntakeSidecarColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	def := store.TaskSpec{Prompt: "Default {{name}}", Provider: "sim", BatchSize: 2, Columns: schema.Columns{{Name: "d", Type: schema.Text}}}
	intake := pipeline.NewIntake(e.splitter, e.blobs, e.signal, pipeline.IntakeConfig{DefaultSpec: def, Sidecars: true, TempDir: t.TempDir()})
	put := func(key, content string) {
		t.Helper()
		must(t, e.blobs.Put(ctx, key, strings.NewReader(content)))
	}
	accept := func(key string) store.Task {
		t.Helper()
		res, err := intake.Accept(ctx, key, "v1")
		if err != nil {
			t.Fatal(err)
		}
		task, err := e.store.GetTask(ctx, res.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		return task
	}
	put("incoming/a.csv", "id,name\n1,brick\n")
	put("incoming/a.columns.txt", "score:number!, tags:list\n")
	if got := accept("incoming/a.csv").Spec.Columns.Names(); !slices.Equal(got, []string{"score", "tags"}) {
		t.Errorf("with a .columns.txt: %q", got)
	}
	put("incoming/b.csv", "id,name\n1,brick\n")
	put("incoming/b.columns.txt", `{"type":"object","properties":{"ok":{"type":"boolean"}}}`)
	if got := accept("incoming/b.csv").Spec.Columns.Names(); !slices.Equal(got, []string{"ok"}) {
		t.Errorf("with a JSON Schema in .columns.txt: %q", got)
	}
	put("incoming/c.csv", "id,name\n1,brick\n")
	if got := accept("incoming/c.csv").Spec.Columns.Names(); !slices.Equal(got, []string{"d"}) {
		t.Errorf("with none: %q, want the deployment's", got)
	}
	put("incoming/bad.csv", "id,name\n1,brick\n")
	put("incoming/bad.columns.txt", "score:nmber")
	task := accept("incoming/bad.csv")
	if task.State != store.TaskFailed || !strings.Contains(task.Error, `the output columns in bad.columns.txt: column 1 ("score:nmber"): unknown type "nmber"`) {
		t.Errorf("a bad sidecar: %s %q", task.State, task.Error)
	}
}

// TestIntakeSettingsSidecar: <name>.batchgen.json sets a drop-folder input's columns and rows per call, as a request
// would for an upload; a settings file that cannot be read rejects the input, naming it.
func TestIntakeSettingsSidecar(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
	def := store.TaskSpec{Prompt: "Default {{name}}", Provider: "sim", BatchSize: 2}
	intake := pipeline.NewIntake(e.splitter, e.blobs, e.signal, pipeline.IntakeConfig{DefaultSpec: def, Sidecars: true, TempDir: t.TempDir()})
	put := func(key, content string) { must(t, e.blobs.Put(ctx, key, strings.NewReader(content))) }
	put("incoming/s.csv", "id,name\n1,brick\n2,ball\n")
	put(pipeline.SidecarSettingsKey("incoming/s.csv"), `{"columns": "score:number!", "rows_per_call": 10, "max_cost_usd": 2.5}`)
	res, err := intake.Accept(ctx, "incoming/s.csv", "v1")
	if err != nil {
		t.Fatal(err)
	}
	task, err := e.store.GetTask(ctx, res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if task.Spec.RowsPerCall != 10 || !slices.Equal(task.Spec.Columns.Names(), []string{"score"}) || task.MaxCost != 2.5 {
		t.Errorf("spec %+v, max cost %v", task.Spec, task.MaxCost)
	}
	put("incoming/t.csv", "id,name\n1,brick\n")
	put(pipeline.SidecarSettingsKey("incoming/t.csv"), `{"rows_per_call": 500}`)
	res, err = intake.Accept(ctx, "incoming/t.csv", "v1")
	if err != nil {
		t.Fatal(err)
	}
	task, _ = e.store.GetTask(ctx, res.TaskID)
	if task.State != store.TaskFailed || !strings.Contains(task.Error, "t.batchgen.json: rows per call 500: must be between 1 and 100") {
		t.Errorf("a bad settings file: %s %q", task.State, task.Error)
	}
	put("incoming/u.csv", "id,name\n1,brick\n")
	put(pipeline.SidecarSettingsKey("incoming/u.csv"), `{"max_cost_usd": -3}`)
	if res, err = intake.Accept(ctx, "incoming/u.csv", "v1"); err != nil {
		t.Fatal(err)
	}
	task, _ = e.store.GetTask(ctx, res.TaskID)
	if task.State != store.TaskFailed || !strings.Contains(task.Error, "u.batchgen.json: max_cost_usd -3: must be an amount") {
		t.Errorf("a negative cap: %s %q", task.State, task.Error)
	}

	// A mode: refused where provider batches do not run, taken where they
	// do, with a deadline from when the input is taken.
	put("incoming/v.csv", "id,name\n1,brick\n")
	put(pipeline.SidecarSettingsKey("incoming/v.csv"), `{"mode": "auto", "deadline": "6h"}`)
	if res, err = intake.Accept(ctx, "incoming/v.csv", "v1"); err != nil {
		t.Fatal(err)
	}
	task, _ = e.store.GetTask(ctx, res.TaskID)
	if task.State != store.TaskFailed || !strings.Contains(task.Error, "v.batchgen.json: mode auto: this deployment runs tasks online only") {
		t.Errorf("a batch mode where none runs: %s %q", task.State, task.Error)
	}
	batches := pipeline.NewIntake(e.splitter, e.blobs, e.signal, pipeline.IntakeConfig{DefaultSpec: def, Sidecars: true, BatchModes: true, TempDir: t.TempDir()})
	put("incoming/w.csv", "id,name\n1,brick\n")
	put(pipeline.SidecarSettingsKey("incoming/w.csv"), `{"mode": "auto", "deadline": "6h"}`)
	before := time.Now()
	if res, err = batches.Accept(ctx, "incoming/w.csv", "v1"); err != nil {
		t.Fatal(err)
	}
	task, _ = e.store.GetTask(ctx, res.TaskID)
	if task.Mode != store.ModeAuto || task.Deadline.Before(before.Add(6*time.Hour-time.Second)) || task.Deadline.After(time.Now().Add(6*time.Hour)) {
		t.Errorf("terms %+v, want auto within 6 hours of the intake", task.Terms)
	}
	put("incoming/x.csv", "id,name\n1,brick\n")
	put(pipeline.SidecarSettingsKey("incoming/x.csv"), `{"mode": "auto"}`)
	if res, err = batches.Accept(ctx, "incoming/x.csv", "v1"); err != nil {
		t.Fatal(err)
	}
	task, _ = e.store.GetTask(ctx, res.TaskID)
	if task.State != store.TaskFailed || !strings.Contains(task.Error, "x.batchgen.json: mode auto needs a deadline") {
		t.Errorf("auto without a deadline: %s %q", task.State, task.Error)
	}

	// A quote first: the task is held with its sample; a sample past the
	// bound rejects the input.
	put("incoming/y.csv", "id,name\n1,brick\n2,ball\n")
	put(pipeline.SidecarSettingsKey("incoming/y.csv"), `{"sample": 1}`)
	if res, err = intake.Accept(ctx, "incoming/y.csv", "v1"); err != nil {
		t.Fatal(err)
	}
	task, _ = e.store.GetTask(ctx, res.TaskID)
	if task.State != store.TaskHeld || task.Sample != 1 {
		t.Errorf("a sample in the settings: %s with sample %d, want HELD with 1", task.State, task.Sample)
	}
	put("incoming/z.csv", "id,name\n1,brick\n")
	put(pipeline.SidecarSettingsKey("incoming/z.csv"), `{"sample": 5000}`)
	if res, err = intake.Accept(ctx, "incoming/z.csv", "v1"); err != nil {
		t.Fatal(err)
	}
	task, _ = e.store.GetTask(ctx, res.TaskID)
	if task.State != store.TaskFailed || !strings.Contains(task.Error, "z.batchgen.json: sample 5000: must be 0 (no quote) to 1000 rows") {
		t.Errorf("a sample past the bound: %s %q", task.State, task.Error)
	}
}
