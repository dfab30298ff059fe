package awsemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
)

// Resource types Provision creates. Everything else in the template (roles,
// functions, APIs, alarms) is not emulated; Lambda functions get placeholder
// names and ARNs so that references to them resolve.
const (
	typeTable            = "AWS::DynamoDB::Table"
	typeQueue            = "AWS::SQS::Queue"
	typeBucket           = "AWS::S3::Bucket"
	typeSAMStateMachine  = "AWS::Serverless::StateMachine"
	typeCFNStateMachine  = "AWS::StepFunctions::StateMachine"
	typeSAMFunction      = "AWS::Serverless::Function"
	typeCFNFunction      = "AWS::Lambda::Function"
	maxTableNameLen      = 255
	maxQueueNameLen      = 80
	maxBucketNameLen     = 63
	maxStateMachineNameL = 80
)

// Resources are what Provision created on the emulator. The named fields are
// the roles the batchgen functions read from their environment; Physical
// holds every provisioned resource by logical ID.
type Resources struct {
	// TableName is the template's DynamoDB table (TABLE_NAME); empty when the
	// template declares more than one.
	TableName string
	// QueueURL and QueueARN are the work queue (QUEUE_URL): the queue whose
	// RedrivePolicy names a dead-letter queue.
	QueueURL string
	QueueARN string
	// DLQURL and DLQARN are the work queue's dead-letter queue (DLQ_URL).
	DLQURL string
	DLQARN string
	// BucketName is the template's S3 bucket (BUCKET_NAME).
	BucketName string
	// StateMachineArn is the template's state machine (STATE_MACHINE_ARN).
	StateMachineArn string
	// Physical maps each provisioned logical ID to what !Ref returns for it:
	// table name, queue URL, bucket name or state machine ARN.
	Physical map[string]string
	// FunctionARNs maps each Lambda function logical ID that the provisioned
	// resources refer to (such as the exporter in the state machine) to the
	// ARN that stood in for it.
	FunctionARNs map[string]string

	cfg     aws.Config
	mu      sync.Mutex
	created []created
}

// created is one resource to delete on Cleanup.
type created struct {
	typ      string
	physical string
}

// Env returns the environment variables the batchgen functions read for the
// provisioned resources, for tests that run function code in-process.
func (r *Resources) Env() map[string]string {
	return map[string]string{
		"TABLE_NAME":        r.TableName,
		"QUEUE_URL":         r.QueueURL,
		"DLQ_URL":           r.DLQURL,
		"BUCKET_NAME":       r.BucketName,
		"STATE_MACHINE_ARN": r.StateMachineArn,
	}
}

// Option changes how Provision reads the template.
type Option func(*options)

type options struct {
	params       map[string]string
	functionARNs map[string]string
}

// WithParameter overrides a template parameter's Default, as
// `sam deploy --parameter-overrides` would.
func WithParameter(name, value string) Option {
	return func(o *options) { o.params[name] = value }
}

// WithFunctionARN makes references to the Lambda function with this logical
// ID resolve to arn. Defaults to a placeholder ARN in AccountID named
// <prefix>-<logical id in lowercase>, which is enough to create a state
// machine but not to invoke anything.
func WithFunctionARN(logicalID, arn string) Option {
	return func(o *options) { o.functionARNs[logicalID] = arn }
}

var validPrefix = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// Provision creates on the emulator the DynamoDB tables, SQS queues, S3
// buckets and state machines that the template at templatePath declares
// (those whose Condition holds), as the template declares them: key schema,
// GSIs, TTL, PITR, SSE and billing mode; queue attributes and redrive policy;
// bucket encryption, public access block and lifecycle rules; the state
// machine definition from DefinitionUri with DefinitionSubstitutions
// applied. Names are <prefix>-<logical id in lowercase> so tests can run side
// by side (see UniquePrefix); prefix is also the stack name for
// AWS::StackName. Properties the emulator cannot act on (roles, policies,
// tags) are not read.
//
// On error, whatever was already created is deleted again.
func Provision(ctx context.Context, cfg aws.Config, templatePath, prefix string, opts ...Option) (*Resources, error) {
	if !validPrefix.MatchString(prefix) {
		return nil, fmt.Errorf("provision: prefix %q: want 1-40 lowercase letters, digits or dashes", prefix)
	}
	o := options{params: map[string]string{}, functionARNs: map[string]string{}}
	for _, opt := range opts {
		opt(&o)
	}
	tpl, err := loadTemplate(templatePath)
	if err != nil {
		return nil, fmt.Errorf("provision: %w", err)
	}
	region := cfg.Region
	if region == "" {
		region = Region
	}
	r := &Resources{
		Physical:     map[string]string{},
		FunctionARNs: map[string]string{},
		cfg:          cfg,
	}
	p := &provisioner{
		tpl:     tpl,
		prefix:  prefix,
		region:  region,
		opts:    o,
		res:     r,
		planned: map[string]bool{},
		done:    map[string]*physical{},
		ddb:     dynamodb.NewFromConfig(cfg),
		sqs:     sqs.NewFromConfig(cfg),
		s3:      newS3(cfg),
		sfn:     sfn.NewFromConfig(cfg),
	}
	pseudo := map[string]any{
		"AWS::Region":           region,
		"AWS::AccountId":        AccountID,
		"AWS::Partition":        "aws",
		"AWS::URLSuffix":        "amazonaws.com",
		"AWS::StackName":        prefix,
		"AWS::StackId":          fmt.Sprintf("arn:aws:cloudformation:%s:%s:stack/%s/00000000-0000-0000-0000-000000000000", region, AccountID, prefix),
		"AWS::NoValue":          noValue{},
		"AWS::NotificationARNs": []any{},
	}
	if p.ev, err = newEvaluator(tpl, o.params, pseudo, p); err != nil {
		return nil, fmt.Errorf("provision: %w", err)
	}
	if err := p.run(ctx); err != nil {
		if cerr := r.Cleanup(context.WithoutCancel(ctx)); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up after failed provision: %w", cerr))
		}
		return nil, fmt.Errorf("provision %s: %w", templatePath, err)
	}
	return r, nil
}

