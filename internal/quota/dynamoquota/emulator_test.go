//go:build emulator

package dynamoquota_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/batchgen/batchgen/internal/awsemu"
	"github.com/batchgen/batchgen/internal/quota"
	"github.com/batchgen/batchgen/internal/quota/dynamoquota"
)

// TestLeaseNeverExceedsLimit: concurrent leases of one second, from four
// "instances", hand out exactly the second's limit and not one token more,
// on the table provisioned from template.yaml.
func TestLeaseNeverExceedsLimit(t *testing.T) {
	ctx := context.Background()
	cfg, err := awsemu.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := awsemu.Provision(ctx, cfg, "../../../template.yaml", awsemu.UniquePrefix("quota"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Cleanup(context.Background())
	client := dynamodb.NewFromConfig(cfg)
	const limit = 25
	second := time.Now().Unix()
	var mu sync.Mutex
	total := 0
	var wg sync.WaitGroup
	for i := range 4 {
		l := dynamoquota.New(client, res.TableName, "openai:gpt")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				got, err := l.Lease(ctx, second, 3+i, limit)
				if err != nil {
					t.Error(err)
					return
				}
				if got == 0 {
					return
				}
				mu.Lock()
				total += got
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if total != limit {
		t.Errorf("leased %d tokens of a %d-token second", total, limit)
	}
	// Another second has its own budget; another quota name too.
	if got, err := dynamoquota.New(client, res.TableName, "openai:gpt").Lease(ctx, second+1, 5, limit); err != nil || got != 5 {
		t.Errorf("next second: got %d, %v; want 5", got, err)
	}
	if got, err := dynamoquota.New(client, res.TableName, "other").Lease(ctx, second, 5, limit); err != nil || got != 5 {
		t.Errorf("another quota: got %d, %v; want 5", got, err)
	}

	// Through quota.Shared: two limiters pace against the same table.
	var starts sync.Map
	var wg2 sync.WaitGroup
	wctx, cancel := context.WithTimeout(ctx, 2200*time.Millisecond)
	defer cancel()
	for range 2 {
		s, err := quota.NewShared(dynamoquota.New(client, res.TableName, "shared"), quota.SharedConfig{RPM: 600})
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			wg2.Add(1)
			go func() {
				defer wg2.Done()
				for s.Wait(wctx) == nil {
					sec := time.Now().Unix()
					v, _ := starts.LoadOrStore(sec, new(int64))
					mu.Lock()
					*v.(*int64)++
					mu.Unlock()
				}
			}()
		}
	}
	wg2.Wait()
	starts.Range(func(k, v any) bool {
		if n := *v.(*int64); n > 9 { // floor(600/60 x 0.99)
			t.Errorf("second %d started %d requests, more than 9", k, n)
		}
		return true
	})
}
