package dynamostore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Open event streams, one item each while it is open:
//
//	stream  PK=STREAMS#<owner>  SK=STREAM#<random id>  expires_at=<its end>
//
// so that the events function's instances, each serving one stream, can
// count a principal's streams between them. An invocation that dies
// without deleting its item leaves it to its end (expires_at), where the
// count stops seeing it; TTL removes it later.
const (
	streamsPrefix = "STREAMS#"
	streamPrefix  = "STREAM#"
)

// EnterStream admits an event stream of owner's that ends by until, unless
// owner has max open (max <= 0: no cap), and returns the func that ends it.
// The count is one strongly consistent Query of the owner's partition and
// the admission one PutItem, not one transaction: streams opening at the
// same instant may pass the cap by a few, which a bound on viewers can
// live with.
func (s *Store) EnterStream(ctx context.Context, owner string, max int, until time.Time) (leave func(context.Context) error, ok bool, err error) {
	pk := streamsPrefix + owner
	now := s.opts.Clock.Now()
	if max > 0 {
		out, err := s.db.Query(ctx, &dynamodb.QueryInput{
			TableName:                 aws.String(s.table),
			KeyConditionExpression:    aws.String("#pk = :pk"),
			FilterExpression:          aws.String("#exp > :now"),
			ExpressionAttributeNames:  map[string]string{"#pk": attrPK, "#exp": attrExpiresAt},
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: pk}, ":now": number(now.Unix())},
			Select:                    types.SelectCount,
			ConsistentRead:            aws.Bool(true),
		})
		if err != nil {
			return nil, false, fmt.Errorf("count the open streams of %s: %w", owner, err)
		}
		if int(out.Count) >= max {
			return nil, false, nil
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	item := key(pk, streamPrefix+hex.EncodeToString(b[:]))
	item[attrExpiresAt] = number(until.Unix())
	if _, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.table), Item: item}); err != nil {
		return nil, false, fmt.Errorf("open a stream of %s: %w", owner, err)
	}
	return func(ctx context.Context) error {
		if _, err := s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(s.table), Key: key(pk, item[attrSK].(*types.AttributeValueMemberS).Value)}); err != nil {
			return fmt.Errorf("close a stream of %s: %w", owner, err)
		}
		return nil
	}, true, nil
}

// number is n as a DynamoDB number.
func number(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