// newS3 returns an S3 client using path-style URLs, which every emulator
// serves without wildcard DNS.
func newS3(cfg aws.Config) *s3.Client {
	return s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })
}

// physical is a created resource: its Ref value and its GetAtt attributes.
type physical struct {
	typ   string
	ref   string
	attrs map[string]string
	// dlqARN is, for a queue, the deadLetterTargetArn of its RedrivePolicy.
	dlqARN string
}

type provisioner struct {
	tpl     *template
	ev      *evaluator
	prefix  string
	region  string
	opts    options
	res     *Resources
	planned map[string]bool
	done    map[string]*physical

	ddb *dynamodb.Client
	sqs *sqs.Client
	s3  *s3.Client
	sfn *sfn.Client
}

func (p *provisioner) run(ctx context.Context) error {
	var pending []resource
	for _, id := range p.tpl.resourceIDs() {
		res := p.tpl.resources[id]
		switch res.typ {
		case typeTable, typeQueue, typeBucket, typeSAMStateMachine, typeCFNStateMachine:
		default:
			continue
		}
		on, err := p.ev.enabled(res)
		if err != nil {
			return fmt.Errorf("resource %s: %w", id, err)
		}
		if on {
			pending = append(pending, res)
			p.planned[id] = true
		}
	}
	// Create in rounds: a resource that refers to one not created yet (the
	// work queue's RedrivePolicy names the DLQ's ARN) waits for a later round.
	for len(pending) > 0 {
		var later []resource
		for _, res := range pending {
			err := p.create(ctx, res)
			if errors.Is(err, errPending) {
				later = append(later, res)
				continue
			}
			if err != nil {
				return fmt.Errorf("%s (%s): %w", res.id, res.typ, err)
			}
		}
		if len(later) == len(pending) {
			ids := make([]string, len(later))
			for i, res := range later {
				ids[i] = res.id
			}
			return fmt.Errorf("circular references among %s", strings.Join(ids, ", "))
		}
		pending = later
	}
	return p.assignRoles()
}

func (p *provisioner) create(ctx context.Context, res resource) error {
	var (
		ph  *physical
		err error
	)
	switch res.typ {
	case typeTable:
		ph, err = p.createTable(ctx, res)
	case typeQueue:
		ph, err = p.createQueue(ctx, res)
	case typeBucket:
		ph, err = p.createBucket(ctx, res)
	default:
		ph, err = p.createStateMachine(ctx, res)
	}
	if err != nil {
		return err
	}
	ph.typ = res.typ
	p.done[res.id] = ph
	p.res.Physical[res.id] = ph.ref
	return nil
}

// record notes a created resource for Cleanup at once, so a failure later in
// the same resource's setup still deletes it.
func (p *provisioner) record(typ, physicalID string) {
	p.res.mu.Lock()
	defer p.res.mu.Unlock()
	p.res.created = append(p.res.created, created{typ: typ, physical: physicalID})
}

// name returns the physical name for a logical ID.
func (p *provisioner) name(id string, max int) (string, error) {
	n := p.prefix + "-" + strings.ToLower(id)
	if len(n) > max {
		return "", fmt.Errorf("name %q is longer than %d characters; use a shorter prefix", n, max)
	}
	return n, nil
}

// props evaluates only the named properties of res, so that properties the
// emulator ignores (roles, policies) may refer to resources it does not create.
func (p *provisioner) props(res resource, keys ...string) (map[string]any, error) {
	out := map[string]any{}
	for _, k := range keys {
		raw, ok := res.properties[k]
		if !ok {
			continue
		}
		v, err := p.ev.eval(raw)
		if err != nil {
			return nil, fmt.Errorf("Properties.%s: %w", k, err)
		}
		if _, drop := v.(noValue); !drop {
			out[k] = v
		}
	}
	return out, nil
}

