package quota

import (
	"context"
	"sync"
	"sync/atomic"
)

// MemLeaser is a Leaser kept in memory: the shared budget of processes
// that share one address space (tests, the benchmark's simulated fleet).
// It follows the lease store's rules exactly as dynamoquota does, and
// counts the writes dynamoquota would make: one for each minute a lease or
// release touches, one for each ceiling write (not the retries of an
// update that found the item changed, which it cannot see).
type MemLeaser struct {
	mu       sync.Mutex
	used     map[int64]Amount
	ceiling  Ceiling
	writes   atomic.Int64
	lowers   atomic.Int64
	releases atomic.Int64
	reads    atomic.Int64
	released map[int64]int64 // releases by minute (Unix minute)
}

var _ Leaser = (*MemLeaser)(nil)

// NewMemLeaser returns an empty in-memory lease store.
func NewMemLeaser() *MemLeaser {
	return &MemLeaser{used: map[int64]Amount{}, released: map[int64]int64{}}
}

// Lease takes up to want[i] of second from+i out of that second's budget
// under the newest ceiling (known or the stored one, which it keeps), and
// says what is left to the end of the last minute asked for.
func (m *MemLeaser) Lease(_ context.Context, from int64, want []Amount, limit Limit, known Ceiling) (Lease, error) {
	m.writes.Add(minuteWrites(from, want))
	m.mu.Lock()
	defer m.mu.Unlock()
	if known.Newer(m.ceiling) {
		m.ceiling = known
	}
	got := make([]Amount, len(want))
	for i, w := range want {
		sec := from + int64(i)
		b := m.ceiling.Budget(limit, sec)
		u := m.used[sec]
		got[i].Requests = max(min(w.Requests, b.Requests-u.Requests), 0)
		got[i].Tokens = max(min(w.Tokens, b.Tokens-u.Tokens), 0)
		u.Requests += got[i].Requests
		u.Tokens += got[i].Tokens
		m.used[sec] = u
	}
	// What is left, to the end of the last minute asked for, as
	// dynamoquota reads it back from the minute's item.
	var left []Amount
	if len(want) > 0 {
		end := (from+int64(len(want))-1)/60*60 + 60
		for sec := from; sec < end; sec++ {
			b, u := m.ceiling.Budget(limit, sec), m.used[sec]
			left = append(left, Amount{Requests: max(b.Requests-u.Requests, 0), Tokens: max(b.Tokens-u.Tokens, 0)})
		}
	}
	return Lease{Got: got, Ceiling: m.ceiling, Left: left}, nil
}

// Lower stores next unless the store holds a ceiling newer than seen, and
// returns the stored one.
func (m *MemLeaser) Lower(_ context.Context, seen, next Ceiling) (Ceiling, error) {
	m.writes.Add(1)
	m.lowers.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ceiling.Newer(seen) && next.Newer(m.ceiling) {
		m.ceiling = next
	}
	return m.ceiling, nil
}

// Release gives back give[i] of second from+i.
func (m *MemLeaser) Release(_ context.Context, from int64, give []Amount) error {
	n := minuteWrites(from, give)
	m.writes.Add(n)
	m.releases.Add(n)
	m.mu.Lock()
	defer m.mu.Unlock()
	last := int64(-1)
	for i, g := range give {
		u := m.used[from+int64(i)]
		u.Requests = max(u.Requests-g.Requests, 0)
		u.Tokens = max(u.Tokens-g.Tokens, 0)
		m.used[from+int64(i)] = u
		if minute := (from + int64(i)) / 60; g != (Amount{}) && minute != last {
			m.released[minute]++ // as dynamoquota counts them in the minute's item
			last = minute
		}
	}
	return nil
}

// Room is what is left of the n seconds from on under the stored ceiling,
// a read (counted by Reads, not Writes).
func (m *MemLeaser) Room(_ context.Context, from int64, n int, limit Limit) (Room, error) {
	m.reads.Add((from+int64(n)-1)/60 - from/60 + 1) // one read per minute item
	m.mu.Lock()
	defer m.mu.Unlock()
	room := Room{Left: make([]Amount, n)}
	for i := range room.Left {
		sec := from + int64(i)
		b, u := m.ceiling.Budget(limit, sec), m.used[sec]
		room.Left[i] = Amount{Requests: max(b.Requests-u.Requests, 0), Tokens: max(b.Tokens-u.Tokens, 0)}
	}
	for minute := from / 60; minute <= (from+int64(n)-1)/60; minute++ {
		room.Releases += m.released[minute]
	}
	return room, nil
}

// Reads counts the reads Room made: one per minute item read.
func (m *MemLeaser) Reads() int64 { return m.reads.Load() }

// minuteWrites is how many writes dynamoquota makes for amounts of the
// seconds from on: one for each minute whose seconds ask for something.
func minuteWrites(from int64, amounts []Amount) int64 {
	n, last := int64(0), int64(-1)
	for i, a := range amounts {
		if minute := (from + int64(i)) / 60; a != (Amount{}) && minute != last {
			n, last = n+1, minute
		}
	}
	return n
}

// Releases is how many of the writes were Release's.
func (m *MemLeaser) Releases() int64 { return m.releases.Load() }

// Writes is how many writes the store took: leases, ceiling writes and
// releases.
func (m *MemLeaser) Writes() int64 { return m.writes.Load() }

// CeilingWrites is how many of the writes were Lower's.
func (m *MemLeaser) CeilingWrites() int64 { return m.lowers.Load() }

// Ceiling is the ceiling the store holds.
func (m *MemLeaser) Ceiling() Ceiling {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ceiling
}
