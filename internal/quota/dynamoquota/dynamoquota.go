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
//
// The deployment's quota.Ceiling lives in the same items ("cs" its share,
// "ca" when it was set and "cq" its quiet time, in Unix milliseconds, "cf"
// whether the provider stated it), so that a lease learns it at no extra
// cost: every lease is conditional on the item holding no newer ceiling
// than the leaser knows (and stores the one it knows), so a lease made
// with an old ceiling fails, reads the newer one back from the failure and
// is retried under it. A cut (Lower) writes the item of the minute it
// happens in; the processes that know it carry it into the next minutes'
// items with their leases.
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

// Attributes of the ceiling in a minute's item.
const (
	// attrReleases counts the releases made into the minute (see Room).
	attrReleases = "rc"
	attrShare    = "cs"
	attrAt       = "ca"
	attrQuiet    = "cq"
	attrFixed    = "cf"
	attrTrial    = "ct"
)

// Lease takes up to want[i] of second from+i's budget under the newest
// ceiling and returns how much it got for each second and that ceiling:
// one update per minute the seconds touch (and one more for a minute whose
// item holds a ceiling newer than known).
func (l *Leaser) Lease(ctx context.Context, from int64, want []quota.Amount, limit quota.Limit, known quota.Ceiling) (quota.Lease, error) {
	got := make([]quota.Amount, len(want))
	var left []quota.Amount
	blind := false
	for i := 0; i < len(want); {
		minute := (from + int64(i)) / 60 * 60
		n := min(len(want)-i, int(minute+60-(from+int64(i))))
		var (
			err  error
			rest []quota.Amount
		)
		if known, rest, err = l.leaseMinute(ctx, minute, from+int64(i), want[i:i+n], got[i:i+n], limit, known); err != nil {
			return quota.Lease{}, err
		}
		switch {
		case len(rest) < n:
			// Nothing read back for this minute: the seconds after it
			// would not line up.
			blind = true
		case !blind && i+n < len(want):
			left = append(left, rest[:n]...) // the next minute's item says the rest
		case !blind:
			left = append(left, rest...)
		}
		i += n
	}
	return quota.Lease{Got: got, Ceiling: known, Left: left}, nil
}

// counter is one attribute of the minute's item: a second's requests or
// tokens.
type counter struct {
	attr   string
	ask    *int
	sec    int64
	tokens bool
}

// limit is the counter's budget under ceiling c.
func (c counter) limit(limit quota.Limit, ceiling quota.Ceiling) int {
	b := ceiling.Budget(limit, c.sec)
	if c.tokens {
		return b.Tokens
	}
	return b.Requests
}

// key is the item of the minute starting at minute.
func (l *Leaser) key(minute int64) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "QUOTA#" + l.name},
		"SK": &types.AttributeValueMemberS{Value: "M#" + strconv.FormatInt(minute, 10)},
	}
}

// ceilingSet adds the SET of ceiling c to an update's names and values.
func ceilingSet(c quota.Ceiling, names map[string]string, values map[string]types.AttributeValue) string {
	for _, a := range []string{attrShare, attrAt, attrQuiet, attrFixed, attrTrial} {
		names["#"+a] = a
	}
	values[":cs"] = &types.AttributeValueMemberN{Value: strconv.FormatFloat(c.Share, 'g', -1, 64)}
	values[":ca"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(c.At, 10)}
	values[":cq"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(c.Quiet, 10)}
	values[":cf"] = &types.AttributeValueMemberBOOL{Value: c.Fixed}
	values[":ct"] = &types.AttributeValueMemberBOOL{Value: c.Trial}
	return "#cs = :cs, #ca = :ca, #cq = :cq, #cf = :cf, #ct = :ct"
}

// ceilingOf reads the ceiling an item holds; the zero Ceiling when none
// (or a malformed one: an operator's edit must not stop the generators).
func ceilingOf(item map[string]types.AttributeValue) quota.Ceiling {
	num := func(attr string) (float64, bool) {
		n, ok := item[attr].(*types.AttributeValueMemberN)
		if !ok {
			return 0, false
		}
		v, err := strconv.ParseFloat(n.Value, 64)
		return v, err == nil
	}
	share, ok1 := num(attrShare)
	at, ok2 := num(attrAt)
	if !ok1 || !ok2 || share <= 0 || at <= 0 {
		return quota.Ceiling{}
	}
	c := quota.Ceiling{Share: min(share, 1), At: int64(at)}
	if q, ok := num(attrQuiet); ok {
		c.Quiet = int64(q)
	}
	if f, ok := item[attrFixed].(*types.AttributeValueMemberBOOL); ok {
		c.Fixed = f.Value
	}
	if tr, ok := item[attrTrial].(*types.AttributeValueMemberBOOL); ok {
		c.Trial = tr.Value
	}
	return c
}

