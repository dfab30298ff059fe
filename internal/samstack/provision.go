package samstack

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
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

// Resource types Provision creates. The stack holds the tables, queues and
// buckets; state machines are created beside it (see the state machine gap
// below). The other resources of the translation (roles, functions, APIs,
// alarms) are left out: moto cannot run a Go Lambda, and an event source
// mapping or a bucket notification to a function it cannot run would
// swallow the messages and uploads the tests drive by hand (internal/samstack/localrun).
// References to the functions resolve to placeholder names and ARNs.
const (
	typeTable           = "AWS::DynamoDB::Table"
	typeQueue           = "AWS::SQS::Queue"
	typeBucket          = "AWS::S3::Bucket"
	typeCFNStateMachine = "AWS::StepFunctions::StateMachine"
	typeCFNFunction     = "AWS::Lambda::Function"
	typeRole            = "AWS::IAM::Role"
	typeLogGroup        = "AWS::Logs::LogGroup"
	typeStack           = "AWS::CloudFormation::Stack"
	// typeBucketObjects is a bucket to empty before its stack is deleted.
	typeBucketObjects = "objects"
)

// Properties moto's CloudFormation (5.2.5) accepts but does not apply.
// Provision applies them itself through the service APIs once the stack
// exists; TestMotoCloudFormationGaps proves each gap, so that the day moto
// honours one, that test fails and the workaround here can go.
var propertyGaps = map[string][]string{
	// CreateStack makes the table with TTL and point-in-time recovery off.
	// (SSESpecification is dropped too, and moto offers no call to turn it
	// on afterwards: TestTemplateTable checks the template declares it.)
	typeTable: {"TimeToLiveSpecification", "PointInTimeRecoverySpecification"},
	// CreateStack makes the bucket without its public access block and
	// lifecycle rules, and with BucketKeyEnabled false.
	typeBucket: {"PublicAccessBlockConfiguration", "LifecycleConfiguration", "BucketEncryption"},
}

// The state machine gap: moto's CloudFormation creates an AWS::StepFunctions::StateMachine
// without applying DefinitionSubstitutions, and in the plain Step Functions
// backend, which the emulator does not serve once executions run the
// definition (execute_state_machine, which the tests need): the machine
// could not be described or started. Provision has CloudFormation evaluate
// the definition and substitutions (as stack outputs), applies the
// substitutions and creates the machine through the Step Functions API
// (planMachine, createStateMachine); TestMotoCloudFormationGaps proves it.