// ref implements resolver.
func (p *provisioner) ref(id string) (any, error) {
	if ph, ok := p.done[id]; ok {
		return ph.ref, nil
	}
	if p.planned[id] {
		return nil, fmt.Errorf("%s: %w", id, errPending)
	}
	switch typ := p.tpl.resources[id].typ; typ {
	case typeSAMFunction, typeCFNFunction:
		return p.functionName(id), nil
	default:
		return nil, fmt.Errorf("Ref %s: type %s is not provisioned by awsemu", id, typ)
	}
}

// getAtt implements resolver.
func (p *provisioner) getAtt(id, attr string) (any, error) {
	if ph, ok := p.done[id]; ok {
		v, ok := ph.attrs[attr]
		if !ok {
			return nil, fmt.Errorf("Fn::GetAtt %s.%s: attribute not emulated for %s", id, attr, ph.typ)
		}
		return v, nil
	}
	if p.planned[id] {
		return nil, fmt.Errorf("%s.%s: %w", id, attr, errPending)
	}
	switch typ := p.tpl.resources[id].typ; typ {
	case typeSAMFunction, typeCFNFunction:
		if attr != "Arn" {
			return nil, fmt.Errorf("Fn::GetAtt %s.%s: only Arn is emulated for functions", id, attr)
		}
		return p.functionARN(id), nil
	default:
		return nil, fmt.Errorf("Fn::GetAtt %s.%s: type %s is not provisioned by awsemu", id, attr, typ)
	}
}

func (p *provisioner) functionName(id string) string {
	return p.prefix + "-" + strings.ToLower(id)
}

func (p *provisioner) functionARN(id string) string {
	arn, ok := p.opts.functionARNs[id]
	if !ok {
		arn = fmt.Sprintf("arn:aws:lambda:%s:%s:function:%s", p.region, AccountID, p.functionName(id))
	}
	p.res.FunctionARNs[id] = arn
	return arn
}

