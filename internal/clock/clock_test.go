package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fired reports which of chans has received, without waiting.
func fired(chans []<-chan time.Time) []bool {
	out := make([]bool, len(chans))
	for i, c := range chans {
		select {
		case <-c:
			out[i] = true
		default:
		}
	}
	return out
}

func TestFakeStepFiresOneAtATime(t *testing.T) {
	tests := []struct {
		name  string
		after []time.Duration // the Afters asked for, in order
		end   time.Duration
		pick  func(n int) int
		want  []bool // which fired after one Step
		now   time.Duration
		ok    bool
	}{
		{name: "the earliest", after: []time.Duration{3 * time.Second, time.Second, 2 * time.Second}, end: time.Minute,
			want: []bool{false, true, false}, now: time.Second, ok: true},
		{name: "a tie goes to the first asked", after: []time.Duration{2 * time.Second, time.Second, time.Second}, end: time.Minute,
			want: []bool{false, true, false}, now: time.Second, ok: true},
		{name: "pick chooses among a tie", after: []time.Duration{time.Second, 2 * time.Second, time.Second}, end: time.Minute,
			pick: func(n int) int { return n - 1 }, want: []bool{false, false, true}, now: time.Second, ok: true},
		{name: "none due by end: time moves to end", after: []time.Duration{time.Minute}, end: 10 * time.Second,
			want: []bool{false}, now: 10 * time.Second, ok: false},
		{name: "due exactly at end", after: []time.Duration{10 * time.Second}, end: 10 * time.Second,
			want: []bool{true}, now: 10 * time.Second, ok: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake(t0)
			var chans []<-chan time.Time
			for _, d := range tc.after {
				chans = append(chans, f.After(d))
			}
			if ok := f.Step(t0.Add(tc.end), tc.pick); ok != tc.ok {
				t.Errorf("Step = %v, want %v", ok, tc.ok)
			}
			got := fired(chans)
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("fired %v, want %v", got, tc.want)
					break
				}
			}
			if now := f.Now().Sub(t0); now != tc.now {
				t.Errorf("now +%v, want +%v", now, tc.now)
			}
			if n, want := f.Waiters(), len(tc.after)-count(tc.want); n != want {
				t.Errorf("%d waiters left, want %d", n, want)
			}
		})
	}
}

func count(b []bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

// TestSleepWithdrawsItsTimer: a sleep that a wake or its context cuts short
// leaves no waiter on a Fake, so Waiters counts only who is asleep.
func TestSleepWithdrawsItsTimer(t *testing.T) {
	f := NewFake(t0)
	wake := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- Sleep(context.Background(), f, time.Minute, wake) }()
	waitWaiters(t, f, 1)
	close(wake)
	if err := <-done; err != nil {
		t.Fatalf("Sleep cut short by wake = %v, want nil", err)
	}
	if n := f.Waiters(); n != 0 {
		t.Errorf("%d waiters after the sleep ended, want 0", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- Sleep(ctx, f, time.Minute, nil) }()
	waitWaiters(t, f, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep cut short by its context = %v, want context.Canceled", err)
	}
	if n := f.Waiters(); n != 0 {
		t.Errorf("%d waiters after the sleep ended, want 0", n)
	}

	go func() { done <- Sleep(context.Background(), f, time.Second, nil) }()
	waitWaiters(t, f, 1)
	f.Advance(time.Second)
	if err := <-done; err != nil {
		t.Fatalf("Sleep that ran its time = %v, want nil", err)
	}
	if err := Sleep(ctx, f, 0, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep(0) with an ended context = %v, want its error", err)
	}
}

func waitWaiters(t *testing.T, f *Fake, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.Waiters() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", f.Waiters(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