// Resources are what Provision created on the emulator. The named fields are
// the roles the batchgen functions read from their environment; Physical
// holds every provisioned resource by logical ID.
type Resources struct {
	// StackName is the CloudFormation stack that holds the tables, queues
	// and buckets.
	StackName string
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

// Provision creates on the emulator what the SAM template at templatePath
// declares for the data path, the way a deployment does: the template is
// translated by the SAM translator (infra/sam_translate.py, as `sam deploy`
// would) and its DynamoDB tables, SQS queues and S3 buckets are created as
// one CloudFormation stack named prefix through the emulator's own
// CloudFormation, which evaluates the parameters, conditions and intrinsic
// functions. What moto's CloudFormation does not apply (propertyGaps,
// the state machine gap) Provision applies through the service APIs, from the values
// the stack evaluated. Names follow CloudFormation (<prefix>-<logical
// id>-<suffix>), so tests can run side by side (see UniquePrefix).
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
	raw, err := Translate(ctx, templatePath)
	if err != nil {
		return nil, fmt.Errorf("provision: %w", err)
	}
	var tpl map[string]any
	if err := json.Unmarshal(raw, &tpl); err != nil {
		return nil, fmt.Errorf("provision: the translation of %s: %w", templatePath, err)
	}
	region := cfg.Region
	if region == "" {
		region = Region
	}
	r := &Resources{
		StackName:    prefix,
		Physical:     map[string]string{},
		FunctionARNs: map[string]string{},
		cfg:          cfg,
	}
	p := &provisioner{
		prefix:  prefix,
		region:  region,
		opts:    o,
		res:     r,
		outputs: map[string]any{},
		cfn:     cloudformation.NewFromConfig(cfg),
		ddb:     dynamodb.NewFromConfig(cfg),
		sqs:     sqs.NewFromConfig(cfg),
		s3:      newS3(cfg),
		sfn:     sfn.NewFromConfig(cfg),
	}
	if err := p.run(ctx, tpl); err != nil {
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

type provisioner struct {
	prefix string
	region string
	opts   options
	res    *Resources

	// stack is the template submitted to CloudFormation.
	stack map[string]any
	// kept maps the logical IDs in the stack to their types.
	kept map[string]string
	// gaps are the properties to apply after the stack is created, with
	// their intrinsic functions replaced by outputRef.
	gaps []gap
	// machines are the state machines to create beside the stack.
	machines []machine
	// outputs are the stack outputs that evaluate intrinsic functions for
	// gaps and machines; outputValues their values once the stack exists.
	outputs      map[string]any
	outputValues map[string]string

	cfn *cloudformation.Client
	ddb *dynamodb.Client
	sqs *sqs.Client
	s3  *s3.Client
	sfn *sfn.Client
}

// gap is a property moto's CloudFormation does not apply.
type gap struct {
	id, typ, key string
	value        any
}

// machine is a state machine to create: every field may hold outputRefs.
type machine struct {
	id            string
	condition     string
	definition    any // DefinitionString (a string) or Definition (a JSON tree)
	substitutions map[string]any
	typ           any
}

// outputRef stands for the value of a stack output, in a property value
// that CloudFormation evaluated for Provision.
type outputRef string

func (p *provisioner) run(ctx context.Context, tpl map[string]any) error {
	if err := p.plan(tpl); err != nil {
		return err
	}
	if err := p.createStack(ctx); err != nil {
		return err
	}
	for _, g := range p.gaps {
		if err := p.applyGap(ctx, g); err != nil {
			return fmt.Errorf("%s (%s) %s: %w", g.id, g.typ, g.key, err)
		}
	}
	for _, m := range p.machines {
		if err := p.createStateMachine(ctx, m); err != nil {
			return fmt.Errorf("%s (%s): %w", m.id, typeCFNStateMachine, err)
		}
	}
	return p.assignRoles(ctx)
}

// plan builds the stack template from the translation: the tables, queues
// and buckets with their references to left-out resources replaced, the
// gaps and state machines to apply afterwards, and the outputs that
// evaluate their values.
func (p *provisioner) plan(tpl map[string]any) error {
	resources, ok := tpl["Resources"].(map[string]any)
	if !ok {
		return errors.New("the translation has no Resources")
	}
	types := map[string]string{}
	for id, raw := range resources {
		res, _ := raw.(map[string]any)
		types[id], _ = res["Type"].(string)
	}
	p.kept = map[string]string{}
	for id, typ := range types {
		switch typ {
		case typeTable, typeQueue, typeBucket:
			p.kept[id] = typ
		}
	}
	stackResources := map[string]any{}
	for _, id := range slices.Sorted(maps.Keys(resources)) {
		typ := types[id]
		if _, ok := p.kept[id]; !ok && typ != typeCFNStateMachine {
			continue
		}
		if typ == typeBucket {
			// Notifications target functions moto cannot run; localrun
			// watches the bucket instead.
			if props, ok := resources[id].(map[string]any)["Properties"].(map[string]any); ok {
				delete(props, "NotificationConfiguration")
			}
		}
		v, err := p.placeholders(resources[id], types)
		if err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		res := v.(map[string]any)
		props, _ := res["Properties"].(map[string]any)
		condition, _ := res["Condition"].(string)
		if typ == typeCFNStateMachine {
			if err := p.planMachine(id, condition, props); err != nil {
				return fmt.Errorf("%s: %w", id, err)
			}
			continue
		}
		if deps := dependsOn(res["DependsOn"]); deps != nil {
			var keep []any
			for _, d := range deps {
				if _, ok := p.kept[d]; ok {
					keep = append(keep, d)
				}
			}
			if keep == nil {
				delete(res, "DependsOn")
			} else {
				res["DependsOn"] = keep
			}
		}
		for _, key := range propertyGaps[typ] {
			if v, ok := props[key]; ok {
				p.gaps = append(p.gaps, gap{id: id, typ: typ, key: key, value: p.deferIntrinsics(v, condition)})
			}
		}
		stackResources[id] = res
	}
	p.stack = map[string]any{
		"AWSTemplateFormatVersion": "2010-09-09",
		"Resources":                stackResources,
		"Outputs":                  p.outputs,
	}
	for _, k := range []string{"Parameters", "Conditions", "Mappings"} {
		if v, ok := tpl[k]; ok {
			p.stack[k] = v
		}
	}
	if len(stackResources) == 0 {
		return errors.New("the template declares no table, queue or bucket")
	}
	return nil
}

func (p *provisioner) planMachine(id, condition string, props map[string]any) error {
	m := machine{id: id, condition: condition}
	switch {
	case props["DefinitionString"] != nil:
		m.definition = p.deferIntrinsics(props["DefinitionString"], condition)
	case props["Definition"] != nil:
		m.definition = p.deferIntrinsics(props["Definition"], condition)
	default:
		return errors.New("no Definition or DefinitionString")
	}
	if subs, ok := props["DefinitionSubstitutions"].(map[string]any); ok {
		m.substitutions = map[string]any{}
		for k, v := range subs {
			m.substitutions[k] = p.deferIntrinsics(v, condition)
		}
	}
	if t, ok := props["StateMachineType"]; ok {
		m.typ = p.deferIntrinsics(t, condition)
	}
	p.machines = append(p.machines, m)
	return nil
}

// dependsOn returns a DependsOn value as a list of logical IDs.
func dependsOn(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, d := range x {
			if s, ok := d.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// isIntrinsic reports whether v is an intrinsic function call.
func isIntrinsic(v map[string]any) (string, bool) {
	if len(v) != 1 {
		return "", false
	}
	for k := range v {
		if k == "Ref" || k == "Condition" || strings.HasPrefix(k, "Fn::") {
			return k, true
		}
	}
	return "", false
}

// placeholders replaces the references to resources Provision leaves out
// (functions, roles) by the names and ARNs that stand in for them.
func (p *provisioner) placeholders(v any, types map[string]string) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		if fn, ok := isIntrinsic(x); ok {
			switch fn {
			case "Ref":
				id, _ := x["Ref"].(string)
				if typ, ok := types[id]; ok && p.left(id, typ) {
					return p.standIn(id, typ, "")
				}
			case "Fn::GetAtt":
				var id, attr string
				switch a := x["Fn::GetAtt"].(type) {
				case []any:
					if len(a) == 2 {
						id, _ = a[0].(string)
						attr, _ = a[1].(string)
					}
				case string:
					id, attr, _ = strings.Cut(a, ".")
				}
				if typ, ok := types[id]; ok && p.left(id, typ) {
					return p.standIn(id, typ, attr)
				}
			}
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			r, err := p.placeholders(e, types)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			r, err := p.placeholders(e, types)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return v, nil
}

// left reports whether a resource is left out of the stack.
func (p *provisioner) left(id, typ string) bool {
	_, kept := p.kept[id]
	return !kept && typ != typeCFNStateMachine
}

// standIn is the Ref (attr "") or Fn::GetAtt value of a left-out resource.
func (p *provisioner) standIn(id, typ, attr string) (any, error) {
	name := p.prefix + "-" + strings.ToLower(id)
	switch {
	case typ == typeCFNFunction && attr == "":
		return name, nil
	case typ == typeCFNFunction && attr == "Arn":
		arn, ok := p.opts.functionARNs[id]
		if !ok {
			arn = fmt.Sprintf("arn:aws:lambda:%s:%s:function:%s", p.region, AccountID, name)
		}
		p.res.FunctionARNs[id] = arn
		return arn, nil
	case typ == typeRole && attr == "":
		return name, nil
	case typ == typeRole && attr == "Arn":
		return fmt.Sprintf("arn:aws:iam::%s:role/%s", AccountID, name), nil
	case typ == typeLogGroup && attr == "":
		return name, nil
	case typ == typeLogGroup && attr == "Arn":
		// The state machine's Logging destination; Provision does not
		// apply Logging, so the group need not exist.
		return fmt.Sprintf("arn:aws:logs:%s:%s:log-group:%s:*", p.region, AccountID, name), nil
	}
	if attr != "" {
		id += "." + attr
	}
	return nil, fmt.Errorf("refers to %s (%s), which samstack does not provision", id, typ)
}

// deferIntrinsics returns v with each intrinsic function replaced by an
// outputRef to a new stack output that evaluates it, so that the emulator's
// CloudFormation resolves every value Provision applies itself.
func (p *provisioner) deferIntrinsics(v any, condition string) any {
	switch x := v.(type) {
	case map[string]any:
		if _, ok := isIntrinsic(x); ok {
			name := fmt.Sprintf("AwsemuValue%d", len(p.outputs)+1)
			out := map[string]any{"Value": x}
			if condition != "" {
				out["Condition"] = condition
			}
			p.outputs[name] = out
			return outputRef(name)
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = p.deferIntrinsics(e, condition)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = p.deferIntrinsics(e, condition)
		}
		return out
	}
	return v
}

// resolve replaces the outputRefs in v by the outputs' values. ok is false
// when an output is missing: its condition was false.
func (p *provisioner) resolve(v any) (any, bool) {
	switch x := v.(type) {
	case outputRef:
		s, ok := p.outputValues[string(x)]
		return s, ok
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			r, ok := p.resolve(e)
			if !ok {
				return nil, false
			}
			out[k] = r
		}
		return out, true
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			r, ok := p.resolve(e)
			if !ok {
				return nil, false
			}
			out[i] = r
		}
		return out, true
	}
	return v, true
}

// createStack creates the stack and waits for it, then reads what it made.
// provisionTag is the stack tag that holds the token of the CreateStack
// that made it.
const provisionTag = "batchgen:provision"

// madeBy reports whether err is CreateStack's AlreadyExists for the stack
// the same request (token) made: a re-sent request whose first answer was
// lost.
func (p *provisioner) madeBy(ctx context.Context, err error, token string) bool {
	var exists *cfntypes.AlreadyExistsException
	if !errors.As(err, &exists) {
		return false
	}
	out, derr := p.cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: aws.String(p.prefix)})
	if derr != nil || len(out.Stacks) == 0 {
		return false
	}
	for _, t := range out.Stacks[0].Tags {
		if aws.ToString(t.Key) == provisionTag && aws.ToString(t.Value) == token {
			return true
		}
	}
	return false
}

