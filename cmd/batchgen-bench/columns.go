package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/xuri/excelize/v2"
)

// The figures of issue 17: answers as typed columns, and several rows per call, against `batchgen mock-llm` at
// 600 requests a minute (100 per 10 s strict sliding window, so the quota binds from the first seconds).

// benchColumns are the structured job's four typed columns.
const benchColumns = "category:enum(家居|数码|服饰)!, score:number, giftable:boolean!, summary:text!"

// structuredStats is what the mock counted of structured and packed answers.
type structuredStats struct {
	mockStats
	Structured  int64 `json:"structured"`
	Broken      int64 `json:"broken"`
	Packed      int64 `json:"packed"`
	PackedItems int64 `json:"packed_items"`
	BrokenItems int64 `json:"broken_items"`
}

func (m *mockLLM) structuredStats() (structuredStats, error) {
	var st structuredStats
	return st, m.stats(&st)
}

// columnsJob runs rows through `batchgen run` with extra flags against a fresh mock at 600 requests a minute, and
// returns the run, what the mock counted and the result workbook's path.
func (r *run) columnsJob(ctx context.Context, id string, rows int, mockFlags, runFlags []string) (result, structuredStats, string, error) {
	const rpm, window, latency = 600, 10 * time.Second, 290 * time.Millisecond
	perWindow := int(float64(rpm) * window.Seconds() / 60)
	m, err := r.mock(ctx, append([]string{"--latency", latency.String(), "--quota", strconv.Itoa(perWindow), "--quota-window", window.String()}, mockFlags...)...)
	if err != nil {
		return result{}, structuredStats{}, "", err
	}
	defer m.Stop()
	in, err := r.csv(rows, id)
	if err != nil {
		return result{}, structuredStats{}, "", err
	}
	out := filepath.Join(r.dir("out-"+id), "result.xlsx")
	args := append([]string{"run", "--in", in, "--data", r.dir("data-" + id), "--out", out, "--prompt", "{{sku}} {{name}}", "--quiet",
		"--provider", "openai", "--base-url", m.URL, "--rpm", strconv.Itoa(rpm), "--concurrency", "16"}, runFlags...)
	res, err := r.timed(ctx, r.bin, args...)
	if err != nil {
		return res, structuredStats{}, "", err
	}
	st, err := m.structuredStats()
	return res, st, out, err
}

// resultCheck is what a look at a structured result found.
type resultCheck struct {
	rows, succeeded, invalidOutput int
	// wrong counts succeeded rows whose cells do not match the declaration (or, for plain text, whose answer is
	// not the row's own); neither counts rows that are neither succeeded nor invalid_output.
	wrong, neither int
}

// checkResult opens a result workbook as a user would and checks every row: for declared columns (benchColumns)
// each cell's type and value, the summary quoting the row's own prompt; for plain text the answer being the
// mock's answer to the row's own prompt ("Copy for: SKU... product N").
func checkResult(path string, typed bool) (resultCheck, error) {
	var c resultCheck
	f, err := excelize.OpenFile(path)
	if err != nil {
		return c, err
	}
	defer f.Close()
	sh := f.GetSheetName(0)
	rows, err := f.Rows(sh)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	var header []string
	for n := 1; rows.Next(); n++ {
		cells, err := rows.Columns()
		if err != nil {
			return c, err
		}
		if n == 1 {
			header = cells
			continue
		}
		cell := func(name string) string {
			if i := slices.Index(header, name); i >= 0 && i < len(cells) {
				return cells[i]
			}
			return ""
		}
		typeOf := func(name string) excelize.CellType {
			ref, _ := excelize.CoordinatesToCellName(slices.Index(header, name)+1, n)
			t, _ := f.GetCellType(sh, ref)
			return t
		}
		c.rows++
		own := cells[0] + " " + cells[1] // the row's prompt: {{sku}} {{name}}
		switch cell("status") {
		case "succeeded":
			c.succeeded++
		default:
			if cell("error_class") == "invalid_output" && cell("error") != "" {
				c.invalidOutput++
			} else {
				c.neither++
			}
			continue
		}
		if !typed {
			if cell("output") != "Copy for: "+own {
				c.wrong++
			}
			continue
		}
		_, numErr := strconv.ParseFloat(cell("score"), 64)
		ok := slices.Contains([]string{"家居", "数码", "服饰"}, cell("category")) && isText(typeOf("category")) &&
			(cell("score") == "" || numErr == nil && typeOf("score") != excelize.CellTypeInlineString && typeOf("score") != excelize.CellTypeSharedString) &&
			typeOf("giftable") == excelize.CellTypeBool &&
			cell("summary") == "summary for: "+own && isText(typeOf("summary"))
		if !ok {
			c.wrong++
		}
	}
	return c, rows.Error()
}

