package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/xuri/excelize/v2"
)

// measureRerun: issue 18's rerun by editing the result. A fresh 10,000-row
// run with the zero-latency simulator, then its result sent back in with 30
// rows' input edited, 20 rows flagged in the rerun column and 10 answers
// cleared: exactly those 60 rows go to the model, and recognising the
// 10,000 rows takes no longer than doing them (the fresh run's wall, in the
// same run, is the bound).
func measureRerun(ctx context.Context, r *run) ([]Figure, error) {
	const rows, edited, flagged, cleared = 10_000, 30, 20, 10
	in, err := r.xlsx(rows, "rerun")
	if err != nil {
		return nil, err
	}
	data := r.dir("data")
	first := filepath.Join(r.dir("out"), "first.result.xlsx")
	fresh, err := r.timed(ctx, r.bin, append([]string{"run", "--in", in, "--data", data, "--out", first, "--prompt", "{{sku}} {{name}}", "--quiet"}, simFlags...)...)
	if err != nil {
		return nil, err
	}
	back := filepath.Join(r.dir("in-rerun-edited"), "edited.xlsx")
	if err := editResult(first, back, edited, flagged, cleared); err != nil {
		return nil, err
	}
	// The same template: a changed one would change every row's key.
	again, err := r.timed(ctx, r.bin, append([]string{"run", "--in", back, "--data", data, "--out", filepath.Join(r.dir("out"), "again.xlsx"),
		"--prompt", "{{sku}} {{name}}", "--quiet"}, simFlags...)...)
	if err != nil {
		return nil, err
	}
	m := regexp.MustCompile(`(?m)^requests\s+(\d+) this run`).FindStringSubmatch(again.stdout)
	if m == nil {
		return nil, fmt.Errorf("no request count in the rerun's summary:\n%s", again.stdout)
	}
	calls, _ := strconv.Atoi(m[1])
	want := edited + flagged + cleared
	return []Figure{
		{ID: "rerun-calls", Name: "rerun: model calls for a 10,000-row result with 60 rows edited, flagged or cleared", Value: float64(calls), Unit: "calls",
			Better: AtMost, Bound: float64(want), Detail: fmt.Sprintf("%d edited, %d flagged, %d cleared; the other %d rows kept", edited, flagged, cleared, rows-want)},
		{ID: "rerun-wall", Name: "rerun: wall / a fresh run's wall, 10,000 rows, zero-latency model", Value: again.wall.Seconds() / fresh.wall.Seconds(), Unit: "x",
			Better: AtMost, Bound: 1.0, Detail: fmt.Sprintf("sent back in %.2f s, fresh %.2f s (process start, split and export included in both)", again.wall.Seconds(), fresh.wall.Seconds())},
	}, nil
}

// editResult does to a result what a user does in Excel: edits the input of
// the first edited rows, types something in the rerun column of the next
// flagged ones and clears the answer of the next cleared ones.
func editResult(from, to string, edited, flagged, cleared int) error {
	f, err := excelize.OpenFile(from)
	if err != nil {
		return err
	}
	defer f.Close()
	sheet := f.GetSheetList()[0]
	rows, err := f.GetRows(sheet)
	if err != nil {
		return err
	}
	col := func(name string) (string, error) {
		i := slices.Index(rows[0], name)
		if i < 0 {
			return "", fmt.Errorf("the result has no %s column", name)
		}
		return excelize.ColumnNumberToName(i + 1)
	}
	name, err1 := col("name")
	rerun, err2 := col("rerun")
	output, err3 := col("output")
	if err := errors.Join(err1, err2, err3); err != nil {
		return err
	}
	row := 2
	for range edited {
		if err := f.SetCellStr(sheet, name+strconv.Itoa(row), fmt.Sprintf("edited product %d", row)); err != nil {
			return err
		}
		row += 7
	}
	for range flagged {
		if err := f.SetCellStr(sheet, rerun+strconv.Itoa(row), "again"); err != nil {
			return err
		}
		row += 7
	}
	for range cleared {
		if err := f.SetCellStr(sheet, output+strconv.Itoa(row), ""); err != nil {
			return err
		}
		row += 7
	}
	return f.SaveAs(to)
}