// assignRoles fills the named fields of Resources.
func (p *provisioner) assignRoles() error {
	var tables, buckets, machines []string
	var workQueues []*physical
	queueByARN := map[string]*physical{}
	for _, id := range sortedKeys(p.done) {
		ph := p.done[id]
		switch ph.typ {
		case typeTable:
			tables = append(tables, ph.ref)
		case typeBucket:
			buckets = append(buckets, ph.ref)
		case typeQueue:
			queueByARN[ph.attrs["Arn"]] = ph
			if ph.dlqARN != "" {
				workQueues = append(workQueues, ph)
			}
		default:
			machines = append(machines, ph.ref)
		}
	}
	r := p.res
	if len(tables) == 1 {
		r.TableName = tables[0]
	}
	if len(buckets) == 1 {
		r.BucketName = buckets[0]
	}
	if len(machines) == 1 {
		r.StateMachineArn = machines[0]
	}
	if len(workQueues) == 1 {
		q := workQueues[0]
		r.QueueURL, r.QueueARN = q.ref, q.attrs["Arn"]
		dlq, ok := queueByARN[q.dlqARN]
		if !ok {
			return fmt.Errorf("work queue %s dead-letters to %s, which the template does not declare", q.ref, q.dlqARN)
		}
		r.DLQURL, r.DLQARN = dlq.ref, dlq.attrs["Arn"]
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ---------------------------------------------------------------- DynamoDB

func (p *provisioner) createTable(ctx context.Context, res resource) (*physical, error) {
	props, err := p.props(res, "AttributeDefinitions", "KeySchema", "BillingMode", "ProvisionedThroughput",
		"GlobalSecondaryIndexes", "LocalSecondaryIndexes", "SSESpecification", "StreamSpecification",
		"TableClass", "TimeToLiveSpecification", "PointInTimeRecoverySpecification")
	if err != nil {
		return nil, err
	}
	name, err := p.name(res.id, maxTableNameLen)
	if err != nil {
		return nil, err
	}
	in := &dynamodb.CreateTableInput{TableName: aws.String(name)}
	if in.AttributeDefinitions, err = attributeDefinitions(props["AttributeDefinitions"]); err != nil {
		return nil, fmt.Errorf("AttributeDefinitions: %w", err)
	}
	if in.KeySchema, err = keySchema(props["KeySchema"]); err != nil {
		return nil, fmt.Errorf("KeySchema: %w", err)
	}
	if in.ProvisionedThroughput, err = throughput(props["ProvisionedThroughput"]); err != nil {
		return nil, fmt.Errorf("ProvisionedThroughput: %w", err)
	}
	billing, err := optString(props, "BillingMode")
	if err != nil {
		return nil, err
	}
	if billing == "" && in.ProvisionedThroughput == nil {
		return nil, errors.New("neither BillingMode nor ProvisionedThroughput is set")
	}
	if billing != "" {
		in.BillingMode = ddbtypes.BillingMode(billing)
	}
	gsis, err := optList(props, "GlobalSecondaryIndexes")
	if err != nil {
		return nil, err
	}
	for i, raw := range gsis {
		g, err := p.gsi(raw)
		if err != nil {
			return nil, fmt.Errorf("GlobalSecondaryIndexes[%d]: %w", i, err)
		}
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, g)
	}
	lsis, err := optList(props, "LocalSecondaryIndexes")
	if err != nil {
		return nil, err
	}
	for i, raw := range lsis {
		l, err := lsi(raw)
		if err != nil {
			return nil, fmt.Errorf("LocalSecondaryIndexes[%d]: %w", i, err)
		}
		in.LocalSecondaryIndexes = append(in.LocalSecondaryIndexes, l)
	}
	if sse, err := optMap(props, "SSESpecification"); err != nil {
		return nil, err
	} else if sse != nil {
		spec := &ddbtypes.SSESpecification{}
		if v, ok := sse["SSEEnabled"]; ok {
			b, err := toBool(v)
			if err != nil {
				return nil, fmt.Errorf("SSESpecification.SSEEnabled: %w", err)
			}
			spec.Enabled = aws.Bool(b)
		}
		if s, _ := sse["SSEType"].(string); s != "" {
			spec.SSEType = ddbtypes.SSEType(s)
		}
		if s, _ := sse["KMSMasterKeyId"].(string); s != "" {
			spec.KMSMasterKeyId = aws.String(s)
		}
		in.SSESpecification = spec
	}
	if st, err := optMap(props, "StreamSpecification"); err != nil {
		return nil, err
	} else if st != nil {
		view, err := optString(st, "StreamViewType")
		if err != nil {
			return nil, fmt.Errorf("StreamSpecification: %w", err)
		}
		in.StreamSpecification = &ddbtypes.StreamSpecification{StreamEnabled: aws.Bool(true), StreamViewType: ddbtypes.StreamViewType(view)}
	}
	if class, err := optString(props, "TableClass"); err != nil {
		return nil, err
	} else if class != "" {
		in.TableClass = ddbtypes.TableClass(class)
	}

	out, err := p.ddb.CreateTable(ctx, in)
	var inUse *ddbtypes.ResourceInUseException
	if errors.As(err, &inUse) {
		// The SDK retried a CreateTable that had in fact succeeded (a busy
		// emulator answered late). The name is unique to this run, so the
		// table is ours.
		if desc, derr := p.ddb.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}); derr == nil {
			out, err = &dynamodb.CreateTableOutput{TableDescription: desc.Table}, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", name, err)
	}
	p.record(typeTable, name)
	waiter := dynamodb.NewTableExistsWaiter(p.ddb, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 50*time.Millisecond, time.Second
	})
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}, time.Minute); err != nil {
		return nil, fmt.Errorf("wait for table %s: %w", name, err)
	}

	if ttl, err := optMap(props, "TimeToLiveSpecification"); err != nil {
		return nil, err
	} else if ttl != nil {
		attr, err := optString(ttl, "AttributeName")
		if err != nil {
			return nil, fmt.Errorf("TimeToLiveSpecification: %w", err)
		}
		enabled, err := toBool(ttl["Enabled"])
		if err != nil {
			return nil, fmt.Errorf("TimeToLiveSpecification.Enabled: %w", err)
		}
		if enabled {
			if _, err := p.ddb.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
				TableName:               aws.String(name),
				TimeToLiveSpecification: &ddbtypes.TimeToLiveSpecification{AttributeName: aws.String(attr), Enabled: aws.Bool(true)},
			}); err != nil {
				return nil, fmt.Errorf("enable TTL on %s: %w", name, err)
			}
		}
	}
	if pitr, err := optMap(props, "PointInTimeRecoverySpecification"); err != nil {
		return nil, err
	} else if pitr != nil {
		enabled, err := toBool(pitr["PointInTimeRecoveryEnabled"])
		if err != nil {
			return nil, fmt.Errorf("PointInTimeRecoverySpecification.PointInTimeRecoveryEnabled: %w", err)
		}
		if enabled {
			if _, err := p.ddb.UpdateContinuousBackups(ctx, &dynamodb.UpdateContinuousBackupsInput{
				TableName:                        aws.String(name),
				PointInTimeRecoverySpecification: &ddbtypes.PointInTimeRecoverySpecification{PointInTimeRecoveryEnabled: aws.Bool(true)},
			}); err != nil {
				return nil, fmt.Errorf("enable PITR on %s: %w", name, err)
			}
		}
	}
	attrs := map[string]string{"Arn": aws.ToString(out.TableDescription.TableArn)}
	if s := aws.ToString(out.TableDescription.LatestStreamArn); s != "" {
		attrs["StreamArn"] = s
	}
	return &physical{ref: name, attrs: attrs}, nil
}

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

