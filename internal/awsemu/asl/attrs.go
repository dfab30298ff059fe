package asl

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

func dynamoReturnValue(s string) types.ReturnValue { return types.ReturnValue(s) }

// toAttributeMap converts DynamoDB JSON ({"PK": {"S": "x"}}) to SDK values.
func toAttributeMap(v any) (map[string]types.AttributeValue, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not an object of attribute values")
	}
	out := make(map[string]types.AttributeValue, len(m))
	for k, e := range m {
		av, err := toAttribute(e)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		out[k] = av
	}
	return out, nil
}

func toAttribute(v any) (types.AttributeValue, error) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return nil, fmt.Errorf("attribute value %v: want one type key such as {\"S\": \"...\"}", v)
	}
	var typ string
	var x any
	for k, e := range m {
		typ, x = k, e
	}
	switch typ {
	case "S":
		if s, ok := x.(string); ok {
			return &types.AttributeValueMemberS{Value: s}, nil
		}
	case "N":
		if s, ok := x.(string); ok {
			if _, err := json.Number(s).Float64(); err == nil {
				return &types.AttributeValueMemberN{Value: s}, nil
			}
		}
	case "B":
		if s, ok := x.(string); ok {
			b, err := base64.StdEncoding.DecodeString(s)
			if err == nil {
				return &types.AttributeValueMemberB{Value: b}, nil
			}
		}
	case "BOOL":
		if b, ok := x.(bool); ok {
			return &types.AttributeValueMemberBOOL{Value: b}, nil
		}
	case "NULL":
		if b, ok := x.(bool); ok && b {
			return &types.AttributeValueMemberNULL{Value: true}, nil
		}
	case "SS", "NS":
		list, ok := x.([]any)
		if !ok {
			break
		}
		var ss []string
		for _, e := range list {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("%s holds a %T", typ, e)
			}
			ss = append(ss, s)
		}
		if typ == "SS" {
			return &types.AttributeValueMemberSS{Value: ss}, nil
		}
		return &types.AttributeValueMemberNS{Value: ss}, nil
	case "L":
		list, ok := x.([]any)
		if !ok {
			break
		}
		var out []types.AttributeValue
		for _, e := range list {
			av, err := toAttribute(e)
			if err != nil {
				return nil, err
			}
			out = append(out, av)
		}
		return &types.AttributeValueMemberL{Value: out}, nil
	case "M":
		mm, err := toAttributeMap(x)
		if err != nil {
			return nil, err
		}
		return &types.AttributeValueMemberM{Value: mm}, nil
	default:
		return nil, fmt.Errorf("attribute type %q is not supported", typ)
	}
	return nil, fmt.Errorf("attribute value %v: bad %s value", v, typ)
}

// fromAttributeMap converts SDK values back to DynamoDB JSON.
func fromAttributeMap(m map[string]types.AttributeValue) (map[string]any, error) {
	out := make(map[string]any, len(m))
	for k, av := range m {
		v, err := fromAttribute(av)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

func fromAttribute(av types.AttributeValue) (any, error) {
	switch a := av.(type) {
	case *types.AttributeValueMemberS:
		return map[string]any{"S": a.Value}, nil
	case *types.AttributeValueMemberN:
		return map[string]any{"N": a.Value}, nil
	case *types.AttributeValueMemberB:
		return map[string]any{"B": base64.StdEncoding.EncodeToString(a.Value)}, nil
	case *types.AttributeValueMemberBOOL:
		return map[string]any{"BOOL": a.Value}, nil
	case *types.AttributeValueMemberNULL:
		return map[string]any{"NULL": true}, nil
	case *types.AttributeValueMemberSS:
		return map[string]any{"SS": toAnySlice(a.Value)}, nil
	case *types.AttributeValueMemberNS:
		return map[string]any{"NS": toAnySlice(a.Value)}, nil
	case *types.AttributeValueMemberL:
		var list []any
		for _, e := range a.Value {
			v, err := fromAttribute(e)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		return map[string]any{"L": list}, nil
	case *types.AttributeValueMemberM:
		m, err := fromAttributeMap(a.Value)
		if err != nil {
			return nil, err
		}
		return map[string]any{"M": m}, nil
	}
	return nil, fmt.Errorf("attribute type %T is not supported", av)
}

func toAnySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
