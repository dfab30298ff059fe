package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
)

// measureWideSheet: reading and writing a sheet of 10,000 columns against
// one of 2,500, both of two rows (internal/sheet BenchmarkWideSheetRoundTrip,
// the fastest of three counts of each). Work linear in the columns takes
// about 4 times as long, quadratic work 16 times; 10 leaves a noisy machine
// room and still catches the quadratic writer this once was (excelize
// scanning every sized column for every cell: minutes for 10,000 columns).
func measureWideSheet(ctx context.Context, _ *run) ([]Figure, error) {
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", "^BenchmarkWideSheetRoundTrip$", "-benchtime", "3x", "-count", "3", "./internal/sheet/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("BenchmarkWideSheetRoundTrip: %w\n%s", err, tail(string(out)))
	}
	best := map[int]float64{}
	for _, m := range regexp.MustCompile(`BenchmarkWideSheetRoundTrip/columns=(\d+)\S*\s+\d+\s+([0-9.]+) ns/op`).FindAllStringSubmatch(string(out), -1) {
		n, _ := strconv.Atoi(m[1])
		ns, _ := strconv.ParseFloat(m[2], 64)
		if b, ok := best[n]; !ok || ns < b {
			best[n] = ns
		}
	}
	narrow, wide := best[2500], best[10_000]
	if narrow == 0 || wide == 0 {
		return nil, fmt.Errorf("BenchmarkWideSheetRoundTrip printed no times for 2,500 and 10,000 columns:\n%s", tail(string(out)))
	}
	return []Figure{{ID: "wide-sheet-ratio", Name: "wide sheet: read + write of 10,000 columns / of 2,500 (4x the columns)", Value: wide / narrow, Unit: "x",
		Better: AtMost, Bound: 10, Detail: fmt.Sprintf("2 rows; 2,500 columns %.0f ms, 10,000 columns %.0f ms (fastest of 3); linear is 4x, quadratic 16x", narrow/1e6, wide/1e6)}}, nil
}
