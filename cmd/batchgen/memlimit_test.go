package main

import (
	"runtime/debug"
	"testing"
)

// TestMemoryLimit: without GOMEMLIMIT batchgen sets its default soft
// limit; with it, the environment's stands (the runtime applied it, and
// batchgen leaves it alone).
func TestMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	if got := setMemoryLimit(func(string) string { return "" }); got != defaultMemoryLimit {
		t.Errorf("without GOMEMLIMIT the limit is %d, want %d", got, defaultMemoryLimit)
	}
	debug.SetMemoryLimit(200 << 20) // as GOMEMLIMIT=200MiB would have
	env := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "200MiB"
		}
		return ""
	}
	if got := setMemoryLimit(env); got != 200<<20 {
		t.Errorf("with GOMEMLIMIT=200MiB the limit is %d, want it left alone", got)
	}
}