func (p *provisioner) createStack(ctx context.Context) error {
	body, err := json.Marshal(p.stack)
	if err != nil {
		return fmt.Errorf("stack template: %w", err)
	}
	// The SDK re-sends a CreateStack whose answer was lost (an emulator
	// too busy to answer within EmulatorRequestTimeout), and the re-sent
	// one finds the stack the first made: AlreadyExists. The token, sent
	// as CloudFormation's idempotency token and as a tag, tells that stack
	// from one an earlier run left under the same name.
	token := rand.Text()
	in := &cloudformation.CreateStackInput{
		StackName:          aws.String(p.prefix),
		TemplateBody:       aws.String(string(body)),
		ClientRequestToken: aws.String(token),
		Tags:               []cfntypes.Tag{{Key: aws.String(provisionTag), Value: aws.String(token)}},
	}
	for _, k := range slices.Sorted(maps.Keys(p.opts.params)) {
		in.Parameters = append(in.Parameters, cfntypes.Parameter{ParameterKey: aws.String(k), ParameterValue: aws.String(p.opts.params[k])})
	}
	if _, err := p.cfn.CreateStack(ctx, in); err != nil && !p.madeBy(ctx, err, token) {
		return fmt.Errorf("create stack %s: %w", p.prefix, err)
	}
	p.record(typeStack, p.prefix)
	stack, err := p.waitStack(ctx)
	if err != nil {
		return err
	}
	p.outputValues = map[string]string{}
	for _, o := range stack.Outputs {
		p.outputValues[aws.ToString(o.OutputKey)] = aws.ToString(o.OutputValue)
	}
	pages := cloudformation.NewListStackResourcesPaginator(p.cfn, &cloudformation.ListStackResourcesInput{StackName: aws.String(p.prefix)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list the resources of stack %s: %w", p.prefix, err)
		}
		for _, s := range page.StackResourceSummaries {
			id, physical := aws.ToString(s.LogicalResourceId), aws.ToString(s.PhysicalResourceId)
			switch aws.ToString(s.ResourceType) {
			case typeQueue:
				// The stack reports the queue URL on AWS's host; ask the
				// emulator for the one its clients use.
				name := physical[strings.LastIndex(physical, "/")+1:]
				out, err := p.sqs.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
				if err != nil {
					return fmt.Errorf("queue %s of stack %s: %w", id, p.prefix, err)
				}
				physical = aws.ToString(out.QueueUrl)
			case typeBucket:
				p.record(typeBucketObjects, physical)
			}
			p.res.Physical[id] = physical
		}
	}
	return nil
}