// leaseMinute leases want[j] of second from+j, all in the minute starting
// at minute, into got, and returns the newest ceiling (known, or the
// item's when it is newer) and what the item has left of each second from
// from to the minute's end, read back from the same update.
func (l *Leaser) leaseMinute(ctx context.Context, minute, from int64, want, got []quota.Amount, limit quota.Limit, known quota.Ceiling) (quota.Ceiling, []quota.Amount, error) {
	ask := make([]quota.Amount, len(want))
	var counters []counter
	for j, w := range want {
		sec := from + int64(j)
		b := known.Budget(limit, sec)
		ask[j] = quota.Amount{Requests: max(min(w.Requests, b.Requests), 0), Tokens: max(min(w.Tokens, b.Tokens), 0)}
		counters = append(counters, counter{fmt.Sprintf("s%02d", sec-minute), &ask[j].Requests, sec, false})
		if limit.Tokens > 0 {
			counters = append(counters, counter{fmt.Sprintf("t%02d", sec-minute), &ask[j].Tokens, sec, true})
		}
	}
	// item is the item's ceiling as the last failed update read it back,
	// and lastItem that item.
	var item *quota.Ceiling
	var lastItem map[string]types.AttributeValue
	for {
		var adds, conds []string
		names := map[string]string{"#ca": attrAt}
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
			values[":m"+attr] = &types.AttributeValueMemberN{Value: strconv.Itoa(c.limit(limit, known) - n)}
			adds = append(adds, fmt.Sprintf("#%s :n%s", attr, attr))
			conds = append(conds, fmt.Sprintf("(attribute_not_exists(#%s) OR #%s <= :m%s)", attr, attr, attr))
		}
		if len(adds) == 0 {
			// Every second asked for is spent. The item still gets the
			// newer ceiling this process knows, so that processes that
			// lease there learn it.
			left := leftOf(lastItem, minute, from, limit, known)
			if item != nil && known.Newer(*item) {
				c, err := l.store(ctx, minute, *item, known)
				return c, left, err
			}
			return known, left, nil
		}
		set := "expires_at = if_not_exists(expires_at, :ttl)"
		if known.At > 0 {
			// Store the ceiling this process knows, unless the item holds
			// a newer one.
			set += ", " + ceilingSet(known, names, values)
			conds = append(conds, "(attribute_not_exists(#ca) OR #ca <= :ca)")
		} else {
			conds = append(conds, "attribute_not_exists(#ca)")
		}
		out, err := l.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                           aws.String(l.table),
			Key:                                 l.key(minute),
			UpdateExpression:                    aws.String("ADD " + strings.Join(adds, ", ") + " SET " + set),
			ConditionExpression:                 aws.String(strings.Join(conds, " AND ")),
			ReturnValues:                        types.ReturnValueAllNew,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			ExpressionAttributeNames:            names,
			ExpressionAttributeValues:           values,
		})
		if err == nil {
			copy(got, ask)
			return known, leftOf(out.Attributes, minute, from, limit, known), nil
		}
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			return known, nil, fmt.Errorf("lease quota %s seconds %d to %d: %w", l.name, from, from+int64(len(want))-1, err)
		}
		lastItem = ccf.Item
		// A newer ceiling in the item lowers the budgets. Then ask again
		// for what is left of each counter. At least one ask shrinks each
		// round (the one whose condition failed), or the ceiling becomes
		// the item's; the counters only grow, so a lease racing others
		// always ends.
		changed := false
		stored := ceilingOf(ccf.Item)
		item = &stored
		if stored.Newer(known) {
			known, changed = stored, true
		}
		for _, c := range counters {
			lim := c.limit(limit, known)
			used := 0
			if n, ok := ccf.Item[c.attr].(*types.AttributeValueMemberN); ok {
				if v, err := strconv.Atoi(n.Value); err == nil {
					used = v
				}
			} else if len(ccf.Item) == 0 {
				used = lim // no item to read back: assume the worst
			}
			if left := max(min(*c.ask, lim-used), 0); left != *c.ask {
				*c.ask, changed = left, true
			}
		}
		if !changed {
			// Only a ceiling this code cannot read (edited by hand) fails
			// the same way twice: say so rather than retry forever.
			return known, nil, fmt.Errorf("lease quota %s minute %d: the item's ceiling (%s, %s) is malformed; remove those attributes", l.name, minute, attrShare, attrAt)
		}
	}
}

// leftOf is what item (the minute starting at minute, nil when unknown)
// has left of each second from from to the minute's end under ceiling c:
// nil when there is no item to read.
func leftOf(item map[string]types.AttributeValue, minute, from int64, limit quota.Limit, c quota.Ceiling) []quota.Amount {
	if item == nil {
		return nil
	}
	used := func(attr string) int {
		if n, ok := item[attr].(*types.AttributeValueMemberN); ok {
			if v, err := strconv.Atoi(n.Value); err == nil {
				return v
			}
		}
		return 0
	}
	var left []quota.Amount
	for sec := from; sec < minute+60; sec++ {
		b := c.Budget(limit, sec)
		a := quota.Amount{Requests: max(b.Requests-used(fmt.Sprintf("s%02d", sec-minute)), 0)}
		if limit.Tokens > 0 {
			a.Tokens = max(b.Tokens-used(fmt.Sprintf("t%02d", sec-minute)), 0)
		}
		left = append(left, a)
	}
	return left
}

