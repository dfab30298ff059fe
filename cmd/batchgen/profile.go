package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
)

// startProfiles writes the profiles a developer asks for through the
// environment, for the whole command: BATCHGEN_CPUPROFILE=FILE (CPU) and
// BATCHGEN_MEMPROFILE=FILE (heap, at exit). They are environment variables,
// not flags, so that a benchmark can profile any command line unchanged
// (make bench's figures run the real binary). The returned func stops and
// writes them; a profile that cannot be written is reported on stderr and
// never fails the command.
func startProfiles(stderr io.Writer) (stop func()) {
	var stops []func()
	if path := os.Getenv("BATCHGEN_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err != nil {
			fmt.Fprintf(stderr, "batchgen: cpu profile: %v\n", err)
		} else if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "batchgen: cpu profile: %v\n", err)
			f.Close()
		} else {
			stops = append(stops, func() {
				pprof.StopCPUProfile()
				if err := f.Close(); err != nil {
					fmt.Fprintf(stderr, "batchgen: cpu profile: %v\n", err)
				}
			})
		}
	}
	if path := os.Getenv("BATCHGEN_MEMPROFILE"); path != "" {
		stops = append(stops, func() {
			f, err := os.Create(path)
			if err != nil {
				fmt.Fprintf(stderr, "batchgen: heap profile: %v\n", err)
				return
			}
			runtime.GC() // the heap as live objects, not garbage
			if err := pprof.WriteHeapProfile(f); err != nil {
				fmt.Fprintf(stderr, "batchgen: heap profile: %v\n", err)
			}
			if err := f.Close(); err != nil {
				fmt.Fprintf(stderr, "batchgen: heap profile: %v\n", err)
			}
		})
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}
