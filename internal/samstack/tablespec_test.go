package samstack

import (
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// SAM resource types the template checks expect.
const (
	typeSAMFunction     = "AWS::Serverless::Function"
	typeSAMStateMachine = "AWS::Serverless::StateMachine"
)

// The table's key schema and indexes as the store contract test reads them
// from the template (TestTemplateTable).

func attributeDefinitions(v any) ([]ddbtypes.AttributeDefinition, error) {
	items, err := asList(v)
	if err != nil {
		return nil, err
	}
	out := make([]ddbtypes.AttributeDefinition, 0, len(items))
	for i, raw := range items {
		m, err := asMap(raw)
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		name, err1 := reqString(m, "AttributeName")
		typ, err2 := reqString(m, "AttributeType")
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out = append(out, ddbtypes.AttributeDefinition{AttributeName: aws.String(name), AttributeType: ddbtypes.ScalarAttributeType(typ)})
	}
	return out, nil
}

func keySchema(v any) ([]ddbtypes.KeySchemaElement, error) {
	items, err := asList(v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, errors.New("empty key schema")
	}
	out := make([]ddbtypes.KeySchemaElement, 0, len(items))
	for i, raw := range items {
		m, err := asMap(raw)
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		name, err1 := reqString(m, "AttributeName")
		typ, err2 := reqString(m, "KeyType")
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out = append(out, ddbtypes.KeySchemaElement{AttributeName: aws.String(name), KeyType: ddbtypes.KeyType(typ)})
	}
	return out, nil
}

func projection(v any) (*ddbtypes.Projection, error) {
	m, err := asMap(v)
	if err != nil {
		return nil, err
	}
	typ, err := reqString(m, "ProjectionType")
	if err != nil {
		return nil, err
	}
	out := &ddbtypes.Projection{ProjectionType: ddbtypes.ProjectionType(typ)}
	attrs, err := optList(m, "NonKeyAttributes")
	if err != nil {
		return nil, err
	}
	for i, a := range attrs {
		s, ok := a.(string)
		if !ok {
			return nil, fmt.Errorf("NonKeyAttributes[%d]: %T is not a string", i, a)
		}
		out.NonKeyAttributes = append(out.NonKeyAttributes, s)
	}
	return out, nil
}

func throughput(v any) (*ddbtypes.ProvisionedThroughput, error) {
	if v == nil {
		return nil, nil
	}
	m, err := asMap(v)
	if err != nil {
		return nil, err
	}
	rcu, err1 := toInt(m["ReadCapacityUnits"])
	wcu, err2 := toInt(m["WriteCapacityUnits"])
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &ddbtypes.ProvisionedThroughput{ReadCapacityUnits: aws.Int64(rcu), WriteCapacityUnits: aws.Int64(wcu)}, nil
}

func parseGSI(raw any) (ddbtypes.GlobalSecondaryIndex, error) {
	m, err := asMap(raw)
	if err != nil {
		return ddbtypes.GlobalSecondaryIndex{}, err
	}
	name, err := reqString(m, "IndexName")
	if err != nil {
		return ddbtypes.GlobalSecondaryIndex{}, err
	}
	g := ddbtypes.GlobalSecondaryIndex{IndexName: aws.String(name)}
	if g.KeySchema, err = keySchema(m["KeySchema"]); err != nil {
		return g, fmt.Errorf("%s.KeySchema: %w", name, err)
	}
	if g.Projection, err = projection(m["Projection"]); err != nil {
		return g, fmt.Errorf("%s.Projection: %w", name, err)
	}
	if g.ProvisionedThroughput, err = throughput(m["ProvisionedThroughput"]); err != nil {
		return g, fmt.Errorf("%s.ProvisionedThroughput: %w", name, err)
	}
	return g, nil
}
