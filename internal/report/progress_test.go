package report

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// TestRateMeter drives the progress logic with a made-up clock: a steady
// 10 rows/s, then a 429 pause. The recent rate drops to 0 at once while
// the average barely moves, and the ETA follows the recent rate, bounded
// by the quota.
func TestRateMeter(t *testing.T) {
	t.Parallel()
	type step struct {
		at     time.Duration // since the start
		done   int
		recent float64
		avg    float64
		eta    string
	}
	tests := []struct {
		name  string
		total int
		base  int
		rpm   int
		steps []step
	}{
		{
			name: "steady, then paused by a 429", total: 600, rpm: 0,
			steps: []step{
				{at: 5 * time.Second, done: 50, recent: 10, avg: 10, eta: "55s"},
				{at: 15 * time.Second, done: 150, recent: 10, avg: 10, eta: "45s"},
				{at: 20 * time.Second, done: 200, recent: 10, avg: 10, eta: "40s"},
				// No row for 5 s: the recent window (10 s) halves, the average
				// barely moves.
				{at: 25 * time.Second, done: 200, recent: 5, avg: 8, eta: "1m20s"},
				{at: 30 * time.Second, done: 200, recent: 0, avg: 200.0 / 30, eta: "?"},
			},
		},
		{
			name: "the quota bounds the ETA", total: 1000, rpm: 600, // 10 rows/s at most
			steps: []step{
				// A burst from the cache at 50 rows/s cannot last: the
				// ETA assumes the quota's 10/s.
				{at: 2 * time.Second, done: 100, recent: 50, avg: 50, eta: "1m30s"},
				// A pause: no recent rate, the quota's pace is the estimate.
				{at: 14 * time.Second, done: 100, recent: 0, avg: 100.0 / 14, eta: "1m30s"},
			},
		},
		{
			name: "a continued run counts from where it is", total: 100, base: 60,
			steps: []step{
				{at: 4 * time.Second, done: 80, recent: 5, avg: 5, eta: "4s"},
				{at: 8 * time.Second, done: 100, recent: 5, avg: 5, eta: "0s"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := newRateMeter(tt.total, tt.base, t0, tt.rpm)
			for _, s := range tt.steps {
				now := t0.Add(s.at)
				m.add(now, s.done)
				eta := "?"
				if d, ok := m.eta(); ok {
					eta = d.String()
				}
				got := step{at: s.at, done: m.done(), recent: m.recent(), avg: m.average(now), eta: eta}
				if diff := cmp.Diff(s, got, cmp.AllowUnexported(step{})); diff != "" {
					t.Errorf("at %v (-want +got):\n%s", s.at, diff)
				}
			}
		})
	}
}

func TestProgressLines(t *testing.T) {
	t.Parallel()
	m := newRateMeter(200, 0, t0, 600)
	m.add(t0.Add(10*time.Second), 100)
	now := t0.Add(10 * time.Second)
	if got, want := m.line(now, 3, ""), "batchgen: 100/200 rows (50%), 3 failed, 10.0 rows/s now (10.0 avg), ETA 10s"; got != want {
		t.Errorf("line:\n got %s\nwant %s", got, want)
	}
	held := heldBack(now, now.Add(-time.Second).UnixNano(), 0, 600)
	if got := m.line(now, 3, held); !strings.HasSuffix(got, "; rate-limited: the provider answered 429, pausing as it asked") {
		t.Errorf("line with a recent 429 = %s", got)
	}
	m.add(t0.Add(20*time.Second), 200)
	if got, want := m.final(t0.Add(20*time.Second), 3), "batchgen: 200/200 rows (100%), 3 failed, 10.0 rows/s avg, took 20s"; got != want {
		t.Errorf("final:\n got %s\nwant %s", got, want)
	}
}

func TestHeldBack(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Minute)
	ago := func(d time.Duration) int64 { return now.Add(-d).UnixNano() }
	tests := []struct {
		name           string
		last429, lastQ int64
		rpm            int
		want           string
	}{
		{"nothing", 0, 0, 600, ""},
		{"a recent 429 wins over a quota wait", ago(time.Second), ago(0), 600, "rate-limited: the provider answered 429, pausing as it asked"},
		{"a quota wait with --rpm", ago(time.Minute), ago(time.Second), 600, "rate-limited: waiting for the quota (600 requests/min)"},
		{"a quota wait, quota learnt", 0, ago(time.Second), 0, "rate-limited: waiting for the quota learnt from the provider"},
		{"both long ago", ago(10 * time.Second), ago(6 * time.Second), 600, ""},
	}
	for _, tt := range tests {
		if got := heldBack(now, tt.last429, tt.lastQ, tt.rpm); got != tt.want {
			t.Errorf("%s: heldBack = %q, want %q", tt.name, got, tt.want)
		}
	}
}
