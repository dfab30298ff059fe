package awsops_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/awsops"
)

// config points clients at a server answering every request with an empty
// JSON object, which every operation used here accepts as a response.
func config(t *testing.T) aws.Config {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = w.Write([]byte("{}"))
	}))
	t.Cleanup(srv.Close)
	return aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(srv.URL),
		HTTPClient:   srv.Client(),
	}
}

func TestRecorderCountsOperationsAndActions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rec := awsops.New()
	cfg := rec.Attach(config(t))
	ddb := dynamodb.NewFromConfig(cfg)
	key := map[string]ddbtypes.AttributeValue{"pk": &ddbtypes.AttributeValueMemberS{Value: "a"}}
	for range 2 {
		if _, err := ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String("t"), Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := ddb.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []ddbtypes.TransactWriteItem{
		{Update: &ddbtypes.Update{TableName: aws.String("t"), Key: key, UpdateExpression: aws.String("SET a = :a")}},
		{ConditionCheck: &ddbtypes.ConditionCheck{TableName: aws.String("t"), Key: key, ConditionExpression: aws.String("attribute_exists(pk)")}},
		{Update: &ddbtypes.Update{TableName: aws.String("t"), Key: key, UpdateExpression: aws.String("SET b = :b")}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	q := sqs.NewFromConfig(cfg)
	if _, err := q.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String("q"), Entries: []sqstypes.SendMessageBatchRequestEntry{{Id: aws.String("1"), MessageBody: aws.String("x")}}}); err != nil {
		t.Fatal(err)
	}
	// A presigned request is no call, but needs its action.
	presign := s3.NewPresignClient(s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true }))
	if _, err := presign.PresignPutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("b"), Key: aws.String("k")}); err != nil {
		t.Fatal(err)
	}

	if diff := cmp.Diff(map[string]int{"dynamodb:GetItem": 2, "dynamodb:TransactWriteItems": 1, "sqs:SendMessageBatch": 1}, rec.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"s3:PutObject": 1}, rec.Presigned()); diff != "" {
		t.Errorf("Presigned (-want +got):\n%s", diff)
	}
	if got := rec.Total(); got != 4 {
		t.Errorf("Total = %d, want 4", got)
	}
	wantOps := []string{"dynamodb:GetItem", "dynamodb:TransactWriteItems", "s3:PutObject", "sqs:SendMessageBatch"}
	if diff := cmp.Diff(wantOps, rec.Ops()); diff != "" {
		t.Errorf("Ops (-want +got):\n%s", diff)
	}
	wantActions := []string{"dynamodb:ConditionCheckItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "s3:PutObject", "sqs:SendMessage"}
	if diff := cmp.Diff(wantActions, rec.Actions()); diff != "" {
		t.Errorf("Actions (-want +got):\n%s", diff)
	}
	rec.Reset()
	if got := rec.Total(); got != 0 || len(rec.Actions()) != 0 {
		t.Errorf("after Reset: Total = %d, Actions = %v", got, rec.Actions())
	}
}

