package quota

import (
	"context"
	"sync"
	"testing"
	"time"
)

// memLeaser is an in-memory Leaser: the unit-test double of the shared
// budget (dynamoquota is tested against the emulator).
type memLeaser struct {
	mu   sync.Mutex
	used map[int64]int
}

func (m *memLeaser) Lease(_ context.Context, second int64, want, limit int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	got := min(want, limit-m.used[second])
	if got < 0 {
		got = 0
	}
	m.used[second] += got
	return got, nil
}

// TestSharedHoldsTheQuotaAcrossProcesses: three limiters (three Lambda
// instances) sharing one budget never start more than a second's share in
// any calendar second, and together use most of it.
func TestSharedHoldsTheQuotaAcrossProcesses(t *testing.T) {
	t.Parallel()
	leaser := &memLeaser{used: map[int64]int{}}
	const rpm = 1200 // 20 a second, 19 after the margin
	var mu sync.Mutex
	perSecond := map[int64]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		s, err := NewShared(leaser, SharedConfig{RPM: rpm})
		if err != nil {
			t.Fatal(err)
		}
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for s.Wait(ctx) == nil {
					now := time.Now().Unix()
					mu.Lock()
					perSecond[now]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	start := time.Now().Unix() - 2
	for sec, n := range perSecond {
		if n > 19 {
			t.Errorf("second %d started %d requests, more than the 19 the quota allows", sec, n)
		}
	}
	// A full second in the middle of the run is used almost entirely.
	if n := perSecond[start+1]; n < 15 {
		t.Errorf("a full second started only %d of 19 allowed requests: %v", n, perSecond)
	}
}

func TestSharedPenalizePauses(t *testing.T) {
	t.Parallel()
	s, err := NewShared(&memLeaser{used: map[int64]int{}}, SharedConfig{RPM: 6000})
	if err != nil {
		t.Fatal(err)
	}
	s.Penalize(300 * time.Millisecond)
	start := time.Now()
	if err := s.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 280*time.Millisecond {
		t.Errorf("Wait returned after %v, inside the 300ms Retry-After pause", waited)
	}
}

func TestNewSharedRejectsTinyQuota(t *testing.T) {
	t.Parallel()
	if _, err := NewShared(&memLeaser{}, SharedConfig{RPM: 30}); err == nil {
		t.Error("a 30 RPM quota (under one request a second) was accepted")
	}
	if _, err := NewShared(&memLeaser{}, SharedConfig{RPM: 0}); err == nil {
		t.Error("RPM 0 was accepted")
	}
}
