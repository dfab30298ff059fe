package pipeline

import (
	"context"
	"sync"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/store"
)

// Rows that ask the same question (the same cache key: the same owner,
// provider, model, settings and rendered prompt) are answered by one model
// call per process. The cache alone cannot do it: a batch reads it once,
// when it starts, so rows that ask what another row is asking at the same
// time, in the same batch or in one running beside it, each called the
// model and each was paid for.
//
// A row whose question is being asked waits for that call and takes its
// answer, as a cached row does (no call, no tokens). A question answered in
// this process is remembered until the cache surely has it (the answer is
// written with its row's result, a moment later). A failed call shares
// nothing: each row waiting asks again itself. Only where the task reuses
// the cache (CacheMode), and never for a row that asks for a new answer.

// maxRecentAnswers bounds the answers remembered; past it they are
// forgotten all at once. They only bridge the moment until the cache has
// an answer (a result is written at once on SQLite, within FlushInterval
// on DynamoDB): a thousand is ten seconds of answers at a hundred rows a
// second. At ten thousand the 100,000-row ceiling run's peak RSS grew by
// 15 MiB.
const maxRecentAnswers = 1_000

// answers is one process's questions in flight and answered a moment ago.
type answers struct {
	mu      sync.Mutex
	flights map[string]*flight
	recent  map[string]string
}

// flight is one question being asked.
type flight struct {
	done chan struct{}
	// text and ok are set before done is closed: the answer, when the
	// call succeeded.
	text string
	ok   bool
}

// join returns the answer to question key when this process has it or is
// about to: it waits for a call in flight (until ctx ends). Otherwise lead
// is set and the caller asks, then calls finish.
func (a *answers) join(ctx context.Context, key string) (text string, ok, lead bool) {
	for {
		a.mu.Lock()
		if text, ok := a.recent[key]; ok {
			a.mu.Unlock()
			return text, true, false
		}
		f, inFlight := a.flights[key]
		if !inFlight {
			if a.flights == nil {
				a.flights = map[string]*flight{}
			}
			a.flights[key] = &flight{done: make(chan struct{})}
			a.mu.Unlock()
			return "", false, true
		}
		a.mu.Unlock()
		select {
		case <-f.done:
			if f.ok {
				return f.text, true, false
			}
			// The call failed: ask again (perhaps as the next leader).
		case <-ctx.Done():
			return "", false, false
		}
	}
}

// finish ends the leader's flight for key with its row's outcome.
func (a *answers) finish(key string, o rowOutcome) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.flights[key]
	delete(a.flights, key)
	if o.save && o.result.State == store.RowSucceeded {
		if len(a.recent) >= maxRecentAnswers || a.recent == nil {
			a.recent = map[string]string{}
		}
		a.recent[key] = o.result.Output
		if f != nil {
			f.text, f.ok = o.result.Output, true
		}
	}
	if f != nil {
		close(f.done)
	}
}

// answerRow answers one row, sharing the answer of a row of this process
// that asks the same question (see above).
func (g *Generator) answerRow(ctx, startCtx context.Context, mayStart func() bool, spend *budget, task store.Task, row store.Row, req llm.Request, key string) rowOutcome {
	if g.cfg.Cache == nil || !g.cfg.CacheMode.Reuses(task.Spec) || row.Fresh {
		return g.generateRow(ctx, startCtx, mayStart, spend, task, row, req, key)
	}
	text, ok, lead := g.answers.join(startCtx, key)
	switch {
	case ok:
		res := store.RowResult{State: store.RowSucceeded, Output: text, Cached: true, Attempts: row.Attempts}
		return rowOutcome{result: res, save: true, event: Event{TaskID: task.ID, RowNo: row.No, State: store.RowSucceeded, Cached: true}}
	case !lead:
		// No new row starts: the wait ended with the batch.
		return rowOutcome{result: row.RowResult, aborted: true}
	}
	var o rowOutcome
	// Deferred, so that a panic in the call (recovered by the batch) frees
	// the question too, sharing nothing: the rows waiting ask it themselves.
	defer func() { g.answers.finish(key, o) }()
	o = g.generateRow(ctx, startCtx, mayStart, spend, task, row, req, key)
	return o
}
