// Package clock abstracts time so that leases, backoff, TTLs and sweeping can be
// tested without sleeping.
package clock

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Clock tells the time and waits. Real code uses Real; tests use a Fake.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives once d has elapsed.
	After(d time.Duration) <-chan time.Time
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// After is time.After.
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Timer is a Clock whose waits can be withdrawn: stop releases the timer
// behind c (Real's runtime timer; on a Fake, the waiter Waiters counts).
// Both clocks of this package are Timers.
type Timer interface {
	Timer(d time.Duration) (c <-chan time.Time, stop func())
}

// Timer is time.NewTimer.
func (Real) Timer(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}

// Sleep waits d on clk, and returns nil when it has passed or wake is
// closed first (a nil wake never is), ctx's error when ctx ends first. A
// sleep cut short withdraws its timer (clk being a Timer), so that on a
// Fake, Waiters counts only goroutines still asleep: a test that advances
// the fake time once every goroutine is parked is not misled by timers
// nobody waits for.
func Sleep(ctx context.Context, clk Clock, d time.Duration, wake <-chan struct{}) error {
	if d <= 0 {
		return ctx.Err()
	}
	var c <-chan time.Time
	if t, ok := clk.(Timer); ok {
		var stop func()
		c, stop = t.Timer(d)
		defer stop()
	} else {
		c = clk.After(d)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-wake:
		return nil
	case <-c:
		return nil
	}
}

// Fake is a manually advanced clock for tests. The zero value is not usable;
// use NewFake.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

// NewFake returns a Fake clock set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// After returns a channel that fires when the fake time is advanced past d.
func (f *Fake) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan time.Time, 1)
	at := f.now.Add(d)
	if d <= 0 {
		ch <- f.now
		return ch
	}
	f.waiters = append(f.waiters, fakeWaiter{at: at, ch: ch})
	return ch
}

// Timer is After whose waiter stop withdraws (once it has fired, stop does
// nothing).
func (f *Fake) Timer(d time.Duration) (<-chan time.Time, func()) {
	ch := f.After(d)
	return ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.waiters = slices.DeleteFunc(f.waiters, func(w fakeWaiter) bool { return w.ch == ch })
	}
}

// Advance moves the fake time forward by d and fires due timers.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	kept := f.waiters[:0]
	for _, w := range f.waiters {
		if !w.at.After(f.now) {
			w.ch <- f.now
			continue
		}
		kept = append(kept, w)
	}
	f.waiters = kept
}

// Step fires one pending After of those due first, if they are due by
// end, and moves the fake time to their deadline: pick(n) chooses among
// the n due at that same instant, in the order they were asked for (nil
// takes the first). When none is due by end it moves the time to end
// (never back) and fires nothing. It reports whether it fired one.
//
// Advance wakes every goroutine due at once, and they then race; a test
// that lets each one it wakes park again before the next Step runs them
// in an order it chooses, the same every time.
func (f *Fake) Step(end time.Time, pick func(n int) int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	var due []int // the waiters due first, in the order they were asked for
	for i, w := range f.waiters {
		switch {
		case w.at.After(end):
		case len(due) == 0 || w.at.Before(f.waiters[due[0]].at):
			due = append(due[:0], i)
		case w.at.Equal(f.waiters[due[0]].at):
			due = append(due, i)
		}
	}
	if len(due) == 0 {
		if end.After(f.now) {
			f.now = end
		}
		return false
	}
	i := due[0]
	if pick != nil {
		i = due[pick(len(due))]
	}
	w := f.waiters[i]
	if w.at.After(f.now) {
		f.now = w.at
	}
	f.waiters = slices.Delete(f.waiters, i, i+1)
	w.ch <- f.now
	return true
}

// Waiters returns how many After channels are waiting for the fake time to
// advance. A test that drives goroutines on a Fake waits until every one of
// them is parked in After before it advances, so that each step is
// deterministic.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}
