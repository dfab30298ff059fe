package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// waitLog is a clock whose waits end at once and are written down.
type waitLog struct{ waits []time.Duration }

func (w *waitLog) Now() time.Time { return time.Unix(0, 0) }
func (w *waitLog) After(d time.Duration) <-chan time.Time {
	w.waits = append(w.waits, d)
	ch := make(chan time.Time, 1)
	ch <- time.Unix(0, 0)
	return ch
}

func TestRetry(t *testing.T) {
	throttled := errors.New("throttled")
	tests := []struct {
		name      string
		failures  []error // what the write returns, call by call; nil after the list
		wantCalls int
		wantErr   error
		wantWaits []time.Duration
	}{
		{"succeeds at once", nil, 1, nil, nil},
		{"rides out two failures", []error{throttled, throttled}, 3, nil,
			[]time.Duration{50 * time.Millisecond, 100 * time.Millisecond}},
		{"a conflict is a verdict", []error{fmt.Errorf("claim: %w", ErrConflict)}, 1, ErrConflict, nil},
		{"not found is a verdict", []error{throttled, ErrNotFound}, 2, ErrNotFound, []time.Duration{50 * time.Millisecond}},
		{"gives up after the budget", []error{throttled, throttled, throttled, throttled, throttled, throttled, throttled}, RetryAttempts, throttled,
			[]time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &waitLog{}
			calls := 0
			err := Retry(context.Background(), clk, nil, func() error {
				calls++
				if calls <= len(tt.failures) {
					return tt.failures[calls-1]
				}
				return nil
			})
			if calls != tt.wantCalls {
				t.Errorf("%d calls, want %d", calls, tt.wantCalls)
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Errorf("error %v, want %v", err, tt.wantErr)
			}
			if fmt.Sprint(clk.waits) != fmt.Sprint(tt.wantWaits) {
				t.Errorf("waits %v, want %v", clk.waits, tt.wantWaits)
			}
		})
	}
}

func TestRetryStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Retry(ctx, &blockingClock{}, nil, func() error {
		calls++
		cancel()
		return errors.New("unavailable")
	})
	if calls != 1 || !errors.Is(err, context.Canceled) {
		t.Errorf("%d calls, error %v; want 1 call and the context's error", calls, err)
	}
}

// blockingClock's waits never end.
type blockingClock struct{}

func (blockingClock) Now() time.Time                       { return time.Unix(0, 0) }
func (blockingClock) After(time.Duration) <-chan time.Time { return nil }
