//go:build emulator

package dynamoquota_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/awsops"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/quota"
	"github.com/batchgen/batchgen/internal/quota/dynamoquota"
	"github.com/batchgen/batchgen/internal/quota/quotatest"
	"github.com/batchgen/batchgen/internal/samstack"
)

// table provisions the stack's table from template.yaml once per test.
func table(t *testing.T) (aws.Config, string) {
	t.Helper()
	ctx := t.Context()
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := samstack.Provision(ctx, cfg, "../../../template.yaml", samstack.UniquePrefix("quota"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Cleanup(context.Background()) })
	return cfg, res.TableName
}

// exactClient is a DynamoDB client for the tests that hold the table's
// counters to the in-memory model's to the unit: it makes one attempt per
// call. The SDK retries a call whose answer was lost, and a loaded
// emulator loses some (TestDLQOnSQS saw it with SQS): an ADD it had
// applied then counts twice. On AWS that over-counts a second's use, the
// safe side of a quota; here it would void the comparison, so a failed
// call is an error, and the comparison starts again (onFreshItems).
func exactClient(cfg aws.Config) *dynamodb.Client {
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} })
}

// onFreshItems runs compare until it returns no error, at most three
// times, each time with another suffix for its quota names, so that it
// starts on items no earlier attempt touched. compare returns the error of
// a call that failed (the comparison is void then) and reports its
// differences itself.
func onFreshItems(t *testing.T, compare func(suffix string) error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := compare(fmt.Sprintf("-%d", attempt))
		if err == nil {
			return
		}
		if attempt == 3 {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		t.Logf("attempt %d: %v; comparing again on fresh items", attempt, err)
	}
}