// Room reads what is left of the n seconds from on: one strongly
// consistent GetItem for each minute they fall in, under that minute's
// ceiling (a minute without an item has its whole budget left).
func (l *Leaser) Room(ctx context.Context, from int64, n int, limit quota.Limit) (quota.Room, error) {
	var room quota.Room
	for sec := from; sec < from+int64(n); {
		minute := sec / 60 * 60
		out, err := l.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: &l.table, Key: l.key(minute), ConsistentRead: aws.Bool(true)})
		if err != nil {
			return quota.Room{}, fmt.Errorf("read quota %s minute %d: %w", l.name, minute, err)
		}
		item := out.Item
		if item == nil {
			item = map[string]types.AttributeValue{}
		}
		if v, ok := item[attrReleases].(*types.AttributeValueMemberN); ok {
			if r, err := strconv.ParseInt(v.Value, 10, 64); err == nil {
				room.Releases += r
			}
		}
		rest := leftOf(item, minute, sec, limit, ceilingOf(item))
		take := min(len(rest), int(from+int64(n)-sec))
		room.Left = append(room.Left, rest[:take]...)
		sec += int64(take)
	}
	return room, nil
}

// Release gives back give[j] of second from+j: one update for each minute
// the seconds with something to give fall in, subtracting from the
// counters. An item that is gone (expired, or removed by hand) has nothing
// to give back to, and is not recreated.
func (l *Leaser) Release(ctx context.Context, from int64, give []quota.Amount) error {
	for i := 0; i < len(give); {
		minute := (from + int64(i)) / 60 * 60
		n := min(len(give)-i, int(minute+60-(from+int64(i))))
		names := map[string]string{"#pk": "PK"}
		values := map[string]types.AttributeValue{}
		var adds []string
		for j, g := range give[i : i+n] {
			sec := from + int64(i+j)
			for _, c := range []struct {
				attr string
				n    int
			}{{fmt.Sprintf("s%02d", sec-minute), g.Requests}, {fmt.Sprintf("t%02d", sec-minute), g.Tokens}} {
				if c.n <= 0 {
					continue
				}
				names["#"+c.attr] = c.attr
				values[":g"+c.attr] = &types.AttributeValueMemberN{Value: strconv.Itoa(-c.n)}
				adds = append(adds, fmt.Sprintf("#%s :g%s", c.attr, c.attr))
			}
		}
		i += n
		if len(adds) == 0 {
			continue
		}
		// The item counts its releases: a process whose share contention
		// fixed leases again when it reads that others gave some back.
		names["#"+attrReleases] = attrReleases
		values[":one"] = &types.AttributeValueMemberN{Value: "1"}
		adds = append(adds, "#"+attrReleases+" :one")
		_, err := l.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(l.table),
			Key:                       l.key(minute),
			UpdateExpression:          aws.String("ADD " + strings.Join(adds, ", ")),
			ConditionExpression:       aws.String("attribute_exists(#pk)"),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: values,
		})
		var ccf *types.ConditionalCheckFailedException
		if err != nil && !errors.As(err, &ccf) {
			return fmt.Errorf("release quota %s minute %d: %w", l.name, minute, err)
		}
	}
	return nil
}

// Lower stores next in the item of the minute it was set in, unless that
// item holds a ceiling newer than seen, and returns the ceiling the item
// holds afterwards: one conditional update.
func (l *Leaser) Lower(ctx context.Context, seen, next quota.Ceiling) (quota.Ceiling, error) {
	return l.store(ctx, next.At/1000/60*60, seen, next)
}

// store writes next into the item of the minute starting at minute unless
// it holds a ceiling newer than seen, and returns the one it holds after.
func (l *Leaser) store(ctx context.Context, minute int64, seen, next quota.Ceiling) (quota.Ceiling, error) {
	names := map[string]string{}
	values := map[string]types.AttributeValue{
		":ttl":  &types.AttributeValueMemberN{Value: strconv.FormatInt(minute+60+keepSeconds, 10)},
		":seen": &types.AttributeValueMemberN{Value: strconv.FormatInt(seen.At, 10)},
	}
	set := ceilingSet(next, names, values)
	_, err := l.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(l.table),
		Key:                                 l.key(minute),
		UpdateExpression:                    aws.String("SET " + set + ", expires_at = if_not_exists(expires_at, :ttl)"),
		ConditionExpression:                 aws.String("attribute_not_exists(#ca) OR #ca <= :seen"),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
	})
	if err == nil {
		return next, nil
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return ceilingOf(ccf.Item), nil
	}
	return quota.Ceiling{}, fmt.Errorf("lower quota %s ceiling to %.3f: %w", l.name, next.Share, err)
}
