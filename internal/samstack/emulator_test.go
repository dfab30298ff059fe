//go:build emulator

package samstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

// emulator returns the emulator's config or fails the test: emulator tests
// never skip.
func emulator(t *testing.T) aws.Config {
	t.Helper()
	cfg, err := Config(t.Context())
	if err != nil {
		t.Fatalf("emulator: %v", err)
	}
	return cfg
}

// provision provisions templatePath under a unique prefix and cleans up
// when the test ends.
func provision(t *testing.T, cfg aws.Config, templatePath string, opts ...Option) *Resources {
	t.Helper()
	res, err := Provision(t.Context(), cfg, templatePath, UniquePrefix("samstack"), opts...)
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() {
		if err := res.Cleanup(context.Background()); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	return res
}

// tableShape is what the store adapter relies on in a table.
type tableShape struct {
	Billing string
	Keys    []string
	GSIs    map[string][]string
	TTL     string
	PITR    string
	SSE     string
}

func describeTable(t *testing.T, cfg aws.Config, name string) tableShape {
	t.Helper()
	ctx := t.Context()
	c := dynamodb.NewFromConfig(cfg)
	out, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatalf("DescribeTable %s: %v", name, err)
	}
	d := out.Table
	got := tableShape{GSIs: map[string][]string{}}
	if d.BillingModeSummary != nil {
		got.Billing = string(d.BillingModeSummary.BillingMode)
	}
	for _, k := range d.KeySchema {
		got.Keys = append(got.Keys, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
	}
	for _, g := range d.GlobalSecondaryIndexes {
		var desc []string
		for _, k := range g.KeySchema {
			desc = append(desc, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
		}
		desc = append(desc, string(g.Projection.ProjectionType))
		got.GSIs[aws.ToString(g.IndexName)] = desc
	}
	if d.SSEDescription != nil {
		got.SSE = string(d.SSEDescription.Status)
	}
	ttl, err := c.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatalf("DescribeTimeToLive: %v", err)
	}
	if ttl.TimeToLiveDescription != nil && ttl.TimeToLiveDescription.TimeToLiveStatus == ddbtypes.TimeToLiveStatusEnabled {
		got.TTL = aws.ToString(ttl.TimeToLiveDescription.AttributeName)
	}
	backups, err := c.DescribeContinuousBackups(ctx, &dynamodb.DescribeContinuousBackupsInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatalf("DescribeContinuousBackups: %v", err)
	}
	if b := backups.ContinuousBackupsDescription; b != nil && b.PointInTimeRecoveryDescription != nil {
		got.PITR = string(b.PointInTimeRecoveryDescription.PointInTimeRecoveryStatus)
	}
	return got
}

func queueAttrs(t *testing.T, cfg aws.Config, url string) map[string]string {
	t.Helper()
	out, err := sqs.NewFromConfig(cfg).GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll},
	})
	if err != nil {
		t.Fatalf("GetQueueAttributes %s: %v", url, err)
	}
	return out.Attributes
}

