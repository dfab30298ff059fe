package dynamostore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/store"
)

// cacheKeysPerRead is BatchGetItem's limit of keys per call.
const cacheKeysPerRead = 100

// maxUnprocessedRounds bounds the re-requests of keys or items DynamoDB
// left unprocessed (throttling, or a response over 16 MB).
const maxUnprocessedRounds = 8

// GetCached reads the live (unexpired) cache entries of keys with one
// BatchGetItem per 100 distinct keys, strongly consistent, so an output cached a moment ago by
// another worker is found rather than billed again. Keys DynamoDB leaves
// unprocessed are asked for again with jittered backoff.
func (s *Store) GetCached(ctx context.Context, keys []string) (map[string]string, error) {
	distinct := slices.Clone(keys)
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	out := make(map[string]string, len(distinct))
	for start := 0; start < len(distinct); start += cacheKeysPerRead {
		part := distinct[start:min(start+cacheKeysPerRead, len(distinct))]
		ks := make([]map[string]types.AttributeValue, len(part))
		for i, k := range part {
			ks[i] = key(cachePK(k), cacheSK)
		}
		req := map[string]types.KeysAndAttributes{s.table: {Keys: ks, ConsistentRead: aws.Bool(true)}}
		for round := 1; len(req) > 0; round++ {
			if round > maxUnprocessedRounds {
				return nil, fmt.Errorf("get %d cached outputs: keys still unprocessed after %d rounds", len(part), maxUnprocessedRounds)
			}
			if round > 1 {
				if err := s.pause(ctx, round); err != nil {
					return nil, fmt.Errorf("get %d cached outputs: %w", len(part), err)
				}
			}
			res, err := s.db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			if err != nil {
				return nil, fmt.Errorf("get %d cached outputs: %w", len(part), err)
			}
			now := s.opts.Clock.Now().Unix()
			for _, item := range res.Responses[s.table] {
				var it cacheItem
				if err := attributevalue.UnmarshalMap(item, &it); err != nil {
					return nil, fmt.Errorf("get cached outputs: decode: %w", err)
				}
				if it.ExpiresAt != 0 && it.ExpiresAt <= now {
					// Expired: DynamoDB's TTL deletes it in its own time
					// (within days), and until then it is not reused.
					continue
				}
				out[it.PK[len(cachePrefix):]] = it.Output
			}
			req = res.UnprocessedKeys
		}
	}
	return out, nil
}

// pause waits before re-requesting unprocessed keys or items: full jitter
// over 50 ms, 100 ms, ... capped at 2 s.
func (s *Store) pause(ctx context.Context, round int) error {
	wait := time.Duration(rand.Int64N(int64(min(25*time.Millisecond<<round, 2*time.Second))))
	select {
	case <-s.opts.Clock.After(wait):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newCacheItem is the item of a cache entry created now.
func (s *Store) newCacheItem(k, output string) cacheItem {
	now := s.opts.Clock.Now()
	it := cacheItem{PK: cachePK(k), SK: cacheSK, Output: output, CreatedAt: encodeTime(now)}
	if s.opts.CacheTTL > 0 {
		it.ExpiresAt = now.Add(s.opts.CacheTTL).Unix()
	}
	return it
}

// PutCached puts a cache entry unless the key has one (put-if-absent, so
// the first output stays). An output too large for one item is refused
// with ErrItemTooLarge; the caller logs it and goes on uncached.
func (s *Store) PutCached(ctx context.Context, k, output string) error {
	av, err := marshal(s.newCacheItem(k, output))
	if err != nil {
		return fmt.Errorf("put cached %s: %w", k, err)
	}
	if size := itemSize(av); size > maxItemSize {
		return fmt.Errorf("put cached %s: output of %d bytes: %w (limit %d bytes)", k, len(output), ErrItemTooLarge, maxItemSize)
	}
	if _, err := s.putIfAbsent(ctx, av); err != nil {
		return fmt.Errorf("put cached %s: %w", k, err)
	}
	return nil
}

// cacheUpdate is the transaction item of SaveRowResults that creates a
// cache entry unless the key has one: every attribute is set with
// if_not_exists, so an existing entry keeps its output and the item never
// fails a condition (which would cancel the whole group). It is nil for an
// output too large for an item: the entry is left out.
func (s *Store) cacheUpdate(c store.CacheEntry) *types.Update {
	it := s.newCacheItem(c.Key, c.Output)
	av, err := marshal(it)
	if err != nil || itemSize(av) > maxItemSize {
		return nil
	}
	e := newExpr()
	u := &update{e: e}
	for _, attr := range []string{attrOutput, attrCreatedAt, attrExpiresAt} {
		if v, ok := av[attr]; ok {
			u.set = append(u.set, fmt.Sprintf("%s = if_not_exists(%s, %s)", e.n(attr), e.n(attr), e.v(v)))
		}
	}
	return &types.Update{
		TableName:                 aws.String(s.table),
		Key:                       key(it.PK, it.SK),
		UpdateExpression:          aws.String(u.String()),
		ExpressionAttributeNames:  e.attrNames(),
		ExpressionAttributeValues: e.attrValues(),
	}
}

// CacheTTL is how long this store keeps a cache entry (Options.CacheTTL
// with its default; negative: forever), for wiring checks.
func (s *Store) CacheTTL() time.Duration { return s.opts.CacheTTL }
