package pipeline

import (
	"context"
	"slices"
	"sync"
)

// rowSlots are a generator's row slots (GeneratorConfig.Concurrency: the
// calls it has in flight), granted in turn to the principals whose batches
// wait for one. A principal with three batches in flight and another with
// one each get every other free slot, so they share the provider's quota
// (what the slots' holders wait for) evenly, rather than three to one: the
// queue serves the principals' batches in turn (queue.Outgoing.Group), and
// this carries the turns down to the rows. Within a principal, waiters are
// served in the order they came.
type rowSlots struct {
	mu   sync.Mutex
	free int
	// waiting holds each principal's waiters; turns lists the principals
	// with waiters, the next to be served first.
	waiting map[string][]chan struct{}
	turns   []string
}

func newRowSlots(n int) *rowSlots {
	return &rowSlots{free: n, waiting: map[string][]chan struct{}{}}
}

// acquire takes a slot for a row of owner's, waiting for its turn, and
// reports whether it got one: false when ctx ended first.
func (s *rowSlots) acquire(ctx context.Context, owner string) bool {
	s.mu.Lock()
	if s.free > 0 && len(s.turns) == 0 {
		s.free--
		s.mu.Unlock()
		return true
	}
	granted := make(chan struct{})
	if len(s.waiting[owner]) == 0 {
		s.turns = append(s.turns, owner)
	}
	s.waiting[owner] = append(s.waiting[owner], granted)
	s.mu.Unlock()
	select {
	case <-granted:
		return true
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.waiting[owner]
	if i := slices.Index(ws, granted); i >= 0 {
		s.waiting[owner] = slices.Delete(ws, i, i+1)
		if len(s.waiting[owner]) == 0 {
			delete(s.waiting, owner)
			s.turns = slices.DeleteFunc(s.turns, func(o string) bool { return o == owner })
		}
		return false
	}
	// Granted as ctx ended: hand the slot on.
	s.releaseLocked()
	return false
}

// release returns a slot: to the first waiter of the principal whose turn
// it is, who then goes to the back of the turns, or to the free pool.
func (s *rowSlots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked()
}

func (s *rowSlots) releaseLocked() {
	if len(s.turns) == 0 {
		s.free++
		return
	}
	owner := s.turns[0]
	ws := s.waiting[owner]
	next := ws[0]
	s.turns = s.turns[1:]
	if len(ws) == 1 {
		delete(s.waiting, owner)
	} else {
		s.waiting[owner] = ws[1:]
		s.turns = append(s.turns, owner)
	}
	close(next)
}
