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
	const limit = 25
	// Start mid-minute and run over its end: the leases span two items.
	second := time.Now().Unix()/60*60 + 57
	want := []int{3, 3, 3, 3, 3}
	var mu sync.Mutex
	total := make([]int, len(want))
	var wg sync.WaitGroup
	for i := range 4 {
		l := dynamoquota.New(client, tableName, "openai:gpt")
		wg.Go(func() {
			for {
				ask := slices.Clone(want)
				ask[i] += i // different sizes race
				got, err := l.Lease(ctx, second, ask, limit)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				sum := 0
				for j, n := range got {
					total[j] += n
					sum += n
				}
				mu.Unlock()
				if sum == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if diff := cmp.Diff([]int{limit, limit, limit, limit, limit}, total); diff != "" {
		t.Errorf("tokens leased per second (-want +got):\n%s", diff)
	}
	// Another second has its own budget; another quota name too.
	if got, err := dynamoquota.New(client, tableName, "openai:gpt").Lease(ctx, second+5, []int{5, 30}, limit); err != nil || !slices.Equal(got, []int{5, limit}) {
		t.Errorf("next seconds: got %v, %v; want [5 %d]", got, err, limit)
	}
	if got, err := dynamoquota.New(client, tableName, "other").Lease(ctx, second, []int{5}, limit); err != nil || !slices.Equal(got, []int{5}) {
		t.Errorf("another quota: got %v, %v; want [5]", got, err)
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
			quota.SharedConfig{RPM: c.RPM, MinPenalty: c.MinPenalty, Clock: c.Clock})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestSharedWritesPerCall counts the DynamoDB calls of two generator
// processes (8 goroutines each, a model call taking 500 ms) pacing on one
// shared quota, through the SDK: at steady state at most one write per 20
// model calls, and not one second over the quota.
func TestSharedWritesPerCall(t *testing.T) {
	t.Parallel()
	cfg, tableName := table(t)
	rec := awsops.New()
	client := dynamodb.NewFromConfig(rec.Attach(cfg))
	clk := clock.NewFake(quotatest.Base)
	const rpm = 3000 // 49 a second after the margin; the processes draw 16 each
	d := quotatest.NewDriver(t, clk)
	for range 2 {
		s, err := quota.NewShared(dynamoquota.New(client, tableName, "writes-per-call"), quota.SharedConfig{RPM: rpm, Clock: clk})
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
}