func (p *provisioner) gsi(raw any) (ddbtypes.GlobalSecondaryIndex, error) {
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

func lsi(raw any) (ddbtypes.LocalSecondaryIndex, error) {
	m, err := asMap(raw)
	if err != nil {
		return ddbtypes.LocalSecondaryIndex{}, err
	}
	name, err := reqString(m, "IndexName")
	if err != nil {
		return ddbtypes.LocalSecondaryIndex{}, err
	}
	l := ddbtypes.LocalSecondaryIndex{IndexName: aws.String(name)}
	if l.KeySchema, err = keySchema(m["KeySchema"]); err != nil {
		return l, fmt.Errorf("%s.KeySchema: %w", name, err)
	}
	if l.Projection, err = projection(m["Projection"]); err != nil {
		return l, fmt.Errorf("%s.Projection: %w", name, err)
	}
	return l, nil
}

// ---------------------------------------------------------------- SQS

// queueAttributes are the AWS::SQS::Queue properties that map one to one to
// SQS queue attributes.
var queueAttributes = []string{
	"VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds", "MaximumMessageSize",
	"ReceiveMessageWaitTimeSeconds", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds",
	"SqsManagedSseEnabled", "FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
	"FifoThroughputLimit",
}

func (p *provisioner) createQueue(ctx context.Context, res resource) (*physical, error) {
	props, err := p.props(res, append(queueAttributes, "RedrivePolicy", "RedriveAllowPolicy")...)
	if err != nil {
		return nil, err
	}
	name, err := p.name(res.id, maxQueueNameLen-len(".fifo"))
	if err != nil {
		return nil, err
	}
	attrs := map[string]string{}
	for _, k := range queueAttributes {
		v, ok := props[k]
		if !ok {
			continue
		}
		s, err := scalarString(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		attrs[k] = s
	}
	if attrs["FifoQueue"] == "true" {
		name += ".fifo"
	}
	var dlqARN string
	for _, k := range []string{"RedrivePolicy", "RedriveAllowPolicy"} {
		v, ok := props[k]
		if !ok {
			continue
		}
		s, isString := v.(string)
		if !isString {
			b, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			s = string(b)
		}
		attrs[k] = s
		if k == "RedrivePolicy" {
			var rp struct {
				DeadLetterTargetArn string `json:"deadLetterTargetArn"`
			}
			if err := json.Unmarshal([]byte(s), &rp); err != nil || rp.DeadLetterTargetArn == "" {
				return nil, fmt.Errorf("RedrivePolicy %s: no deadLetterTargetArn", s)
			}
			dlqARN = rp.DeadLetterTargetArn
		}
	}
	out, err := p.sqs.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		return nil, fmt.Errorf("create queue %s: %w", name, err)
	}
	queueURL := aws.ToString(out.QueueUrl)
	p.record(typeQueue, queueURL)
	got, err := p.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(queueURL),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return nil, fmt.Errorf("get ARN of queue %s: %w", name, err)
	}
	arn := got.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]
	return &physical{
		ref:    queueURL,
		attrs:  map[string]string{"Arn": arn, "QueueName": name, "QueueUrl": queueURL},
		dlqARN: dlqARN,
	}, nil
}

// ---------------------------------------------------------------- S3

