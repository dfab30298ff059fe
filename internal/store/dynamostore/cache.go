package dynamostore

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// GetCached reads a cache entry, strongly consistent, so an output cached
// a moment ago by another worker is found rather than billed again.
func (s *Store) GetCached(ctx context.Context, k string) (string, bool, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            key(cachePK(k), cacheSK),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return "", false, fmt.Errorf("get cached %s: %w", k, err)
	}
	if len(out.Item) == 0 {
		return "", false, nil
	}
	var it cacheItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return "", false, fmt.Errorf("get cached %s: decode: %w", k, err)
	}
	return it.Output, true, nil
}

// PutCached puts a cache entry unless the key has one (put-if-absent, so
// the first output stays). An output too large for one item is refused
// with ErrItemTooLarge; the caller logs it and goes on uncached.
func (s *Store) PutCached(ctx context.Context, k, output string) error {
	now := s.opts.Clock.Now()
	it := cacheItem{PK: cachePK(k), SK: cacheSK, Output: output, CreatedAt: encodeTime(now)}
	if s.opts.CacheTTL > 0 {
		it.ExpiresAt = now.Add(s.opts.CacheTTL).Unix()
	}
	av, err := marshal(it)
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
