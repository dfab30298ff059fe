package sim

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
)

// The simulator's batch API (llm.BatchProvider), so that economy mode runs
// on the embedded default: a batch is answered BatchDelay after it was
// sent (Config.BatchDelay), every line as Generate would answer it, and a
// cancel ends it at once with its lines unfinished.

// DefaultBatchDelay is how long a simulated batch takes when
// Config.BatchDelay is 0.
const DefaultBatchDelay = 3 * time.Second

var _ llm.BatchProvider = (*Provider)(nil)

// simBatch is one batch sent to the simulator.
type simBatch struct {
	key       string
	sent      time.Time
	lines     []llm.BatchLine
	due       time.Time
	cancelled bool
}

// batches holds a Provider's batches.
type batches struct {
	mu sync.Mutex
	m  map[string]*simBatch
	n  int
}

// BatchLimits implements llm.BatchProvider: OpenAI's.
func (p *Provider) BatchLimits() llm.BatchLimits {
	return llm.BatchLimits{Lines: 50_000, Bytes: 200 << 20}
}

// SubmitBatch implements llm.BatchProvider.
func (p *Provider) SubmitBatch(ctx context.Context, key string, lines []llm.BatchLine) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", ctxError(err)
	}
	if len(lines) == 0 {
		return "", &llm.Error{Class: llm.ClassBadRequest, Message: "sim batch: no lines"}
	}
	delay := p.cfg.BatchDelay
	if delay == 0 {
		delay = DefaultBatchDelay
	}
	p.batches.mu.Lock()
	defer p.batches.mu.Unlock()
	if p.batches.m == nil {
		p.batches.m = map[string]*simBatch{}
	}
	p.batches.n++
	id := "simbatch_" + strconv.Itoa(p.batches.n)
	p.batches.m[id] = &simBatch{key: key, sent: p.cfg.Clock.Now(), lines: append([]llm.BatchLine(nil), lines...), due: p.cfg.Clock.Now().Add(delay)}
	p.batchLines.Add(int64(len(lines)))
	return id, nil
}

// FindBatch implements llm.BatchProvider: by key, as the simulator keeps it.
func (p *Provider) FindBatch(_ context.Context, q llm.BatchQuery) (string, error) {
	p.batches.mu.Lock()
	defer p.batches.mu.Unlock()
	for id, b := range p.batches.m {
		if b.key == q.Key && !q.Taken[id] && !b.sent.Before(q.Since.Add(-llm.FindWindow)) && !b.sent.After(q.Since.Add(llm.FindWindow)) {
			return id, nil
		}
	}
	return "", nil
}

func (p *Provider) batch(id string) (*simBatch, error) {
	b, ok := p.batches.m[id]
	if !ok {
		return nil, &llm.Error{Class: llm.ClassBadRequest, Message: fmt.Sprintf("sim batch %s: no such batch", id)}
	}
	return b, nil
}

// BatchStatus implements llm.BatchProvider.
func (p *Provider) BatchStatus(_ context.Context, id string) (llm.BatchStatus, error) {
	p.batches.mu.Lock()
	defer p.batches.mu.Unlock()
	b, err := p.batch(id)
	if err != nil {
		return llm.BatchStatus{}, err
	}
	st := llm.BatchStatus{ID: id, State: llm.BatchRunning, Total: len(b.lines)}
	switch {
	case b.cancelled:
		st.State, st.Failed = llm.BatchCancelled, len(b.lines)
	case !p.cfg.Clock.Now().Before(b.due):
		st.State, st.Completed = llm.BatchDone, len(b.lines)
	}
	return st, nil
}

// BatchResults implements llm.BatchProvider.
func (p *Provider) BatchResults(_ context.Context, id string) ([]llm.BatchResult, error) {
	p.batches.mu.Lock()
	defer p.batches.mu.Unlock()
	b, err := p.batch(id)
	if err != nil {
		return nil, err
	}
	out := make([]llm.BatchResult, len(b.lines))
	for i, l := range b.lines {
		out[i] = llm.BatchResult{ID: l.ID}
		if b.cancelled {
			out[i].Err = &llm.Error{Class: llm.ClassBatchUnfinished, Message: "sim batch cancelled before this line"}
			continue
		}
		text := Text(l.Req)
		out[i].Response = llm.Response{Text: text, Usage: llm.Usage{InputTokens: inputTokens(l.Req), OutputTokens: llm.EstimateTokens(text)}}
	}
	return out, nil
}

// CancelBatch implements llm.BatchProvider.
func (p *Provider) CancelBatch(_ context.Context, id string) error {
	p.batches.mu.Lock()
	defer p.batches.mu.Unlock()
	b, err := p.batch(id)
	if err != nil {
		return err
	}
	if p.cfg.Clock.Now().Before(b.due) {
		b.cancelled = true
	}
	return nil
}

// BatchLines returns how many lines were sent in batches.
func (p *Provider) BatchLines() int64 { return p.batchLines.Load() }
