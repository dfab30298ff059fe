package mockserver_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/mockserver"
	openaillm "github.com/batchgen/batchgen/internal/llm/openai"
	"github.com/batchgen/batchgen/internal/quota"
)

// run drives workers against a mock through the OpenAI client for d or
// until total calls were made (0: no count limit), each call paced by lim
// (nil: unpaced) and each 429 reported to it.
func run(t *testing.T, mock *mockserver.Server, workers int, d time.Duration, total int64, lim *quota.Local) (ok, limited int64) {
	t.Helper()
	srv := httptest.NewServer(mock)
	defer srv.Close()
	p, err := openaillm.New(openaillm.Config{Conn: llm.Conn{BaseURL: srv.URL + "/v1", Model: "m", Timeout: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		wg  sync.WaitGroup
		seq atomic.Int64
	)
	var okN, limitedN atomic.Int64
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				n := seq.Add(1)
				if total > 0 && n > total {
					return
				}
				if lim != nil && lim.Wait(ctx, 0) != nil {
					return
				}
				resp, err := p.Generate(ctx, llm.Request{Prompt: fmt.Sprint("row ", n)})
				var lerr *llm.Error
				switch {
				case err == nil:
					okN.Add(1)
					if lim != nil {
						lim.Observe(resp.RateLimits)
					}
				case errors.As(err, &lerr) && lerr.Class == llm.ClassRateLimited:
					limitedN.Add(1)
					if lim != nil {
						lim.Observe(lerr.RateLimits)
						lim.Penalize(lerr.RetryAfter)
					}
				case ctx.Err() != nil:
				default:
					t.Errorf("Generate: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d workers, %v or %d calls: %d succeeded, %d rate limited", workers, d, total, okN.Load(), limitedN.Load())
	return okN.Load(), limitedN.Load()
}

// TestLimiterKeepsClientUnderServerQuota is the point of the quota package:
// paced at the quota, a batch of workers draws no 429 at all, while the same
// workers unpaced are mostly refused.
func TestLimiterKeepsClientUnderServerQuota(t *testing.T) {
	t.Parallel()
	cfg := mockserver.Config{Quota: 50, QuotaWindow: time.Second, Latency: 5 * time.Millisecond}

	// 50 per second is RPM 3000. The 20 % margin (40/s) absorbs the
	// scheduling and network jitter of a loaded test machine running -race:
	// the default 1 % is meant for 60 s windows, where the same jitter is a
	// far smaller fraction of the window.
	lim := quota.NewLocal(quota.LocalConfig{RPM: 3000, SafetyMargin: 0.2})
	paced := mockserver.New(cfg)
	// A count of calls, not a duration: the check is that every paced call
	// is answered and none refused, which holds however slow the machine.
	const pacedCalls = 60
	ok, limited := run(t, paced, 8, time.Minute, pacedCalls, lim)
	if limited != 0 || ok != pacedCalls {
		t.Errorf("paced run: %d succeeded, %d rate limited; want all %d succeeded, none limited", ok, limited, pacedCalls)
	}

	// The control that shows the check above can fail: the same calls
	// unpaced. 150 calls unpaced arrive far faster than 50/s on any
	// machine that runs these tests.
	unpaced := mockserver.New(cfg)
	ok, limited = run(t, unpaced, 8, time.Minute, 150, nil)
	if limited == 0 {
		t.Errorf("unpaced run: %d succeeded, none rate limited; want 429s without the limiter", ok)
	}
}

// TestPenalizeFindsServerQuota starts the limiter at twice the server's
// real quota; Penalize must bring the 429s down to a small share.
func TestPenalizeFindsServerQuota(t *testing.T) {
	t.Parallel()
	mock := mockserver.New(mockserver.Config{Quota: 30, QuotaWindow: time.Second, Latency: 5 * time.Millisecond})
	lim := quota.NewLocal(quota.LocalConfig{RPM: 3600, MinPenalty: 200 * time.Millisecond}) // 60/s configured
	ok, limited := run(t, mock, 8, 2500*time.Millisecond, 0, lim)
	if ok < 30 {
		t.Errorf("%d succeeded in 2.5 s, want the job to keep going near the 30/s quota", ok)
	}
	if limited*4 > ok {
		t.Errorf("%d rate limited vs %d succeeded, want 429s under a quarter of successes", limited, ok)
	}
	if r := lim.Rate(); r >= 59 {
		t.Errorf("limiter rate = %.1f/s after 429s, want it cut below the configured 59.4/s", r)
	}
}