func (p *provisioner) createBucket(ctx context.Context, res resource) (*physical, error) {
	props, err := p.props(res, "BucketEncryption", "PublicAccessBlockConfiguration", "LifecycleConfiguration", "VersioningConfiguration")
	if err != nil {
		return nil, err
	}
	name, err := p.name(res.id, maxBucketNameLen)
	if err != nil {
		return nil, err
	}
	in := &s3.CreateBucketInput{Bucket: aws.String(name)}
	if p.region != "us-east-1" {
		in.CreateBucketConfiguration = &s3types.CreateBucketConfiguration{LocationConstraint: s3types.BucketLocationConstraint(p.region)}
	}
	if _, err := p.s3.CreateBucket(ctx, in); err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", name, err)
	}
	p.record(typeBucket, name)

	if v, ok := props["PublicAccessBlockConfiguration"]; ok {
		cfg, err := publicAccessBlock(v)
		if err != nil {
			return nil, fmt.Errorf("PublicAccessBlockConfiguration: %w", err)
		}
		if _, err := p.s3.PutPublicAccessBlock(ctx, &s3.PutPublicAccessBlockInput{Bucket: aws.String(name), PublicAccessBlockConfiguration: cfg}); err != nil {
			return nil, fmt.Errorf("put public access block on %s: %w", name, err)
		}
	}
	if v, ok := props["BucketEncryption"]; ok {
		cfg, err := bucketEncryption(v)
		if err != nil {
			return nil, fmt.Errorf("BucketEncryption: %w", err)
		}
		if _, err := p.s3.PutBucketEncryption(ctx, &s3.PutBucketEncryptionInput{Bucket: aws.String(name), ServerSideEncryptionConfiguration: cfg}); err != nil {
			return nil, fmt.Errorf("put encryption on %s: %w", name, err)
		}
	}
	if v, ok := props["VersioningConfiguration"]; ok {
		m, err := asMap(v)
		if err != nil {
			return nil, fmt.Errorf("VersioningConfiguration: %w", err)
		}
		status, err := reqString(m, "Status")
		if err != nil {
			return nil, fmt.Errorf("VersioningConfiguration: %w", err)
		}
		if _, err := p.s3.PutBucketVersioning(ctx, &s3.PutBucketVersioningInput{
			Bucket:                  aws.String(name),
			VersioningConfiguration: &s3types.VersioningConfiguration{Status: s3types.BucketVersioningStatus(status)},
		}); err != nil {
			return nil, fmt.Errorf("put versioning on %s: %w", name, err)
		}
	}
	if v, ok := props["LifecycleConfiguration"]; ok {
		rules, err := lifecycleRules(v)
		if err != nil {
			return nil, fmt.Errorf("LifecycleConfiguration: %w", err)
		}
		if _, err := p.s3.PutBucketLifecycleConfiguration(ctx, &s3.PutBucketLifecycleConfigurationInput{
			Bucket:                 aws.String(name),
			LifecycleConfiguration: &s3types.BucketLifecycleConfiguration{Rules: rules},
		}); err != nil {
			return nil, fmt.Errorf("put lifecycle on %s: %w", name, err)
		}
	}
	return &physical{ref: name, attrs: map[string]string{
		"Arn":                "arn:aws:s3:::" + name,
		"DomainName":         name + ".s3.amazonaws.com",
		"RegionalDomainName": name + ".s3." + p.region + ".amazonaws.com",
	}}, nil
}

func publicAccessBlock(v any) (*s3types.PublicAccessBlockConfiguration, error) {
	m, err := asMap(v)
	if err != nil {
		return nil, err
	}
	cfg := &s3types.PublicAccessBlockConfiguration{}
	for key, dst := range map[string]**bool{
		"BlockPublicAcls":       &cfg.BlockPublicAcls,
		"BlockPublicPolicy":     &cfg.BlockPublicPolicy,
		"IgnorePublicAcls":      &cfg.IgnorePublicAcls,
		"RestrictPublicBuckets": &cfg.RestrictPublicBuckets,
	} {
		if raw, ok := m[key]; ok {
			b, err := toBool(raw)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			*dst = aws.Bool(b)
		}
	}
	return cfg, nil
}

func bucketEncryption(v any) (*s3types.ServerSideEncryptionConfiguration, error) {
	m, err := asMap(v)
	if err != nil {
		return nil, err
	}
	items, err := asList(m["ServerSideEncryptionConfiguration"])
	if err != nil {
		return nil, fmt.Errorf("ServerSideEncryptionConfiguration: %w", err)
	}
	cfg := &s3types.ServerSideEncryptionConfiguration{}
	for i, raw := range items {
		rm, err := asMap(raw)
		if err != nil {
			return nil, fmt.Errorf("ServerSideEncryptionConfiguration[%d]: %w", i, err)
		}
		rule := s3types.ServerSideEncryptionRule{}
		if d, ok := rm["ServerSideEncryptionByDefault"]; ok {
			dm, err := asMap(d)
			if err != nil {
				return nil, fmt.Errorf("ServerSideEncryptionConfiguration[%d].ServerSideEncryptionByDefault: %w", i, err)
			}
			alg, err := reqString(dm, "SSEAlgorithm")
			if err != nil {
				return nil, fmt.Errorf("ServerSideEncryptionConfiguration[%d]: %w", i, err)
			}
			def := &s3types.ServerSideEncryptionByDefault{SSEAlgorithm: s3types.ServerSideEncryption(alg)}
			if k, _ := dm["KMSMasterKeyID"].(string); k != "" {
				def.KMSMasterKeyID = aws.String(k)
			}
			rule.ApplyServerSideEncryptionByDefault = def
		}
		if b, ok := rm["BucketKeyEnabled"]; ok {
			enabled, err := toBool(b)
			if err != nil {
				return nil, fmt.Errorf("ServerSideEncryptionConfiguration[%d].BucketKeyEnabled: %w", i, err)
			}
			rule.BucketKeyEnabled = aws.Bool(enabled)
		}
		cfg.Rules = append(cfg.Rules, rule)
	}
	return cfg, nil
}

