package dynamostore

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// expr collects the placeholders of one request's condition, update and key
// expressions. Every attribute name goes through a placeholder, so that
// names DynamoDB reserves (state, owner, no, ...) never need a special case.
type expr struct {
	names  map[string]string // placeholder -> attribute name
	byName map[string]string // attribute name -> placeholder
	values map[string]types.AttributeValue
}

func newExpr() *expr {
	return &expr{names: map[string]string{}, byName: map[string]string{}, values: map[string]types.AttributeValue{}}
}

// n returns the placeholder of attribute name attr.
func (e *expr) n(attr string) string {
	if p, ok := e.byName[attr]; ok {
		return p
	}
	p := "#n" + strconv.Itoa(len(e.names))
	e.names[p] = attr
	e.byName[attr] = p
	return p
}

// v returns a placeholder for value av.
func (e *expr) v(av types.AttributeValue) string {
	p := ":v" + strconv.Itoa(len(e.values))
	e.values[p] = av
	return p
}

// s returns a placeholder for string value s.
func (e *expr) s(s string) string { return e.v(&types.AttributeValueMemberS{Value: s}) }

// i returns a placeholder for number value i.
func (e *expr) i(i int64) string {
	return e.v(&types.AttributeValueMemberN{Value: strconv.FormatInt(i, 10)})
}

// f returns a placeholder for number value f.
func (e *expr) f(f float64) string {
	return e.v(&types.AttributeValueMemberN{Value: strconv.FormatFloat(f, 'g', -1, 64)})
}

// in returns "#attr IN (:a, :b, ...)" for string values; vals must not be
// empty.
func (e *expr) in(attr string, vals []string) string {
	ps := make([]string, len(vals))
	for i, v := range vals {
		ps[i] = e.s(v)
	}
	return fmt.Sprintf("%s IN (%s)", e.n(attr), strings.Join(ps, ", "))
}

// attrNames returns the name placeholders, or nil when there are none (the
// API rejects an empty map).
func (e *expr) attrNames() map[string]string {
	if len(e.names) == 0 {
		return nil
	}
	return e.names
}

// attrValues returns the value placeholders, or nil when there are none.
func (e *expr) attrValues() map[string]types.AttributeValue {
	if len(e.values) == 0 {
		return nil
	}
	return e.values
}

// update builds an update expression from SET, REMOVE and ADD clauses.
type update struct {
	e      *expr
	set    []string
	remove []string
	add    []string
}

// setS sets attr to a string.
func (u *update) setS(attr, val string) { u.set = append(u.set, u.e.n(attr)+" = "+u.e.s(val)) }

// setI sets attr to a number.
func (u *update) setI(attr string, val int64) { u.set = append(u.set, u.e.n(attr)+" = "+u.e.i(val)) }

// setOrRemove sets attr to val, or removes it when val is empty, so that
// items carry no empty attributes.
func (u *update) setOrRemove(attr, val string) {
	if val == "" {
		u.del(attr)
		return
	}
	u.setS(attr, val)
}

// setIOrRemove sets attr to val, or removes it when val is 0 (absent
// numbers decode as 0).
func (u *update) setIOrRemove(attr string, val int64) {
	if val == 0 {
		u.del(attr)
		return
	}
	u.setI(attr, val)
}

// setFOrRemove sets attr to val, or removes it when val is 0.
func (u *update) setFOrRemove(attr string, val float64) {
	if val == 0 {
		u.del(attr)
		return
	}
	u.set = append(u.set, u.e.n(attr)+" = "+u.e.f(val))
}

// del removes attr.
func (u *update) del(attr string) { u.remove = append(u.remove, u.e.n(attr)) }

// addI adds n to the number attr (which starts at 0 when absent).
func (u *update) addI(attr string, n int64) { u.add = append(u.add, u.e.n(attr)+" "+u.e.i(n)) }

// String renders the update expression.
func (u *update) String() string {
	var parts []string
	if len(u.set) > 0 {
		parts = append(parts, "SET "+strings.Join(u.set, ", "))
	}
	if len(u.remove) > 0 {
		parts = append(parts, "REMOVE "+strings.Join(u.remove, ", "))
	}
	if len(u.add) > 0 {
		parts = append(parts, "ADD "+strings.Join(u.add, ", "))
	}
	return strings.Join(parts, " ")
}
