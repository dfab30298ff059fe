package main

import (
	"net/http"
	"sync"

	"github.com/batchgen/batchgen/internal/llm/mockserver"
)

// callWatch serves a mock model server and signals when it has answered a
// number of calls successfully, so a test waits on the event itself rather
// than sleeping and looking.
type callWatch struct {
	mock *mockserver.Server

	mu      sync.Mutex
	waiters []callWaiter
}

type callWaiter struct {
	n    int64
	done chan struct{}
}

func newCallWatch(mock *mockserver.Server) *callWatch { return &callWatch{mock: mock} }

// ServeHTTP answers the call, then wakes the waiters it satisfied.
func (w *callWatch) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w.mock.ServeHTTP(rw, r)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waiters) == 0 {
		return
	}
	w.wakeLocked(w.mock.Stats().Succeeded)
}

func (w *callWatch) wakeLocked(succeeded int64) {
	kept := w.waiters[:0]
	for _, wt := range w.waiters {
		if succeeded >= wt.n {
			close(wt.done)
			continue
		}
		kept = append(kept, wt)
	}
	w.waiters = kept
}

// reached returns a channel closed once n calls have succeeded.
func (w *callWatch) reached(n int64) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	done := make(chan struct{})
	w.waiters = append(w.waiters, callWaiter{n: n, done: done})
	w.wakeLocked(w.mock.Stats().Succeeded)
	return done
}