// TestLeaseNeverExceedsLimit: concurrent leases of five seconds across
// two minutes, from four
// "instances", hand out exactly each second's limit and not one token more,
// on the table provisioned from template.yaml.
func TestLeaseNeverExceedsLimit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, tableName := table(t)
	client := exactClient(cfg)
	limit := quota.Limit{Requests: 25, Tokens: 2500}
	// Start mid-minute and run over its end: the leases span two items.
	second := time.Now().Unix()/60*60 + 57
	want := []quota.Amount{{Requests: 3, Tokens: 200}, {Requests: 3, Tokens: 200}, {Requests: 3, Tokens: 200}, {Requests: 3, Tokens: 200}, {Requests: 3, Tokens: 200}}
	var name string
	onFreshItems(t, func(suffix string) error {
		name = "openai:gpt" + suffix
		var mu sync.Mutex
		total := make([]quota.Amount, len(want))
		var failed error
		var wg sync.WaitGroup
		for i := range 4 {
			l := dynamoquota.New(client, tableName, name)
			wg.Go(func() {
				for {
					ask := slices.Clone(want)
					ask[i].Requests += i // different sizes race
					ask[(i+1)%len(ask)].Tokens += 100 * i
					lease, err := l.Lease(ctx, second, ask, limit, quota.Ceiling{})
					mu.Lock()
					if err != nil {
						if failed == nil {
							failed = err
						}
						mu.Unlock()
						return
					}
					sum := 0
					for j, n := range lease.Got {
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
		if failed != nil {
			return failed
		}
		if diff := cmp.Diff(slices.Repeat([]quota.Amount{{Requests: 25, Tokens: 2500}}, 5), total); diff != "" {
			t.Errorf("budget leased per second (-want +got):\n%s", diff)
		}
		return nil
	})
	// Another second has its own budget; another quota name too; without
	// a token limit no tokens are counted.
	got, err := dynamoquota.New(client, tableName, name).Lease(ctx, second+5, []quota.Amount{{Requests: 5, Tokens: 100}, {Requests: 30, Tokens: 9000}}, limit, quota.Ceiling{})
	if diff := cmp.Diff([]quota.Amount{{Requests: 5, Tokens: 100}, {Requests: 25, Tokens: 2500}}, got.Got); err != nil || diff != "" {
		t.Errorf("next seconds: err %v, (-want +got):\n%s", err, diff)
	}
	got, err = dynamoquota.New(client, tableName, "other").Lease(ctx, second, []quota.Amount{{Requests: 5, Tokens: 100}}, quota.Limit{Requests: 25}, quota.Ceiling{})
	if diff := cmp.Diff([]quota.Amount{{Requests: 5, Tokens: 0}}, got.Got); err != nil || diff != "" {
		t.Errorf("another quota without TPM: err %v, (-want +got):\n%s", err, diff)
	}
}

// TestCeilingTravelsWithLeases: a ceiling lowered in one minute's item
// (Lower, conditional on the store holding nothing newer than the writer
// saw) cuts every later lease's budget, reaches a process that knew
// nothing through its lease (one retried update, no read), and is carried
// into the next minute's item by a lease that spans it, where a fresh
// process learns it too; an older ceiling never replaces a newer one.
func TestCeilingTravelsWithLeases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, tableName := table(t)
	rec := awsops.New()
	client := exactClient(rec.Attach(cfg))
	limit := quota.Limit{Requests: 20, Tokens: 2000}
	// A minute two minutes ahead, ceilings set 50 s into it: the seconds
	// leased below are within the ceiling's first 20 s (no probe yet).
	minute := time.Now().Unix()/60*60 + 120
	at := (minute + 50) * 1000
	half := quota.Ceiling{Share: 0.5, At: at, Quiet: at + 10_000}
	onFreshItems(t, func(suffix string) error {
		name := "ceiling" + suffix
		writer, fresh := dynamoquota.New(client, tableName, name), dynamoquota.New(client, tableName, name)

		stored, err := writer.Lower(ctx, quota.Ceiling{}, half)
		if err != nil {
			return fmt.Errorf("lower on an empty store: %w", err)
		}
		if stored != half {
			t.Fatalf("Lower on an empty store = %+v; want %+v stored", stored, half)
		}
		// A second cut based on the same (empty) knowledge loses to the first.
		stale := quota.Ceiling{Share: 0.25, At: at + 500, Quiet: at + 10_500}
		if stored, err := writer.Lower(ctx, quota.Ceiling{}, stale); err != nil {
			return fmt.Errorf("lower from stale knowledge: %w", err)
		} else if stored != half {
			t.Errorf("Lower from stale knowledge = %+v; want the stored %+v kept", stored, half)
		}

		// A process that knows no ceiling learns it from its lease: half of
		// each second's budget, spread (10 requests, 1000 tokens a second).
		rec.Reset()
		want := []quota.Amount{{Requests: 20, Tokens: 2000}, {Requests: 20, Tokens: 2000}}
		lease, err := fresh.Lease(ctx, minute+55, want, limit, quota.Ceiling{})
		if err != nil {
			return err
		}
		if lease.Ceiling != half {
			t.Errorf("lease learned ceiling %+v, want %+v", lease.Ceiling, half)
		}
		if diff := cmp.Diff([]quota.Amount{{Requests: 10, Tokens: 1000}, {Requests: 10, Tokens: 1000}}, lease.Got); diff != "" {
			t.Errorf("budget under the ceiling (-want +got):\n%s", diff)
		}
		if n := rec.Total(); n != 2 {
			t.Errorf("learning the ceiling took %d DynamoDB calls (%v), want 2 (the update and its retry)", n, rec.Counts())
		}

		// A lease over the minute's end stores the ceiling in the next
		// minute's item; a process knowing nothing learns it there.
		if _, err := writer.Lease(ctx, minute+59, []quota.Amount{{Requests: 1}, {Requests: 1}}, limit, half); err != nil {
			return err
		}
		next := dynamoquota.New(client, tableName, name)
		lease, err = next.Lease(ctx, minute+61, []quota.Amount{{Requests: 20}}, quota.Limit{Requests: 20}, quota.Ceiling{})
		if err != nil {
			return err
		}
		if lease.Ceiling != half || lease.Got[0].Requests != 10 {
			t.Errorf("next minute: lease got %+v under %+v, want 10 requests under %+v", lease.Got, lease.Ceiling, half)
		}

		// A newer ceiling a lease carries replaces the stored one; an older
		// one known by a lagging process does not.
		newer := quota.Ceiling{Share: 0.3, At: at + 2000, Quiet: at + 12_000}
		lease, err = writer.Lease(ctx, minute+56, []quota.Amount{{Requests: 1}}, limit, newer)
		if err != nil {
			return err
		}
		if lease.Ceiling != newer {
			t.Fatalf("lease carrying a newer ceiling = %+v", lease)
		}
		lease, err = fresh.Lease(ctx, minute+57, []quota.Amount{{Requests: 20}}, limit, half)
		if err != nil {
			return err
		}
		if lease.Ceiling != newer || lease.Got[0].Requests != newer.Budget(limit, minute+57).Requests {
			t.Errorf("lagging lease got %+v under %+v, want %d under %+v", lease.Got, lease.Ceiling, newer.Budget(limit, minute+57).Requests, newer)
		}
		// A first cut on trial keeps its mark through the store.
		trial := quota.Ceiling{Share: 0.15, At: at + 3000, Quiet: at + 33_000, Trial: true}
		if stored, err := writer.Lower(ctx, newer, trial); err != nil {
			return fmt.Errorf("lower to a ceiling on trial: %w", err)
		} else if stored != trial {
			t.Errorf("Lower to a ceiling on trial = %+v; want %+v stored", stored, trial)
		}
		if lease, err := fresh.Lease(ctx, minute+58, []quota.Amount{{Requests: 1}}, limit, newer); err != nil {
			return err
		} else if lease.Ceiling != trial {
			t.Errorf("lease after a trial cut = %+v; want the trial %+v", lease, trial)
		}
		return nil
	})
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
// model calls, and not one second over its budget, with and without a token
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
			const rpm = 3000 // 49.2 a second after the margin; the processes draw 16 each
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
			limit := quota.Limit{Requests: quota.PerSecond(rpm, quota.DefaultSafetyMargin)}
			for sec, n := range perSecond {
				if b := (quota.Ceiling{}).Budget(limit, sec).Requests; n > b {
					t.Errorf("second %d started %d requests, more than its budget of %d", sec-quotatest.Base.Unix(), n, b)
				}
			}
		})
	}
}

