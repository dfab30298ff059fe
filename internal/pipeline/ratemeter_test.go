package pipeline_test

import (
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/pipeline"
)

// TestRateMeter: the windowed rate forgets what is older than its window,
// starts over when rows are reopened, and its ETA is never faster than the
// quota (and paced by it through a pause).
func TestRateMeter(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	m := pipeline.RateMeter{Window: 10 * time.Second}
	if m.Rate() != 0 || m.Done() != 0 {
		t.Fatalf("empty meter: rate %v, done %d", m.Rate(), m.Done())
	}
	if _, ok := m.ETA(100); ok {
		t.Error("an empty meter with no quota knows an ETA")
	}
	for s := 0; s <= 20; s++ { // 5 rows a second for 20 s
		m.Add(t0.Add(time.Duration(s)*time.Second), 5*s)
	}
	if got := m.Rate(); got != 5 {
		t.Errorf("rate %v, want 5", got)
	}
	if eta, ok := m.ETA(200); !ok || eta != 20*time.Second {
		t.Errorf("ETA of 100 rows left at 5/s = %v %v, want 20s", eta, ok)
	}
	for s := 21; s <= 31; s++ { // a pause longer than the window
		m.Add(t0.Add(time.Duration(s)*time.Second), 100)
	}
	if got := m.Rate(); got != 0 {
		t.Errorf("rate after a %v pause = %v, want 0", m.Window, got)
	}
	m.Quota = 2
	if eta, ok := m.ETA(200); !ok || eta != 50*time.Second {
		t.Errorf("ETA through a pause with a quota of 2/s = %v %v, want 50s", eta, ok)
	}
	m.Add(t0.Add(32*time.Second), 40) // rows reopened by a retry
	m.Add(t0.Add(33*time.Second), 50)
	if got := m.Rate(); got != 10 {
		t.Errorf("rate after a retry reopened rows = %v, want 10 (measured from the reopen)", got)
	}
	if eta, ok := m.ETA(200); !ok || eta != 75*time.Second {
		t.Errorf("ETA at 10/s under a 2/s quota = %v %v, want 75s (the quota's pace)", eta, ok)
	}
	if eta, ok := m.ETA(50); !ok || eta != 0 {
		t.Errorf("ETA with nothing left = %v %v, want 0", eta, ok)
	}
}
