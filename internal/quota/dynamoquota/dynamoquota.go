// Package dynamoquota keeps a provider's per-second request budget in the
// DynamoDB table, so every Lambda instance draws from one quota
// (quota.Shared leases blocks of it).
package dynamoquota

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/quota"
)

// keepSeconds is how long a second's counter item lives (TTL), long enough
// for an operator to look at recent usage.
const keepSeconds = 3600

// Leaser leases tokens from per-second counter items: PK "QUOTA#<name>",
// SK "S#<unix second>", attribute used. One lease is one conditional
// update; when the block does not fit, a second update takes what is left.
type Leaser struct {
	client *dynamodb.Client
	table  string
	name   string
}

var _ quota.Leaser = (*Leaser)(nil)

// New returns a Leaser for the quota called name (e.g. the provider and
// model) in table.
func New(client *dynamodb.Client, table, name string) *Leaser {
	return &Leaser{client: client, table: table, name: name}
}

// Lease takes up to want of second's limit tokens and returns how many it got.
func (l *Leaser) Lease(ctx context.Context, second int64, want, limit int) (int, error) {
	for want > 0 {
		_, err := l.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(l.table),
			Key: map[string]types.AttributeValue{
				"PK": &types.AttributeValueMemberS{Value: "QUOTA#" + l.name},
				"SK": &types.AttributeValueMemberS{Value: "S#" + strconv.FormatInt(second, 10)},
			},
			UpdateExpression:                    aws.String("ADD used :n SET expires_at = if_not_exists(expires_at, :ttl)"),
			ConditionExpression:                 aws.String("attribute_not_exists(used) OR used <= :max"),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":n":   &types.AttributeValueMemberN{Value: strconv.Itoa(want)},
				":max": &types.AttributeValueMemberN{Value: strconv.Itoa(limit - want)},
				":ttl": &types.AttributeValueMemberN{Value: strconv.FormatInt(second+keepSeconds, 10)},
			},
		})
		if err == nil {
			return want, nil
		}
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			return 0, fmt.Errorf("lease %d tokens of quota %s second %d: %w", want, l.name, second, err)
		}
		used := limit
		if n, ok := ccf.Item["used"].(*types.AttributeValueMemberN); ok {
			if v, err := strconv.Atoi(n.Value); err == nil {
				used = v
			}
		}
		left := limit - used
		if left <= 0 {
			return 0, nil // this second is spent
		}
		// Ask again for what is left; never the same amount twice, so a
		// lease racing others always ends.
		want = min(want-1, left)
	}
	return 0, nil
}