// waitStack polls the stack until its creation ends; an error names the
// resources that failed and why.
func (p *provisioner) waitStack(ctx context.Context) (*cfntypes.Stack, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := p.cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: aws.String(p.prefix)})
		if err != nil {
			return nil, fmt.Errorf("describe stack %s: %w", p.prefix, err)
		}
		if len(out.Stacks) != 1 {
			return nil, fmt.Errorf("describe stack %s: %d stacks", p.prefix, len(out.Stacks))
		}
		st := out.Stacks[0]
		switch st.StackStatus {
		case cfntypes.StackStatusCreateComplete:
			return &st, nil
		case cfntypes.StackStatusCreateInProgress:
		default:
			return nil, fmt.Errorf("stack %s: %s: %s%s", p.prefix, st.StackStatus, aws.ToString(st.StackStatusReason), p.failures(ctx))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("stack %s still %s after 2 minutes", p.prefix, st.StackStatus)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// failures describes the stack's failed resources, for an error message.
func (p *provisioner) failures(ctx context.Context) string {
	out, err := p.cfn.DescribeStackEvents(ctx, &cloudformation.DescribeStackEventsInput{StackName: aws.String(p.prefix)})
	if err != nil {
		return ""
	}
	var msgs []string
	for _, e := range out.StackEvents {
		if strings.HasSuffix(string(e.ResourceStatus), "FAILED") && aws.ToString(e.LogicalResourceId) != p.prefix {
			msgs = append(msgs, aws.ToString(e.LogicalResourceId)+": "+aws.ToString(e.ResourceStatusReason))
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	return "; " + strings.Join(msgs, "; ")
}

// record notes a created resource for Cleanup at once, so a failure later in
// the same resource's setup still deletes it.
func (p *provisioner) record(typ, physicalID string) {
	p.res.mu.Lock()
	defer p.res.mu.Unlock()
	p.res.created = append(p.res.created, created{typ: typ, physical: physicalID})
}

// applyGap applies a property moto's CloudFormation left out.
func (p *provisioner) applyGap(ctx context.Context, g gap) error {
	v, ok := p.resolve(g.value)
	if !ok {
		return nil // the resource's condition is false
	}
	name := p.res.Physical[g.id]
	if name == "" {
		return nil // not created: its condition is false
	}
	switch g.key {
	case "TimeToLiveSpecification":
		ttl, err := asMap(v)
		if err != nil {
			return err
		}
		attr, err := reqString(ttl, "AttributeName")
		if err != nil {
			return err
		}
		enabled, err := toBool(ttl["Enabled"])
		if err != nil || !enabled {
			return err
		}
		_, err = p.ddb.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
			TableName:               aws.String(name),
			TimeToLiveSpecification: &ddbtypes.TimeToLiveSpecification{AttributeName: aws.String(attr), Enabled: aws.Bool(true)},
		})
		return err
	case "PointInTimeRecoverySpecification":
		pitr, err := asMap(v)
		if err != nil {
			return err
		}
		enabled, err := toBool(pitr["PointInTimeRecoveryEnabled"])
		if err != nil || !enabled {
			return err
		}
		_, err = p.ddb.UpdateContinuousBackups(ctx, &dynamodb.UpdateContinuousBackupsInput{
			TableName:                        aws.String(name),
			PointInTimeRecoverySpecification: &ddbtypes.PointInTimeRecoverySpecification{PointInTimeRecoveryEnabled: aws.Bool(true)},
		})
		return err
	case "PublicAccessBlockConfiguration":
		cfg, err := publicAccessBlock(v)
		if err != nil {
			return err
		}
		_, err = p.s3.PutPublicAccessBlock(ctx, &s3.PutPublicAccessBlockInput{Bucket: aws.String(name), PublicAccessBlockConfiguration: cfg})
		return err
	case "BucketEncryption":
		cfg, err := bucketEncryption(v)
		if err != nil {
			return err
		}
		_, err = p.s3.PutBucketEncryption(ctx, &s3.PutBucketEncryptionInput{Bucket: aws.String(name), ServerSideEncryptionConfiguration: cfg})
		return err
	case "LifecycleConfiguration":
		rules, err := lifecycleRules(v)
		if err != nil {
			return err
		}
		_, err = p.s3.PutBucketLifecycleConfiguration(ctx, &s3.PutBucketLifecycleConfigurationInput{
			Bucket:                 aws.String(name),
			LifecycleConfiguration: &s3types.BucketLifecycleConfiguration{Rules: rules},
		})
		return err
	}
	return fmt.Errorf("no workaround for %s", g.key)
}

// createStateMachine creates a machine from the values the stack evaluated.
func (p *provisioner) createStateMachine(ctx context.Context, m machine) error {
	v, ok := p.resolve(m.definition)
	if !ok {
		return nil // its condition is false
	}
	def, isString := v.(string)
	if !isString {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode the Definition as JSON: %w", err)
		}
		def = string(b)
	}
	subs := map[string]string{}
	for k, raw := range m.substitutions {
		v, ok := p.resolve(raw)
		if !ok {
			return nil
		}
		s, err := scalarString(v)
		if err != nil {
			return fmt.Errorf("DefinitionSubstitutions.%s: %w", k, err)
		}
		subs[k] = s
	}
	def, err := substitute(def, subs)
	if err != nil {
		return err
	}
	if !json.Valid([]byte(def)) {
		return errors.New("definition is not valid JSON after substitution")
	}
	typ := string(sfntypes.StateMachineTypeStandard)
	if m.typ != nil {
		v, _ := p.resolve(m.typ)
		if s, _ := v.(string); s != "" {
			typ = s
		}
	}
	name := p.prefix + "-" + strings.ToLower(m.id)
	if len(name) > 80 {
		return fmt.Errorf("name %q is longer than 80 characters; use a shorter prefix", name)
	}
	out, err := p.sfn.CreateStateMachine(ctx, &sfn.CreateStateMachineInput{
		Name:       aws.String(name),
		Definition: aws.String(def),
		RoleArn:    aws.String(fmt.Sprintf("arn:aws:iam::%s:role/%s", AccountID, name)),
		Type:       sfntypes.StateMachineType(typ),
	})
	if err != nil {
		return fmt.Errorf("create state machine %s: %w", name, err)
	}
	arn := aws.ToString(out.StateMachineArn)
	p.record(typeCFNStateMachine, arn)
	p.res.Physical[m.id] = arn
	return nil
}

