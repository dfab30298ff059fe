// Package dynamoquota keeps a provider's per-second request budget in the
// DynamoDB table, so every Lambda instance draws from one quota
// (quota.Shared leases blocks of it).
package dynamoquota

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/batchgen/batchgen/internal/quota"
)

// keepSeconds is how long a minute's counter item lives (TTL), long enough
// for an operator to look at recent usage.
const keepSeconds = 3600

// Leaser leases budgets from per-minute counter items: PK "QUOTA#<name>",
// SK "M#<unix second of the minute>", one number attribute per second of
// the minute for the requests handed out ("s00" to "s59") and, under a
// tokens-per-minute quota, one for the model tokens ("t00" to "t59"). A
// lease of several seconds of one minute is one conditional update,
// requests and tokens together; when a second cannot cover what was asked,
// the update is retried with what is left.
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

// Lease takes up to want[i] of second from+i's limit and returns how much
// it got for each second: one update per minute the seconds touch.
func (l *Leaser) Lease(ctx context.Context, from int64, want []quota.Amount, limit quota.Amount) ([]quota.Amount, error) {
	got := make([]quota.Amount, len(want))
	for i := 0; i < len(want); {
		minute := (from + int64(i)) / 60 * 60
		n := min(len(want)-i, int(minute+60-(from+int64(i))))
		if err := l.leaseMinute(ctx, minute, from+int64(i), want[i:i+n], got[i:i+n], limit); err != nil {
			return nil, err
		}
		i += n
	}
	return got, nil
}

// counter is one attribute of the minute's item: a second's requests or
// tokens.
type counter struct {
	attr  string
	ask   *int
	limit int
}

// leaseMinute leases want[j] of second from+j, all in the minute starting
// at minute, into got.
func (l *Leaser) leaseMinute(ctx context.Context, minute, from int64, want, got []quota.Amount, limit quota.Amount) error {
	ask := make([]quota.Amount, len(want))
	var counters []counter
	for j, w := range want {
		ask[j] = quota.Amount{Requests: max(min(w.Requests, limit.Requests), 0), Tokens: max(min(w.Tokens, limit.Tokens), 0)}
		sec := from + int64(j) - minute
		counters = append(counters, counter{fmt.Sprintf("s%02d", sec), &ask[j].Requests, limit.Requests})
		if limit.Tokens > 0 {
			counters = append(counters, counter{fmt.Sprintf("t%02d", sec), &ask[j].Tokens, limit.Tokens})
		}
	}
	for {
		var adds, conds []string
		names := map[string]string{}
		values := map[string]types.AttributeValue{
			":ttl": &types.AttributeValueMemberN{Value: strconv.FormatInt(minute+60+keepSeconds, 10)},
		}
		for _, c := range counters {
			n := *c.ask
			if n == 0 {
				continue
			}
			attr := c.attr
			names["#"+attr] = attr
			values[":n"+attr] = &types.AttributeValueMemberN{Value: strconv.Itoa(n)}
			values[":m"+attr] = &types.AttributeValueMemberN{Value: strconv.Itoa(c.limit - n)}
			adds = append(adds, fmt.Sprintf("#%s :n%s", attr, attr))
			conds = append(conds, fmt.Sprintf("(attribute_not_exists(#%s) OR #%s <= :m%s)", attr, attr, attr))
		}
		if len(adds) == 0 {
			return nil // every second asked for is spent
		}
		_, err := l.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(l.table),
			Key: map[string]types.AttributeValue{
				"PK": &types.AttributeValueMemberS{Value: "QUOTA#" + l.name},
				"SK": &types.AttributeValueMemberS{Value: "M#" + strconv.FormatInt(minute, 10)},
			},
			UpdateExpression:                    aws.String("ADD " + strings.Join(adds, ", ") + " SET expires_at = if_not_exists(expires_at, :ttl)"),
			ConditionExpression:                 aws.String(strings.Join(conds, " AND ")),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			ExpressionAttributeNames:            names,
			ExpressionAttributeValues:           values,
		})
		if err == nil {
			copy(got, ask)
			return nil
		}
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			return fmt.Errorf("lease quota %s seconds %d to %d: %w", l.name, from, from+int64(len(want))-1, err)
		}
		// Ask again for what is left of each counter. At least one ask
		// shrinks each round (the one whose condition failed), and the
		// counters only grow, so a lease racing others always ends.
		for _, c := range counters {
			used := 0
			if n, ok := ccf.Item[c.attr].(*types.AttributeValueMemberN); ok {
				if v, err := strconv.Atoi(n.Value); err == nil {
					used = v
				}
			} else if len(ccf.Item) == 0 {
				used = c.limit // no item to read back: assume the worst
			}
			*c.ask = max(min(*c.ask, c.limit-used), 0)
		}
	}
}
