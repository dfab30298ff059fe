//go:build emulator

package lambdafn_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/schema"
	"github.com/batchgen/batchgen/internal/store"
)

// TestDeclaredColumnsOnAWS: on the stack, with the DefaultColumns and DefaultRowsPerCall parameters, a dropped sheet
// runs through the splitter, the generator Lambdas (five rows a call, strict structured outputs from the mock, a
// share of its items broken and asked again alone) and the exporter, and its result has a typed column per declared column; every succeeded row fits the
// columns, and a row that never got it right is invalid_output with its last answer kept.
func TestDeclaredColumnsOnAWS(t *testing.T) {
	t.Parallel()
	const declared = "category:enum(食品|饮料|日用)!, score:number, giftable:boolean!, launched:date, summary:text!"
	cols, err := schema.ParseShort(declared)
	if err != nil {
		t.Fatal(err)
	}
	e := newE2E(t, e2eOptions{rows: 40, invalidRate: 0.3, callsPerRound: 2, env: map[string]string{"DEFAULT_COLUMNS": declared, "DEFAULT_ROWS_PER_CALL": "5"}})
	up := e.upload("商品.xlsx", nil)
	if err := e.stack.Splitter.Handle(t.Context(), up); err != nil {
		t.Fatalf("splitter: %v", err)
	}
	task := e.pump(e.taskID(up), 120*time.Second)
	if task.State != store.TaskSucceeded && task.State != store.TaskPartial {
		t.Fatalf("task = %s", task.State)
	}
	if !slices.Equal(task.Spec.Columns.Names(), cols.Names()) {
		t.Fatalf("the task's columns %q, want the deployment's %q", task.Spec.Columns.Names(), cols.Names())
	}
	rows, err := e.stack.Store.ListRows(t.Context(), store.ListRowsParams{TaskID: task.ID, FromNo: 1, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	invalid := 0
	for _, r := range rows {
		switch r.State {
		case store.RowSucceeded:
			if _, err := cols.Validate(r.Output); err != nil {
				t.Errorf("row %d succeeded with %s: %v", r.No, r.Output, err)
			}
		case store.RowFailed:
			invalid++
			if r.ErrorClass != string(llm.ClassInvalidOutput) || !strings.Contains(r.Error, `{"broken":true}`) {
				t.Errorf("row %d failed as %s: %q", r.No, r.ErrorClass, r.Error)
			}
		}
	}
	// 30% of items broken in the packs, then 30% of the rows asked alone: about 4 rows fail both; the mock's draws
	// are seeded.
	if invalid == 0 || invalid > 10 {
		t.Errorf("%d of 40 rows invalid_output, want a few", invalid)
	}
	// Five rows a call: 8 packs, and the broken items asked alone.
	if st := e.mock.Stats(); st.Requests >= 40 || task.Spec.RowsPerCall != 5 {
		t.Errorf("%d model calls for 40 rows at 5 a call (spec %d)", st.Requests, task.Spec.RowsPerCall)
	}
	f, err := excelize.OpenReader(bytes.NewReader(e.result(task.ResultKey)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, _ := f.GetRows("商品")
	if want := append(slices.Clone(lambdatest.Header), cols.Names()...); !slices.Equal(got[0][:len(want)], want) {
		t.Fatalf("result header %q, want it to start %q", got[0], want)
	}
	score, _ := excelize.CoordinatesToCellName(len(lambdatest.Header)+2, 2)
	gift, _ := excelize.CoordinatesToCellName(len(lambdatest.Header)+3, 2)
	if typ, _ := f.GetCellType("商品", gift); rows[0].State == store.RowSucceeded && typ != excelize.CellTypeBool {
		t.Errorf("giftable %s is %v, want a boolean", gift, typ)
	}
	if v, _ := f.GetCellValue("商品", score, excelize.Options{RawCellValue: true}); rows[0].State == store.RowSucceeded && v == "" {
		t.Errorf("score %s is empty", score)
	}
}