// assignRoles fills the named fields of Resources.
func (p *provisioner) assignRoles(ctx context.Context) error {
	var tables, buckets, machines []string
	type queue struct{ url, arn, dlqARN string }
	var workQueues []queue
	queueByARN := map[string]queue{}
	for _, id := range slices.Sorted(maps.Keys(p.res.Physical)) {
		ref := p.res.Physical[id]
		switch p.kept[id] {
		case typeTable:
			tables = append(tables, ref)
		case typeBucket:
			buckets = append(buckets, ref)
		case typeQueue:
			out, err := p.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
				QueueUrl:       aws.String(ref),
				AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn, sqstypes.QueueAttributeNameRedrivePolicy},
			})
			if err != nil {
				return fmt.Errorf("queue %s: %w", id, err)
			}
			q := queue{url: ref, arn: out.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]}
			if rp := out.Attributes[string(sqstypes.QueueAttributeNameRedrivePolicy)]; rp != "" {
				var policy struct {
					DeadLetterTargetArn string `json:"deadLetterTargetArn"`
				}
				if err := json.Unmarshal([]byte(rp), &policy); err != nil || policy.DeadLetterTargetArn == "" {
					return fmt.Errorf("queue %s: RedrivePolicy %s names no deadLetterTargetArn", id, rp)
				}
				q.dlqARN = policy.DeadLetterTargetArn
				workQueues = append(workQueues, q)
			}
			queueByARN[q.arn] = q
		default:
			machines = append(machines, ref)
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
		r.QueueURL, r.QueueARN = q.url, q.arn
		dlq, ok := queueByARN[q.dlqARN]
		if !ok {
			return fmt.Errorf("work queue %s dead-letters to %s, which the template does not declare", q.url, q.dlqARN)
		}
		r.DLQURL, r.DLQARN = dlq.url, dlq.arn
	}
	return nil
}