// redrive decodes a RedrivePolicy attribute; SQS may render maxReceiveCount
// as a number or a string.
func redrive(t *testing.T, attr string) (target string, maxReceive int64) {
	t.Helper()
	var rp struct {
		DeadLetterTargetArn string `json:"deadLetterTargetArn"`
		MaxReceiveCount     any    `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(attr), &rp); err != nil {
		t.Fatalf("RedrivePolicy %q: %v", attr, err)
	}
	n, err := toInt(rp.MaxReceiveCount)
	if err != nil {
		t.Fatalf("RedrivePolicy %q: maxReceiveCount: %v", attr, err)
	}
	return rp.DeadLetterTargetArn, n
}

func TestProvisionMatchesTemplate(t *testing.T) {
	t.Parallel()
	cfg := emulator(t)
	ctx := t.Context()
	exporter := "arn:aws:lambda:us-east-1:" + AccountID + ":function:exporter-under-test"
	res := provision(t, cfg, repoTemplate, WithFunctionARN("ExporterFunction", exporter))

	t.Run("table", func(t *testing.T) {
		want := tableShape{
			Billing: "PAY_PER_REQUEST",
			Keys:    []string{"PK HASH", "SK RANGE"},
			GSIs: map[string][]string{
				"open-batches":   {"open_pk HASH", "open_sk RANGE", "ALL"},
				"tasks-by-time":  {"list_pk HASH", "created_at RANGE", "ALL"},
				"tasks-by-owner": {"task_owner HASH", "owner_sk RANGE", "ALL"},
			},
			TTL:  "expires_at",
			PITR: "ENABLED",
			// moto's CloudFormation drops SSESpecification and moto has no
			// call to turn it on later (TestMotoCloudFormationGaps);
			// TestTemplateTable checks that the template declares it.
			SSE: "",
		}
		if diff := cmp.Diff(want, describeTable(t, cfg, res.TableName)); diff != "" {
			t.Errorf("table mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("queues", func(t *testing.T) {
		work := queueAttrs(t, cfg, res.QueueURL)
		dlq := queueAttrs(t, cfg, res.DLQURL)
		target, maxReceive := redrive(t, work["RedrivePolicy"])
		got := map[string]any{
			"work.VisibilityTimeout":      work["VisibilityTimeout"],
			"work.MessageRetentionPeriod": work["MessageRetentionPeriod"],
			"work.QueueArn":               work["QueueArn"],
			"work.redrive.target":         target,
			"work.redrive.maxReceive":     maxReceive,
			"dlq.MessageRetentionPeriod":  dlq["MessageRetentionPeriod"],
			"dlq.QueueArn":                dlq["QueueArn"],
		}
		want := map[string]any{
			"work.VisibilityTimeout":      "1800",
			"work.MessageRetentionPeriod": "345600",
			"work.QueueArn":               res.QueueARN,
			"work.redrive.target":         res.DLQARN,
			"work.redrive.maxReceive":     int64(5),
			"dlq.MessageRetentionPeriod":  "1209600",
			"dlq.QueueArn":                res.DLQARN,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("queues mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("state machine", func(t *testing.T) {
		out, err := sfn.NewFromConfig(cfg).DescribeStateMachine(ctx, &sfn.DescribeStateMachineInput{StateMachineArn: aws.String(res.StateMachineArn)})
		if err != nil {
			t.Fatalf("DescribeStateMachine: %v", err)
		}
		raw, err := os.ReadFile("../../infra/statemachine/export.asl.json")
		if err != nil {
			t.Fatal(err)
		}
		wantDef := strings.NewReplacer("${ExporterFunctionArn}", exporter, "${TableName}", res.TableName).Replace(string(raw))
		var want, got any
		if err := json.Unmarshal([]byte(wantDef), &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(aws.ToString(out.Definition)), &got); err != nil {
			t.Fatalf("deployed definition: %v", err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("definition mismatch (-want +got):\n%s", diff)
		}
		if out.Type != sfntypes.StateMachineTypeStandard {
			t.Errorf("type = %s, want STANDARD (execution names dedupe exports)", out.Type)
		}
		if diff := cmp.Diff(map[string]string{"ExporterFunction": exporter}, res.FunctionARNs); diff != "" {
			t.Errorf("FunctionARNs mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("bucket", func(t *testing.T) {
		c := newS3(cfg)
		enc, err := c.GetBucketEncryption(ctx, &s3.GetBucketEncryptionInput{Bucket: aws.String(res.BucketName)})
		if err != nil {
			t.Fatalf("GetBucketEncryption: %v", err)
		}
		pab, err := c.GetPublicAccessBlock(ctx, &s3.GetPublicAccessBlockInput{Bucket: aws.String(res.BucketName)})
		if err != nil {
			t.Fatalf("GetPublicAccessBlock: %v", err)
		}
		lc, err := c.GetBucketLifecycleConfiguration(ctx, &s3.GetBucketLifecycleConfigurationInput{Bucket: aws.String(res.BucketName)})
		if err != nil {
			t.Fatalf("GetBucketLifecycleConfiguration: %v", err)
		}
		var rules []string
		for _, r := range lc.Rules {
			desc := aws.ToString(r.ID) + " " + string(r.Status)
			if r.Filter != nil && aws.ToString(r.Filter.Prefix) != "" {
				desc += " prefix=" + aws.ToString(r.Filter.Prefix)
			}
			if r.Expiration != nil {
				desc += " expire=" + itoa(aws.ToInt32(r.Expiration.Days))
			}
			if r.AbortIncompleteMultipartUpload != nil {
				desc += " abort=" + itoa(aws.ToInt32(r.AbortIncompleteMultipartUpload.DaysAfterInitiation))
			}
			rules = append(rules, desc)
		}
		sort.Strings(rules)
		b := pab.PublicAccessBlockConfiguration
		got := map[string]any{
			"sse":   string(enc.ServerSideEncryptionConfiguration.Rules[0].ApplyServerSideEncryptionByDefault.SSEAlgorithm),
			"block": []bool{aws.ToBool(b.BlockPublicAcls), aws.ToBool(b.BlockPublicPolicy), aws.ToBool(b.IgnorePublicAcls), aws.ToBool(b.RestrictPublicBuckets)},
			"rules": rules,
		}
		want := map[string]any{
			"sse":   "AES256",
			"block": []bool{true, true, true, true},
			"rules": []string{
				"abort-incomplete-multipart-uploads Enabled abort=1",
				"expire-incoming Enabled prefix=incoming/ expire=7",
				"expire-inputs Enabled prefix=inputs/ expire=30",
				"expire-overflow Enabled prefix=overflow/ expire=30",
				"expire-processed Enabled prefix=processed/ expire=7",
				"expire-results Enabled prefix=results/ expire=30",
				"expire-upload-records Enabled prefix=uploads/ expire=7",
			},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("bucket mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("env", func(t *testing.T) {
		want := map[string]string{
			"TABLE_NAME":        res.Physical["Table"],
			"QUEUE_URL":         res.Physical["WorkQueue"],
			"DLQ_URL":           res.Physical["DeadLetterQueue"],
			"BUCKET_NAME":       res.Physical["Bucket"],
			"STATE_MACHINE_ARN": res.Physical["ExportStateMachine"],
		}
		for k, v := range want {
			if v == "" {
				t.Errorf("%s is empty", k)
			}
		}
		if diff := cmp.Diff(want, res.Env()); diff != "" {
			t.Errorf("Env mismatch (-want +got):\n%s", diff)
		}
	})
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// yamlChild returns the value node of key in a mapping node, or nil.
func yamlChild(n *yaml.Node, key string) *yaml.Node {
	if n.Kind == yaml.DocumentNode {
		n = n.Content[0]
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func yamlPath(t *testing.T, n *yaml.Node, path ...string) *yaml.Node {
	t.Helper()
	for _, p := range path {
		if n = yamlChild(n, p); n == nil {
			t.Fatalf("template has no %s", strings.Join(path, "."))
		}
	}
	return n
}

// dropItems removes the sequence items whose key field is one of values.
func dropItems(t *testing.T, seq *yaml.Node, key string, values ...string) {
	t.Helper()
	var kept []*yaml.Node
	for _, item := range seq.Content {
		v := yamlChild(item, key)
		if v != nil && contains(values, v.Value) {
			continue
		}
		kept = append(kept, item)
	}
	if len(kept) == len(seq.Content) {
		t.Fatalf("no item with %s in %v to drop", key, values)
	}
	seq.Content = kept
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// editedTemplate writes a copy of template.yaml, changed by edit, with the
// state machine definition beside it, and returns its path.
func editedTemplate(t *testing.T, edit func(doc *yaml.Node, dir string)) string {
	t.Helper()
	raw, err := os.ReadFile(repoTemplate)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	asl, err := os.ReadFile("../../infra/statemachine/export.asl.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "infra", "statemachine"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "infra", "statemachine", "export.asl.json"), asl, 0o644); err != nil {
		t.Fatal(err)
	}
	edit(&doc, dir)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "template.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestProvisionFollowsTemplateEdits(t *testing.T) {
	t.Parallel()
	cfg := emulator(t)
	tests := []struct {
		name  string
		edit  func(t *testing.T, doc *yaml.Node, dir string)
		check func(t *testing.T, res *Resources)
	}{
		{
			name: "GSI removed",
			edit: func(t *testing.T, doc *yaml.Node, _ string) {
				props := yamlPath(t, doc, "Resources", "Table", "Properties")
				dropItems(t, yamlPath(t, props, "GlobalSecondaryIndexes"), "IndexName", "open-batches")
				dropItems(t, yamlPath(t, props, "AttributeDefinitions"), "AttributeName", "open_pk", "open_sk")
			},
			check: func(t *testing.T, res *Resources) {
				got := describeTable(t, cfg, res.TableName).GSIs
				want := map[string][]string{
					"tasks-by-time":  {"list_pk HASH", "created_at RANGE", "ALL"},
					"tasks-by-owner": {"task_owner HASH", "owner_sk RANGE", "ALL"},
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("GSIs mismatch (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "maxReceiveCount and visibility changed",
			edit: func(t *testing.T, doc *yaml.Node, _ string) {
				props := yamlPath(t, doc, "Resources", "WorkQueue", "Properties")
				yamlPath(t, props, "RedrivePolicy", "maxReceiveCount").Value = "3"
				yamlPath(t, props, "VisibilityTimeout").Value = "900"
			},
			check: func(t *testing.T, res *Resources) {
				attrs := queueAttrs(t, cfg, res.QueueURL)
				_, maxReceive := redrive(t, attrs["RedrivePolicy"])
				got := []any{maxReceive, attrs["VisibilityTimeout"]}
				if diff := cmp.Diff([]any{int64(3), "900"}, got); diff != "" {
					t.Errorf("queue mismatch (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "definition changed",
			edit: func(t *testing.T, _ *yaml.Node, dir string) {
				def := `{"StartAt": "Done", "States": {"Done": {"Type": "Pass", "Result": "${TableName}", "End": true}}}`
				if err := os.WriteFile(filepath.Join(dir, "infra", "statemachine", "export.asl.json"), []byte(def), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, res *Resources) {
				out, err := sfn.NewFromConfig(cfg).DescribeStateMachine(t.Context(), &sfn.DescribeStateMachineInput{StateMachineArn: aws.String(res.StateMachineArn)})
				if err != nil {
					t.Fatalf("DescribeStateMachine: %v", err)
				}
				want := map[string]any{"StartAt": "Done", "States": map[string]any{"Done": map[string]any{"Type": "Pass", "Result": res.TableName, "End": true}}}
				var got map[string]any
				if err := json.Unmarshal([]byte(aws.ToString(out.Definition)), &got); err != nil {
					t.Fatalf("definition: %v", err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("definition mismatch (-want +got):\n%s", diff)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := editedTemplate(t, func(doc *yaml.Node, dir string) { tc.edit(t, doc, dir) })
			tc.check(t, provision(t, cfg, path))
		})
	}
}

func TestProvisionFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	cfg := emulator(t)
	path := editedTemplate(t, func(_ *yaml.Node, dir string) {
		def := `{"StartAt": "A", "States": {"A": {"Type": "Pass", "Result": "${Undeclared}", "End": true}}}`
		if err := os.WriteFile(filepath.Join(dir, "infra", "statemachine", "export.asl.json"), []byte(def), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	prefix := UniquePrefix("samstack")
	res, err := Provision(t.Context(), cfg, path, prefix)
	if err == nil {
		_ = res.Cleanup(context.Background())
		t.Fatal("Provision succeeded with an undeclared substitution")
	}
	if !strings.Contains(err.Error(), "${Undeclared}") {
		t.Errorf("Provision error = %v, want it to name ${Undeclared}", err)
	}
	ctx := t.Context()
	var tableNames []string
	for pages := dynamodb.NewListTablesPaginator(dynamodb.NewFromConfig(cfg), &dynamodb.ListTablesInput{}); pages.HasMorePages(); {
		page, err := pages.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tableNames = append(tableNames, page.TableNames...)
	}
	queues, err := sqs.NewFromConfig(cfg).ListQueues(ctx, &sqs.ListQueuesInput{QueueNamePrefix: aws.String(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	buckets, err := newS3(cfg).ListBuckets(ctx, &s3.ListBucketsInput{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, name := range tableNames {
		if strings.HasPrefix(name, prefix) {
			left = append(left, name)
		}
	}
	left = append(left, queues.QueueUrls...)
	for _, b := range buckets.Buckets {
		if strings.HasPrefix(aws.ToString(b.Name), prefix) {
			left = append(left, aws.ToString(b.Name))
		}
	}
	if len(left) > 0 {
		t.Errorf("failed Provision left %v behind", left)
	}
}

func TestCleanupDeletesEverything(t *testing.T) {
	t.Parallel()
	cfg := emulator(t)
	ctx := t.Context()
	res, err := Provision(ctx, cfg, repoTemplate, UniquePrefix("samstack"))
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	// A non-empty bucket must still go.
	if _, err := newS3(cfg).PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(res.BucketName), Key: aws.String("results/a.xlsx"), Body: strings.NewReader("x"),
	}); err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	if err := res.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if err := res.Cleanup(ctx); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
	var gone []string
	if _, err := dynamodb.NewFromConfig(cfg).DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(res.TableName)}); isNotFound(err) {
		gone = append(gone, "table")
	}
	for name, url := range map[string]string{"queue": res.QueueURL, "dlq": res.DLQURL} {
		if _, err := sqs.NewFromConfig(cfg).GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url)}); isNotFound(err) {
			gone = append(gone, name)
		}
	}
	if _, err := newS3(cfg).HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(res.BucketName)}); err != nil {
		gone = append(gone, "bucket")
	}
	if _, err := sfn.NewFromConfig(cfg).DescribeStateMachine(ctx, &sfn.DescribeStateMachineInput{StateMachineArn: aws.String(res.StateMachineArn)}); isNotFound(err) {
		gone = append(gone, "state machine")
	}
	sort.Strings(gone)
	if diff := cmp.Diff([]string{"bucket", "dlq", "queue", "state machine", "table"}, gone); diff != "" {
		t.Errorf("deleted resources mismatch (-want +got):\n%s", diff)
	}
}

// TestExportStateMachineMarksTaskFailed runs the real definition on the
// emulator. The exporter ARN names no function, so the invocation fails and
// the Catch path must mark the task item FAILED, but only while the task is
// still in flight.
func TestExportStateMachineMarksTaskFailed(t *testing.T) {
	t.Parallel()
	cfg := emulator(t)
	res := provision(t, cfg, repoTemplate)
	ddb := dynamodb.NewFromConfig(cfg)
	sf := sfn.NewFromConfig(cfg)

	tests := []struct {
		name      string
		state     string // initial task state; empty: no task item
		wantState string
		wantError bool
	}{
		{name: "exporting task is marked failed", state: "EXPORTING", wantState: "FAILED", wantError: true},
		{name: "running task is marked failed", state: "RUNNING", wantState: "FAILED", wantError: true},
		{name: "succeeded task is left alone", state: "SUCCEEDED", wantState: "SUCCEEDED"},
		{name: "missing task is not created", state: ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			taskID := "task-" + itoa(int32(i)) + "-" + strings.TrimPrefix(UniquePrefix("x"), "x-")
			key := map[string]ddbtypes.AttributeValue{
				"PK": &ddbtypes.AttributeValueMemberS{Value: "TASK#" + taskID},
				"SK": &ddbtypes.AttributeValueMemberS{Value: "TASK"},
			}
			if tc.state != "" {
				item := map[string]ddbtypes.AttributeValue{"state": &ddbtypes.AttributeValueMemberS{Value: tc.state}}
				for k, v := range key {
					item[k] = v
				}
				if _, err := ddb.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(res.TableName), Item: item}); err != nil {
					t.Fatalf("PutItem: %v", err)
				}
			}
			start, err := sf.StartExecution(ctx, &sfn.StartExecutionInput{
				StateMachineArn: aws.String(res.StateMachineArn),
				Name:            aws.String(taskID),
				Input:           aws.String(`{"task_id": "` + taskID + `"}`),
			})
			if err != nil {
				t.Fatalf("StartExecution: %v", err)
			}
			exec := waitExecution(t, sf, aws.ToString(start.ExecutionArn))
			if exec.Status != sfntypes.ExecutionStatusFailed || aws.ToString(exec.Error) != "ExportFailed" {
				t.Errorf("execution = %s %q (cause %q), want FAILED ExportFailed", exec.Status, aws.ToString(exec.Error), aws.ToString(exec.Cause))
			}
			if !strings.Contains(aws.ToString(exec.Cause), taskID) {
				t.Errorf("execution cause %q does not name the task", aws.ToString(exec.Cause))
			}

			got, err := ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(res.TableName), Key: key, ConsistentRead: aws.Bool(true)})
			if err != nil {
				t.Fatalf("GetItem: %v", err)
			}
			if tc.state == "" {
				if len(got.Item) != 0 {
					t.Errorf("task item was created: %v", got.Item)
				}
				return
			}
			str := func(name string) string {
				if v, ok := got.Item[name].(*ddbtypes.AttributeValueMemberS); ok {
					return v.Value
				}
				return ""
			}
			if str("state") != tc.wantState {
				t.Errorf("task state = %q, want %q", str("state"), tc.wantState)
			}
			if hasErr := strings.HasPrefix(str("error"), "export failed: "); hasErr != tc.wantError {
				t.Errorf("task error = %q, want an export error: %v", str("error"), tc.wantError)
			}
			if tc.wantError {
				if _, err := time.Parse(time.RFC3339, str("finished_at")); err != nil {
					t.Errorf("finished_at = %q, want RFC 3339: %v", str("finished_at"), err)
				}
			}
		})
	}
}

// waitExecution polls an execution until it stops running.
func waitExecution(t *testing.T, c *sfn.Client, arn string) *sfn.DescribeExecutionOutput {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err := c.DescribeExecution(t.Context(), &sfn.DescribeExecutionInput{ExecutionArn: aws.String(arn)})
		if err != nil {
			t.Fatalf("DescribeExecution: %v", err)
		}
		if out.Status != sfntypes.ExecutionStatusRunning {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s still RUNNING after 60s", arn)
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal(errors.New("test context done while waiting for the execution"))
		}
	}
}

// loseFirstCreateStackAnswer sends requests on and drops the answer of the
// first CreateStack: the emulator made the stack, the client sees a reset
// connection and re-sends the request, as the SDK does.
type loseFirstCreateStackAnswer struct {
	next http.RoundTripper
	lost atomic.Bool
}

func (l *loseFirstCreateStackAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := l.next.RoundTrip(r)
	if err == nil && bytes.Contains(body, []byte("Action=CreateStack")) && l.lost.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return resp, err
}

// TestProvisionWhoseCreateStackAnswerWasLost: a CreateStack the emulator
// applied whose answer was lost is re-sent and finds the stack it made; the
// provision goes on. A stack of the same name that another provision made
// is still refused.
func TestProvisionWhoseCreateStackAnswerWasLost(t *testing.T) {
	cfg := emulator(t)
	lose := &loseFirstCreateStackAnswer{next: http.DefaultTransport}
	cfg.HTTPClient = &http.Client{Transport: lose}
	res := provision(t, cfg, "../../template.yaml")
	if !lose.lost.Load() {
		t.Fatal("no CreateStack answer was lost: the test lost nothing")
	}
	if res.TableName == "" || res.QueueURL == "" {
		t.Fatalf("resources after the lost answer: %+v", res)
	}
	if _, err := Provision(t.Context(), emulator(t), "../../template.yaml", res.StackName); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("a second provision under the same name: %v, want the stack refused as existing", err)
	}
}