func lifecycleRules(v any) ([]s3types.LifecycleRule, error) {
	m, err := asMap(v)
	if err != nil {
		return nil, err
	}
	items, err := asList(m["Rules"])
	if err != nil {
		return nil, fmt.Errorf("Rules: %w", err)
	}
	var rules []s3types.LifecycleRule
	for i, raw := range items {
		rm, err := asMap(raw)
		if err != nil {
			return nil, fmt.Errorf("Rules[%d]: %w", i, err)
		}
		status, err := reqString(rm, "Status")
		if err != nil {
			return nil, fmt.Errorf("Rules[%d]: %w", i, err)
		}
		id, err1 := optString(rm, "Id")
		prefix, err2 := optString(rm, "Prefix")
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("Rules[%d]: %w", i, err)
		}
		rule := s3types.LifecycleRule{
			Status: s3types.ExpirationStatus(status),
			Filter: &s3types.LifecycleRuleFilter{Prefix: aws.String(prefix)},
		}
		if id != "" {
			rule.ID = aws.String(id)
		}
		if d, ok := rm["ExpirationInDays"]; ok {
			days, err := toInt(d)
			if err != nil {
				return nil, fmt.Errorf("Rules[%d].ExpirationInDays: %w", i, err)
			}
			rule.Expiration = &s3types.LifecycleExpiration{Days: aws.Int32(int32(days))}
		}
		if a, ok := rm["AbortIncompleteMultipartUpload"]; ok {
			am, err := asMap(a)
			if err != nil {
				return nil, fmt.Errorf("Rules[%d].AbortIncompleteMultipartUpload: %w", i, err)
			}
			days, err := toInt(am["DaysAfterInitiation"])
			if err != nil {
				return nil, fmt.Errorf("Rules[%d].AbortIncompleteMultipartUpload.DaysAfterInitiation: %w", i, err)
			}
			rule.AbortIncompleteMultipartUpload = &s3types.AbortIncompleteMultipartUpload{DaysAfterInitiation: aws.Int32(int32(days))}
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// ---------------------------------------------------------------- Step Functions

func (p *provisioner) createStateMachine(ctx context.Context, res resource) (*physical, error) {
	props, err := p.props(res, "DefinitionUri", "Definition", "DefinitionString", "DefinitionSubstitutions", "Type", "StateMachineType")
	if err != nil {
		return nil, err
	}
	name, err := p.name(res.id, maxStateMachineNameL)
	if err != nil {
		return nil, err
	}
	def, err := p.definition(props)
	if err != nil {
		return nil, err
	}
	typ, err := optString(props, "Type")
	if err != nil {
		return nil, err
	}
	if typ == "" {
		if typ, err = optString(props, "StateMachineType"); err != nil {
			return nil, err
		}
	}
	if typ == "" {
		typ = string(sfntypes.StateMachineTypeStandard)
	}
	out, err := p.sfn.CreateStateMachine(ctx, &sfn.CreateStateMachineInput{
		Name:       aws.String(name),
		Definition: aws.String(def),
		RoleArn:    aws.String(fmt.Sprintf("arn:aws:iam::%s:role/%s", AccountID, name)),
		Type:       sfntypes.StateMachineType(typ),
	})
	if err != nil {
		return nil, fmt.Errorf("create state machine %s: %w", name, err)
	}
	arn := aws.ToString(out.StateMachineArn)
	p.record(typeSAMStateMachine, arn)
	return &physical{ref: arn, attrs: map[string]string{"Arn": arn, "Name": name}}, nil
}

// definition returns the state machine definition with its
// DefinitionSubstitutions applied.
func (p *provisioner) definition(props map[string]any) (string, error) {
	var def string
	switch uri, ok := props["DefinitionUri"]; {
	case ok:
		path, isString := uri.(string)
		if !isString {
			return "", fmt.Errorf("DefinitionUri %v: only a local file path is emulated", uri)
		}
		if !filepath.IsAbs(path) {
			path = filepath.Join(p.tpl.dir, path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("DefinitionUri: %w", err)
		}
		def = string(b)
	case props["Definition"] != nil:
		b, err := json.Marshal(props["Definition"])
		if err != nil {
			return "", fmt.Errorf("Definition: %w", err)
		}
		def = string(b)
	case props["DefinitionString"] != nil:
		s, isString := props["DefinitionString"].(string)
		if !isString {
			return "", fmt.Errorf("DefinitionString is %T", props["DefinitionString"])
		}
		def = s
	default:
		return "", errors.New("no DefinitionUri, Definition or DefinitionString")
	}
	subs := map[string]string{}
	if raw, ok := props["DefinitionSubstitutions"]; ok {
		m, err := asMap(raw)
		if err != nil {
			return "", fmt.Errorf("DefinitionSubstitutions: %w", err)
		}
		for k, v := range m {
			s, err := scalarString(v)
			if err != nil {
				return "", fmt.Errorf("DefinitionSubstitutions.%s: %w", k, err)
			}
			subs[k] = s
		}
	}
	def, err := substitute(def, subs)
	if err != nil {
		return "", err
	}
	if !json.Valid([]byte(def)) {
		return "", errors.New("definition is not valid JSON after substitution")
	}
	return def, nil
}

// substitute applies DefinitionSubstitutions. A ${Name} the substitutions do
// not define is an error: deployed, it would reach Step Functions verbatim.
func substitute(def string, subs map[string]string) (string, error) {
	var missing []string
	out := subVar.ReplaceAllStringFunc(def, func(m string) string {
		name := m[2 : len(m)-1]
		if v, ok := subs[name]; ok {
			return v
		}
		missing = append(missing, name)
		return m
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("definition uses ${%s}, which DefinitionSubstitutions does not define", strings.Join(missing, "}, ${"))
	}
	return out, nil
}

// ---------------------------------------------------------------- cleanup

// Cleanup deletes everything Provision created, newest first: state
// machines, queues, buckets (with their objects and unfinished uploads) and
// tables. Resources already gone count as deleted, so Cleanup may be called
// again after a partial failure; it returns every error it met.
func (r *Resources) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var (
		errs []error
		kept []created
	)
	ddb := dynamodb.NewFromConfig(r.cfg)
	sq := sqs.NewFromConfig(r.cfg)
	s3c := newS3(r.cfg)
	sf := sfn.NewFromConfig(r.cfg)
	for i := len(r.created) - 1; i >= 0; i-- {
		c := r.created[i]
		var err error
		switch c.typ {
		case typeTable:
			_, err = ddb.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(c.physical)})
		case typeQueue:
			_, err = sq.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(c.physical)})
		case typeBucket:
			err = deleteBucket(ctx, s3c, c.physical)
		default:
			_, err = sf.DeleteStateMachine(ctx, &sfn.DeleteStateMachineInput{StateMachineArn: aws.String(c.physical)})
		}
		if err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s %s: %w", c.typ, c.physical, err))
			kept = append([]created{c}, kept...)
		}
	}
	r.created = kept
	return errors.Join(errs...)
}