// ---------------------------------------------------------------- S3 properties

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
	items, err := reqList(m, "Rules")
	if err != nil {
		return nil, err
	}
	var rules []s3types.LifecycleRule
	for i, raw := range items {
		// The property path names the rule in errors, as the
		// template spells it.
		path := fmt.Sprintf("Rules[%d]", i)
		rm, err := asMap(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		status, err := reqString(rm, "Status")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		id, err1 := optString(rm, "Id")
		prefix, err2 := optString(rm, "Prefix")
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
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
				return nil, fmt.Errorf("%s.ExpirationInDays: %w", path, err)
			}
			rule.Expiration = &s3types.LifecycleExpiration{Days: aws.Int32(int32(days))}
		}
		if a, ok := rm["AbortIncompleteMultipartUpload"]; ok {
			am, err := asMap(a)
			if err != nil {
				return nil, fmt.Errorf("%s.AbortIncompleteMultipartUpload: %w", path, err)
			}
			days, err := toInt(am["DaysAfterInitiation"])
			if err != nil {
				return nil, fmt.Errorf("%s.AbortIncompleteMultipartUpload.DaysAfterInitiation: %w", path, err)
			}
			rule.AbortIncompleteMultipartUpload = &s3types.AbortIncompleteMultipartUpload{DaysAfterInitiation: aws.Int32(int32(days))}
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// subVar matches ${Name}, ${Resource.Attr} and the escape ${!Literal}.
var subVar = regexp.MustCompile(`\$\{([^}]*)\}`)

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

// Types of the resources Track accepts.
const (
	TypeQueue        = typeQueue
	TypeStateMachine = typeCFNStateMachine
)

// Track makes Cleanup delete a resource created beside the stack (a queue
// by URL, a state machine by ARN), such as a test harness's own.
func (r *Resources) Track(resourceType, physicalID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created = append(r.created, created{typ: resourceType, physical: physicalID})
}

// Cleanup deletes everything Provision created, newest first: state
// machines, the buckets' objects (every version and unfinished upload),
// then the stack, whose deletion removes its tables, queues and buckets.
// Resources already gone count as deleted, so Cleanup may be called again
// after a partial failure; it returns every error it met.
func (r *Resources) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var (
		errs []error
		kept []created
	)
	cf := cloudformation.NewFromConfig(r.cfg)
	sq := sqs.NewFromConfig(r.cfg)
	s3c := newS3(r.cfg)
	sf := sfn.NewFromConfig(r.cfg)
	for i := len(r.created) - 1; i >= 0; i-- {
		c := r.created[i]
		var err error
		switch c.typ {
		case typeStack:
			err = deleteStack(ctx, cf, c.physical)
		case typeBucketObjects:
			err = emptyBucket(ctx, s3c, c.physical)
		case typeQueue:
			_, err = sq.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(c.physical)})
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

// deleteStack deletes a stack and waits until it is gone.
func deleteStack(ctx context.Context, c *cloudformation.Client, name string) error {
	if _, err := c.DeleteStack(ctx, &cloudformation.DeleteStackInput{StackName: aws.String(name)}); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := c.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: aws.String(name)})
		if err != nil || len(out.Stacks) == 0 {
			return nil // deleted stacks are not found by name
		}
		switch st := out.Stacks[0]; st.StackStatus {
		case cfntypes.StackStatusDeleteComplete:
			return nil
		case cfntypes.StackStatusDeleteFailed:
			return fmt.Errorf("%s: %s", st.StackStatus, aws.ToString(st.StackStatusReason))
		}
		if time.Now().After(deadline) {
			return errors.New("still being deleted after 2 minutes")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// emptyBucket deletes every object version, delete marker and unfinished
// multipart upload of a bucket, so that its stack can delete it.
func emptyBucket(ctx context.Context, c *s3.Client, bucket string) error {
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

// reqList returns m[key] as a list; a missing key is an error.
func reqList(m map[string]any, key string) ([]any, error) {
	v, ok := m[key]
	if !ok {
		return nil, fmt.Errorf("%s is missing", key)
	}
	out, err := asList(v)
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

// scalarString renders a resolved scalar the way CloudFormation would
// substitute it into a string.
func scalarString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case int:
		return strconv.Itoa(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case bool:
		return strconv.FormatBool(x), nil
	default:
		return "", fmt.Errorf("value %v (%T) is not a scalar", v, v)
	}
}

// toInt converts a resolved scalar (CloudFormation allows "5" and 5) to an int64.
func toInt(v any) (int64, error) {
	switch x := v.(type) {
	case int:
		return int64(x), nil
	case int64:
		return x, nil
	case float64:
		if x != float64(int64(x)) {
			return 0, fmt.Errorf("%v is not an integer", x)
		}
		return int64(x), nil
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not an integer", x)
		}
		return n, nil
	default:
		return 0, fmt.Errorf("%v (%T) is not an integer", v, v)
	}
}

// toBool converts a resolved scalar (true or "true") to a bool.
func toBool(v any) (bool, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case string:
		b, err := strconv.ParseBool(x)
		if err != nil {
			return false, fmt.Errorf("%q is not a boolean", x)
		}
		return b, nil
	default:
		return false, fmt.Errorf("%v (%T) is not a boolean", v, v)
	}
}
