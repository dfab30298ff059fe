//go:build emulator

package samstack

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"
)

// TestMotoCloudFormationGaps proves each workaround in Provision still has
// a reason: it creates the planned stack from template.yaml's translation
// without Provision's own steps, the state machine included as a stack
// resource, and checks that moto's CloudFormation left out exactly what
// propertyGaps and the state machine gap say. When moto catches up, the check for that
// gap fails: delete the workaround and its check.
func TestMotoCloudFormationGaps(t *testing.T) {
	t.Parallel()
	cfg := emulator(t)
	ctx := t.Context()
	raw, err := Translate(ctx, repoTemplate)
	if err != nil {
		t.Fatal(err)
	}
	var tpl map[string]any
	if err := json.Unmarshal(raw, &tpl); err != nil {
		t.Fatal(err)
	}
	prefix := UniquePrefix("gaps")
	r := &Resources{StackName: prefix, Physical: map[string]string{}, FunctionARNs: map[string]string{}, cfg: cfg}
	t.Cleanup(func() {
		if err := r.Cleanup(context.Background()); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	p := &provisioner{prefix: prefix, region: Region, res: r, outputs: map[string]any{},
		opts: options{params: map[string]string{}, functionARNs: map[string]string{}},
		cfn:  cloudformation.NewFromConfig(cfg), ddb: dynamodb.NewFromConfig(cfg),
		sqs: sqs.NewFromConfig(cfg), s3: newS3(cfg), sfn: sfn.NewFromConfig(cfg)}
	if err := p.plan(tpl); err != nil {
		t.Fatal(err)
	}
	// The state machine as the translation declares it, references to
	// functions and roles replaced as for the other resources.
	types := map[string]string{}
	for id, res := range tpl["Resources"].(map[string]any) {
		types[id], _ = res.(map[string]any)["Type"].(string)
	}
	machine, err := p.placeholders(tpl["Resources"].(map[string]any)["ExportStateMachine"], types)
	if err != nil {
		t.Fatal(err)
	}
	p.stack["Resources"].(map[string]any)["ExportStateMachine"] = machine
	p.kept["ExportStateMachine"] = typeCFNStateMachine
	if err := p.createStack(ctx); err != nil {
		t.Fatal(err)
	}
	table, bucket := p.res.Physical["Table"], p.res.Physical["Bucket"]

	t.Run("table TTL", func(t *testing.T) {
		if got := describeTable(t, cfg, table); got.TTL != "" {
			t.Errorf("moto's CloudFormation now enables TTL (%q): drop TimeToLiveSpecification from propertyGaps", got.TTL)
		}
	})
	t.Run("table PITR", func(t *testing.T) {
		if got := describeTable(t, cfg, table); got.PITR == "ENABLED" {
			t.Error("moto's CloudFormation now enables point-in-time recovery: drop PointInTimeRecoverySpecification from propertyGaps")
		}
	})
	t.Run("table SSE", func(t *testing.T) {
		if got := describeTable(t, cfg, table); got.SSE != "" {
			t.Errorf("moto's CloudFormation now applies SSESpecification (%s): expect SSE in TestProvisionMatchesTemplate", got.SSE)
		}
	})
	t.Run("bucket public access block", func(t *testing.T) {
		_, err := p.s3.GetPublicAccessBlock(ctx, &s3.GetPublicAccessBlockInput{Bucket: aws.String(bucket)})
		if !hasCode(err, "NoSuchPublicAccessBlockConfiguration") {
			t.Errorf("GetPublicAccessBlock = %v: moto's CloudFormation now applies it; drop PublicAccessBlockConfiguration from propertyGaps", err)
		}
	})
	t.Run("bucket lifecycle", func(t *testing.T) {
		_, err := p.s3.GetBucketLifecycleConfiguration(ctx, &s3.GetBucketLifecycleConfigurationInput{Bucket: aws.String(bucket)})
		if !hasCode(err, "NoSuchLifecycleConfiguration") {
			t.Errorf("GetBucketLifecycleConfiguration = %v: moto's CloudFormation now applies it; drop LifecycleConfiguration from propertyGaps", err)
		}
	})
	t.Run("bucket key", func(t *testing.T) {
		out, err := p.s3.GetBucketEncryption(ctx, &s3.GetBucketEncryptionInput{Bucket: aws.String(bucket)})
		if err != nil {
			t.Fatal(err)
		}
		if rules := out.ServerSideEncryptionConfiguration.Rules; len(rules) != 1 || aws.ToBool(rules[0].BucketKeyEnabled) {
			t.Errorf("encryption rules %+v: moto's CloudFormation now keeps BucketKeyEnabled; drop BucketEncryption from propertyGaps", rules)
		}
	})
	t.Run("state machine", func(t *testing.T) {
		arn := p.res.Physical["ExportStateMachine"]
		out, err := p.sfn.DescribeStateMachine(ctx, &sfn.DescribeStateMachineInput{StateMachineArn: aws.String(arn)})
		if err == nil && !strings.Contains(aws.ToString(out.Definition), "${ExporterFunctionArn}") {
			t.Errorf("moto's CloudFormation now creates %s with its substitutions applied, where executions run: drop the state machine gap (planMachine, createStateMachine)", arn)
		}
	})
}

func hasCode(err error, code string) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == code
}