// TestLeaseSaysWhatIsLeft: what a lease reads back of its minute's item
// (the seconds it asked for and the rest of the last minute it touched) is
// what the in-memory store, which follows the same rules, says after the
// same leases: across a minute's end, with a second used up by another
// process, with tokens and without, and under a ceiling.
func TestLeaseSaysWhatIsLeft(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, tableName := table(t)
	client := exactClient(cfg)
	minute := time.Now().Unix()/60*60 + 180
	at := (minute - 30) * 1000
	half := quota.Ceiling{Share: 0.5, At: at, Quiet: at}
	steps := []struct {
		from  int64
		want  []quota.Amount
		limit quota.Limit
		known quota.Ceiling
	}{
		{from: minute + 57, want: []quota.Amount{{Requests: 3, Tokens: 30}, {Requests: 4, Tokens: 40}, {Requests: 5, Tokens: 50}, {Requests: 6, Tokens: 60}}, limit: quota.Limit{Requests: 10, Tokens: 100}},
		{from: minute + 58, want: []quota.Amount{{Requests: 10, Tokens: 10}, {Requests: 1, Tokens: 1}}, limit: quota.Limit{Requests: 10, Tokens: 100}},
		{from: minute + 58, want: []quota.Amount{{Requests: 2, Tokens: 2}}, limit: quota.Limit{Requests: 10, Tokens: 100}},
		{from: minute + 70, want: []quota.Amount{{Requests: 4}}, limit: quota.Limit{Requests: 10}, known: half},
	}
	onFreshItems(t, func(suffix string) error {
		for i, name := range []string{"left-tokens", "left-tokens", "left-tokens", "left-requests"} {
			st := steps[i]
			mem := quota.NewMemLeaser()
			// The memory store replays every earlier step of the same quota.
			for _, prev := range steps[:i] {
				if name == "left-tokens" {
					if _, err := mem.Lease(ctx, prev.from, prev.want, prev.limit, prev.known); err != nil {
						t.Fatal(err)
					}
				}
			}
			want, err := mem.Lease(ctx, st.from, st.want, st.limit, st.known)
			if err != nil {
				t.Fatal(err)
			}
			got, err := dynamoquota.New(client, tableName, name+suffix).Lease(ctx, st.from, st.want, st.limit, st.known)
			if err != nil {
				return fmt.Errorf("step %d: %w", i, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("step %d (-memory +dynamodb):\n%s", i, diff)
			}
			if n := int(minute + 60*((st.from+int64(len(st.want))-1-minute)/60) + 60 - st.from); len(got.Left) != n {
				t.Errorf("step %d: %d seconds left, want %d (to the end of the last minute asked for)", i, len(got.Left), n)
			}
		}
		return nil
	})
}

// TestReleaseGivesBack: Release subtracts what it gives from the counters
// of each minute's item (requests and tokens, across a minute's end), so
// a later lease gets it, as in the in-memory store; an item that is gone
// is not recreated by a release.
func TestReleaseGivesBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, tableName := table(t)
	rec := awsops.New()
	client := exactClient(rec.Attach(cfg))
	minute := time.Now().Unix()/60*60 + 240
	limit := quota.Limit{Requests: 10, Tokens: 100}
	steps := []func(quota.Leaser) (quota.Lease, error){
		func(s quota.Leaser) (quota.Lease, error) {
			return s.Lease(ctx, minute+58, []quota.Amount{{Requests: 5, Tokens: 50}, {Requests: 5, Tokens: 50}, {Requests: 5, Tokens: 50}}, limit, quota.Ceiling{})
		},
		func(s quota.Leaser) (quota.Lease, error) {
			return quota.Lease{}, s.Release(ctx, minute+59, []quota.Amount{{Requests: 2, Tokens: 20}, {Requests: 3}})
		},
		func(s quota.Leaser) (quota.Lease, error) {
			return s.Lease(ctx, minute+58, []quota.Amount{{Requests: 10, Tokens: 100}, {Requests: 10, Tokens: 100}, {Requests: 10, Tokens: 100}}, limit, quota.Ceiling{})
		},
	}
	var (
		name string
		l    *dynamoquota.Leaser
	)
	onFreshItems(t, func(suffix string) error {
		name = "release" + suffix
		l = dynamoquota.New(client, tableName, name)
		mem := quota.NewMemLeaser()
		for i, step := range steps {
			rec.Reset()
			want, err := step(mem)
			if err != nil {
				t.Fatal(err)
			}
			got, err := step(l)
			if err != nil {
				return fmt.Errorf("step %d: %w", i, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("step %d (-memory +dynamodb):\n%s", i, diff)
			}
			if i == 1 && rec.Total() != 2 {
				t.Errorf("a release across a minute's end made %d calls, want 2 (one per item)", rec.Total())
			}
			if i == 1 {
				// Room reads what is left, and the releases into the minutes
				// read, as the memory store counts them: one per item read.
				wantRoom, _ := mem.Room(ctx, minute+57, 4, limit)
				rec.Reset()
				gotRoom, err := l.Room(ctx, minute+57, 4, limit)
				if err != nil {
					return fmt.Errorf("room: %w", err)
				}
				if diff := cmp.Diff(wantRoom, gotRoom); diff != "" || gotRoom.Releases != 2 {
					t.Errorf("room (-memory +dynamodb):\n%s\n%d releases, want 2", diff, gotRoom.Releases)
				}
				if rec.Total() != 2 || rec.Counts()["dynamodb:GetItem"] != 2 {
					t.Errorf("room across a minute's end made %v, want 2 reads", rec.Counts())
				}
			}
		}
		return nil
	})
	// The last lease got 5 - 0, 5 + 2 and 5 + 3: what was released.
	// A release to a minute with no item leaves it absent.
	gone := minute + 600
	if err := l.Release(ctx, gone, []quota.Amount{{Requests: 4}}); err != nil {
		t.Fatalf("release to a missing item: %v", err)
	}
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(tableName), Key: map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "QUOTA#" + name},
		"SK": &types.AttributeValueMemberS{Value: fmt.Sprintf("M#%d", gone)},
	}})
	if err != nil || out.Item != nil {
		t.Errorf("release to a missing item: GetItem = %v, %v; want no item", out.Item, err)
	}
}