func isText(t excelize.CellType) bool {
	return t == excelize.CellTypeInlineString || t == excelize.CellTypeSharedString
}

// measureColumns: a structured job (four typed columns) at the request quota, its wall against the quota's bound
// and every row's cells checked; then ten rows a call on twice the rows, against the one-row-a-call bound, every
// answer checked to be its row's own; then the same with 5% of packed items broken, its calls against the ideal
// (one per pack, and one per broken item asked alone).
func measureColumns(ctx context.Context, r *run) ([]Figure, error) {
	const rate = 10.0 // requests a second
	structuredRows, packedRows := 1000, 2000
	if r.quick {
		structuredRows, packedRows = 300, 600
	}
	var figs []Figure

	res, st, out, err := r.columnsJob(ctx, "columns", structuredRows, nil, []string{"--columns", benchColumns})
	if err != nil {
		return nil, err
	}
	chk, err := checkResult(out, true)
	if err != nil {
		return nil, err
	}
	bound := float64(structuredRows) / rate
	figs = append(figs,
		Figure{ID: "columns-ratio", Name: "typed columns: 4 declared columns at the request quota (wall / bound)", Value: res.wall.Seconds() / bound,
			Better: AtMost, Bound: 1.05, Detail: fmt.Sprintf("%d rows, --columns %q, 600 rpm; bound %.0f s, wall %.1f s; %d requests, %d answers structured",
				structuredRows, benchColumns, bound, res.wall.Seconds(), st.Requests, st.Structured)},
		Figure{ID: "columns-wrong-cells", Name: "typed columns: succeeded rows whose cells do not match the declaration", Value: float64(chk.wrong + chk.neither),
			Better: AtMost, Bound: 0, Detail: fmt.Sprintf("%d rows read back from the workbook, %d succeeded", chk.rows, chk.succeeded)},
	)

	res, st, out, err = r.columnsJob(ctx, "packed", packedRows, []string{"--token-quota", "2000000"}, []string{"--rows-per-call", "10", "--tpm", "2000000"})
	if err != nil {
		return nil, err
	}
	if chk, err = checkResult(out, false); err != nil {
		return nil, err
	}
	single := float64(packedRows) / rate
	figs = append(figs,
		Figure{ID: "packed-ratio", Name: "10 rows per call (wall / one-row-a-call bound)", Value: res.wall.Seconds() / single,
			Better: AtMost, Bound: 0.15, Detail: fmt.Sprintf("%d rows, --rows-per-call 10, 600 rpm; one-row bound %.0f s, wall %.1f s; %d requests, %d of them packed",
				packedRows, single, res.wall.Seconds(), st.Requests, st.Packed)},
		Figure{ID: "packed-not-own", Name: "10 rows per call: rows whose answer is not their own", Value: float64(chk.wrong + chk.neither + chk.rows - packedRows),
			Better: AtMost, Bound: 0, Detail: fmt.Sprintf("%d rows read back, %d succeeded", chk.rows, chk.succeeded)},
	)

	res, st, out, err = r.columnsJob(ctx, "packed-invalid", packedRows, []string{"--token-quota", "2000000", "--invalid-rate", "0.05"},
		[]string{"--rows-per-call", "10", "--tpm", "2000000", "--columns", benchColumns})
	if err != nil {
		return nil, err
	}
	if chk, err = checkResult(out, true); err != nil {
		return nil, err
	}
	ideal := st.Packed + st.BrokenItems
	figs = append(figs,
		Figure{ID: "packed-invalid-calls", Name: "10 rows per call, 5% of items broken (model calls / ideal)", Value: float64(st.Succeeded) / math.Max(float64(ideal), 1),
			Better: AtMost, Bound: 1.10, Detail: fmt.Sprintf("%d rows; %d calls answered: %d packed (%d items, %d broken), %d alone (%d broken again); ideal %d; wall %.1f s",
				packedRows, st.Succeeded, st.Packed, st.PackedItems, st.BrokenItems, st.Succeeded-st.Packed, st.Broken, ideal, res.wall.Seconds())},
		Figure{ID: "packed-invalid-undecided", Name: "10 rows per call, 5% broken: rows neither right nor invalid_output", Value: float64(chk.wrong + chk.neither),
			Better: AtMost, Bound: 0, Detail: fmt.Sprintf("%d rows read back: %d succeeded (cells checked), %d invalid_output with their last answer", chk.rows, chk.succeeded, chk.invalidOutput)},
	)
	return figs, nil
}