// A failed call was sent and is counted.
func TestRecorderCountsFailedCalls(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"__type":"com.amazonaws.dynamodb.v20120810#ResourceNotFoundException","message":"no table"}`))
	}))
	t.Cleanup(srv.Close)
	rec := awsops.New()
	cfg := rec.Attach(aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(srv.URL), HTTPClient: srv.Client()})
	if _, err := dynamodb.NewFromConfig(cfg).DescribeTable(t.Context(), &dynamodb.DescribeTableInput{TableName: aws.String("t")}); err == nil {
		t.Fatal("DescribeTable succeeded against a server answering 400")
	}
	if diff := cmp.Diff(map[string]int{"dynamodb:DescribeTable": 1}, rec.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
}

// An S3 read that finds no key needs s3:ListBucket on AWS (without it S3
// answers 403, not 404), so a 404 seen through the recorder adds the action;
// a found key and another service's 404 do not.
func TestRecorderS3NotFoundNeedsListBucket(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/b/missing" {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`<Error><Code>NoSuchKey</Code><Message>none</Message></Error>`))
			return
		}
		_, _ = w.Write([]byte("content"))
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{"found", []string{"s3:GetObject"}},
		{"missing", []string{"s3:GetObject", "s3:ListBucket"}},
	} {
		rec := awsops.New()
		cfg := rec.Attach(aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
			BaseEndpoint: aws.String(srv.URL), HTTPClient: srv.Client()})
		out, err := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true }).GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String("b"), Key: aws.String(tc.key)})
		if err == nil {
			out.Body.Close()
		}
		if (err != nil) != (tc.key == "missing") {
			t.Fatalf("GetObject %s: err = %v", tc.key, err)
		}
		if diff := cmp.Diff(tc.want, rec.Actions()); diff != "" {
			t.Errorf("Actions after GetObject %s (-want +got):\n%s", tc.key, diff)
		}
	}
}

// Attach gives each recorder its own APIOptions, so two functions built from
// one base configuration report separately.
func TestSetKeepsFunctionsApart(t *testing.T) {
	t.Parallel()
	base := config(t)
	var set awsops.Set
	a := dynamodb.NewFromConfig(set.For("a").Attach(base))
	b := dynamodb.NewFromConfig(set.For("b").Attach(base))
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _ = a.DescribeTable(t.Context(), &dynamodb.DescribeTableInput{TableName: aws.String("t")})
		}()
		go func() {
			defer wg.Done()
			_, _ = b.ListTables(t.Context(), &dynamodb.ListTablesInput{})
		}()
	}
	wg.Wait()
	if diff := cmp.Diff([]string{"a", "b"}, set.Names()); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"dynamodb:DescribeTable": 20}, set.For("a").Counts()); diff != "" {
		t.Errorf("a (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"dynamodb:ListTables": 20}, set.For("b").Counts()); diff != "" {
		t.Errorf("b (-want +got):\n%s", diff)
	}
	if got := set.Total(); got != 40 {
		t.Errorf("Total = %d, want 40", got)
	}
	if len(base.APIOptions) != 0 {
		t.Errorf("Attach changed the base configuration's APIOptions: %d", len(base.APIOptions))
	}
}

func TestIAMActions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, service, op string
		params            any
		want              []string
	}{
		{"plain", "DynamoDB", "Query", nil, []string{"dynamodb:Query"}},
		{"transact get", "DynamoDB", "TransactGetItems", &dynamodb.TransactGetItemsInput{}, []string{"dynamodb:GetItem"}},
		{"transact write put+delete", "DynamoDB", "TransactWriteItems", &dynamodb.TransactWriteItemsInput{TransactItems: []ddbtypes.TransactWriteItem{
			{Delete: &ddbtypes.Delete{}}, {Put: &ddbtypes.Put{}}, {Put: &ddbtypes.Put{}}}}, []string{"dynamodb:DeleteItem", "dynamodb:PutItem"}},
		{"sqs batch", "SQS", "DeleteMessageBatch", nil, []string{"sqs:DeleteMessage"}},
		{"sqs single", "SQS", "ReceiveMessage", nil, []string{"sqs:ReceiveMessage"}},
		{"step functions", "SFN", "StartExecution", nil, []string{"states:StartExecution"}},
		{"s3 head", "S3", "HeadObject", nil, []string{"s3:GetObject"}},
		{"s3 list", "S3", "ListObjectsV2", nil, []string{"s3:ListBucket"}},
		{"s3 multipart", "S3", "UploadPart", nil, []string{"s3:PutObject"}},
		{"ssm", "SSM", "GetParameter", nil, []string{"ssm:GetParameter"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, awsops.IAMActions(tt.service, tt.op, tt.params)); diff != "" {
				t.Errorf("IAMActions(%s, %s) (-want +got):\n%s", tt.service, tt.op, diff)
			}
		})
	}
}