// deleteBucket empties a bucket (every object version, delete marker and
// unfinished multipart upload) and deletes it.
func deleteBucket(ctx context.Context, c *s3.Client, bucket string) error {
	uploads, err := c.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	if err != nil {
		return fmt.Errorf("list uploads: %w", err)
	}
	for _, u := range uploads.Uploads {
		if _, err := c.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(bucket), Key: u.Key, UploadId: u.UploadId}); err != nil && !isNotFound(err) {
			return fmt.Errorf("abort upload %s: %w", aws.ToString(u.Key), err)
		}
	}
	pages := s3.NewListObjectVersionsPaginator(c, &s3.ListObjectVersionsInput{Bucket: aws.String(bucket)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list objects: %w", err)
		}
		var ids []s3types.ObjectIdentifier
		for _, v := range page.Versions {
			ids = append(ids, s3types.ObjectIdentifier{Key: v.Key, VersionId: v.VersionId})
		}
		for _, m := range page.DeleteMarkers {
			ids = append(ids, s3types.ObjectIdentifier{Key: m.Key, VersionId: m.VersionId})
		}
		if len(ids) == 0 {
			continue
		}
		out, err := c.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String(bucket), Delete: &s3types.Delete{Objects: ids, Quiet: aws.Bool(true)}})
		if err != nil {
			return fmt.Errorf("delete objects: %w", err)
		}
		if len(out.Errors) > 0 {
			e := out.Errors[0]
			return fmt.Errorf("delete object %s: %s", aws.ToString(e.Key), aws.ToString(e.Message))
		}
	}
	if _, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return fmt.Errorf("delete bucket: %w", err)
	}
	return nil
}

// isNotFound reports whether err says the resource does not exist.
func isNotFound(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "ResourceNotFoundException", "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue",
		"NoSuchBucket", "NoSuchUpload", "StateMachineDoesNotExist":
		return true
	}
	return false
}

// ---------------------------------------------------------------- property helpers

func asMap(v any) (map[string]any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want a mapping, got %T", v)
	}
	return m, nil
}

func asList(v any) ([]any, error) {
	l, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("want a list, got %T", v)
	}
	return l, nil
}

func optMap(m map[string]any, key string) (map[string]any, error) {
	v, ok := m[key]
	if !ok {
		return nil, nil
	}
	out, err := asMap(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return out, nil
}

func optList(m map[string]any, key string) ([]any, error) {
	v, ok := m[key]
	if !ok {
		return nil, nil
	}
	out, err := asList(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return out, nil
}

func optString(m map[string]any, key string) (string, error) {
	v, ok := m[key]
	if !ok {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: want a string, got %T", key, v)
	}
	return s, nil
}

func reqString(m map[string]any, key string) (string, error) {
	s, err := optString(m, key)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", fmt.Errorf("%s is missing", key)
	}
	return s, nil
}
