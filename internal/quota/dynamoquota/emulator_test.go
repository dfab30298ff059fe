//go:build emulator

package dynamoquota_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/awsemu"
	"github.com/batchgen/batchgen/internal/awsops"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/quota"
	"github.com/batchgen/batchgen/internal/quota/dynamoquota"
	"github.com/batchgen/batchgen/internal/quota/quotatest"
)

// table provisions the stack's table from template.yaml once per test.
func table(t *testing.T) (aws.Config, string) {
	t.Helper()
	ctx := t.Context()
	cfg, err := awsemu.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := awsemu.Provision(ctx, cfg, "../../../template.yaml", awsemu.UniquePrefix("quota"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Cleanup(context.Background()) })
	return cfg, res.TableName
}

// TestLeaseNeverExceedsLimit: concurrent leases of five seconds across
// two minutes, from four
// "instances", hand out exactly each second's limit and not one token more,
// on the table provisioned from template.yaml.
func TestLeaseNeverExceedsLimit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, tableName := table(t)
	client := dynamodb.NewFromConfig(cfg)
	limit := quota.Amount{Requests: 25, Tokens: 2500}
	// Start mid-minute and run over its end: the leases span two items.
	second := time.Now().Unix()/60*60 + 57
	want := []quota.Amount{{Requests: 3, Tokens: 200}, {Requests: 3, Tokens: 200}, {Requests: 3, Tokens: 200}, {Requests: 3, Tokens: 200}, {Requests: 3, Tokens: 200}}
	var mu sync.Mutex
	total := make([]quota.Amount, len(want))
	var wg sync.WaitGroup
	for i := range 4 {
		l := dynamoquota.New(client, tableName, "openai:gpt")
		wg.Go(func() {
			for {
				ask := slices.Clone(want)
				ask[i].Requests += i // different sizes race
				ask[(i+1)%len(ask)].Tokens += 100 * i
				got, err := l.Lease(ctx, second, ask, limit)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				sum := 0
				for j, n := range got {
					total[j].Requests += n.Requests
					total[j].Tokens += n.Tokens
					sum += n.Requests + n.Tokens
				}
				mu.Unlock()
				if sum == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if diff := cmp.Diff([]quota.Amount{limit, limit, limit, limit, limit}, total); diff != "" {
		t.Errorf("budget leased per second (-want +got):\n%s", diff)
	}
	// Another second has its own budget; another quota name too; without
	// a token limit no tokens are counted.
	got, err := dynamoquota.New(client, tableName, "openai:gpt").Lease(ctx, second+5, []quota.Amount{{Requests: 5, Tokens: 100}, {Requests: 30, Tokens: 9000}}, limit)
	if diff := cmp.Diff([]quota.Amount{{Requests: 5, Tokens: 100}, limit}, got); err != nil || diff != "" {
		t.Errorf("next seconds: err %v, (-want +got):\n%s", err, diff)
	}
	got, err = dynamoquota.New(client, tableName, "other").Lease(ctx, second, []quota.Amount{{Requests: 5, Tokens: 100}}, quota.Amount{Requests: 25})
	if diff := cmp.Diff([]quota.Amount{{Requests: 5, Tokens: 0}}, got); err != nil || diff != "" {
		t.Errorf("another quota without TPM: err %v, (-want +got):\n%s", err, diff)
	}
}

// TestSharedConformance runs the limiter suite against quota.Shared over
// the DynamoDB lease store, each limiter with its own quota name.
func TestSharedConformance(t *testing.T) {
	t.Parallel()
	cfg, tableName := table(t)
	client := dynamodb.NewFromConfig(cfg)
	quotatest.Run(t, func(t *testing.T, c quotatest.Config) quotatest.Limiter {
		s, err := quota.NewShared(dynamoquota.New(client, tableName, t.Name()),
			quota.SharedConfig{RPM: c.RPM, TPM: c.TPM, MinPenalty: c.MinPenalty, Clock: c.Clock})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestSharedWritesPerCall counts the DynamoDB calls of two generator
// processes (8 goroutines each, a model call taking 500 ms) pacing on one
// shared quota, through the SDK: at steady state at most one write per 20
// model calls, and not one second over the quota, with and without a token
// quota (leased in the same update).
func TestSharedWritesPerCall(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		tpm, tokens, used int
	}{
		{name: "requests"},
		// 16 calls a second each charged 100 tokens: 3,200 of 4,950 a
		// second; half of each charge comes back.
		{name: "requests and tokens", tpm: 300000, tokens: 100, used: 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, tableName := table(t)
			rec := awsops.New()
			client := dynamodb.NewFromConfig(rec.Attach(cfg))
			clk := clock.NewFake(quotatest.Base)
			const rpm = 3000 // 49 a second after the margin; the processes draw 16 each
			d := quotatest.NewDriver(t, clk)
			d.Tokens, d.Used = tc.tokens, tc.used
			for range 2 {
				s, err := quota.NewShared(dynamoquota.New(client, tableName, "writes-per-call-"+tc.name), quota.SharedConfig{RPM: rpm, TPM: tc.tpm, Clock: clk})
				if err != nil {
					t.Fatal(err)
				}
				d.StartCalling(s, 8, 500*time.Millisecond)
			}
			d.RunUntil(quotatest.Base.Add(5 * time.Second)) // warm-up: the blocks find their size
			warm := len(d.Starts())
			rec.Reset()
			d.RunUntil(quotatest.Base.Add(35 * time.Second))
			starts := d.Stop()
			calls := len(starts) - warm
			counts := rec.Counts()
			if calls < 2*16*30*9/10 {
				t.Fatalf("%d calls in 30 s, want about 32 a second", calls)
			}
			if writes := rec.Total(); writes*20 > calls {
				t.Errorf("%d DynamoDB calls (%v) for %d model calls, want at most 1 per 20", writes, counts, calls)
			}
			perSecond := map[int64]int{}
			for _, s := range starts {
				perSecond[s.Unix()]++
			}
			for sec, n := range perSecond {
				if n > 49 {
					t.Errorf("second %d started %d requests, more than the 49 the quota allows", sec-quotatest.Base.Unix(), n)
				}
			}
		})
	}
}
