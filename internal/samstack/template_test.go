package samstack

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

// symbolic resolves resource references to readable tokens, so template
// tests can check what refers to what without an emulator.
type symbolic struct{}

func (symbolic) ref(id string) (any, error)          { return "ref:" + id, nil }
func (symbolic) getAtt(id, attr string) (any, error) { return "att:" + id + "." + attr, nil }

var testPseudo = map[string]any{
	"AWS::Region":    "us-east-1",
	"AWS::AccountId": AccountID,
	"AWS::Partition": "aws",
	"AWS::URLSuffix": "amazonaws.com",
	"AWS::StackName": "stack",
	"AWS::NoValue":   noValue{},
}

const evalTemplate = `
Parameters:
  Stage: {Type: String, Default: dev}
  Size: {Type: Number, Default: 5}
  NoDefault: {Type: String}
  Names: {Type: CommaDelimitedList, Default: "a, b,c"}
Conditions:
  IsDev: !Equals [!Ref Stage, dev]
  IsProd: !Not [!Condition IsDev]
  Both: !And [!Condition IsDev, !Equals [!Ref Size, 5]]
  Either: !Or [!Condition IsProd, !Equals ["5", !Ref Size]]
  Loop: !Condition Loop
Resources:
  Table: {Type: AWS::DynamoDB::Table}
`

func TestEval(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		expr      string
		overrides map[string]string
		want      any
		wantErr   string
	}{
		{name: "ref parameter default", expr: `!Ref Stage`, want: "dev"},
		{name: "ref parameter override", expr: `!Ref Stage`, overrides: map[string]string{"Stage": "prod"}, want: "prod"},
		{name: "ref number parameter", expr: `!Ref Size`, want: 5},
		{name: "ref list parameter", expr: `!Ref Names`, want: []any{"a", "b", "c"}},
		{name: "ref pseudo parameter", expr: `{Ref: AWS::Region}`, want: "us-east-1"},
		{name: "ref resource", expr: `!Ref Table`, want: "ref:Table"},
		{name: "getatt short form", expr: `!GetAtt Table.Arn`, want: "att:Table.Arn"},
		{name: "getatt list form", expr: `{"Fn::GetAtt": [Table, StreamArn]}`, want: "att:Table.StreamArn"},
		{
			name: "sub with parameters, pseudo parameters, attributes and escapes",
			expr: `!Sub "${AWS::StackName}-${Stage}/${Table.Arn}/${!Literal}-${Size}"`,
			want: "stack-dev/att:Table.Arn/${Literal}-5",
		},
		{name: "sub with variables", expr: `!Sub ["${A}-${Stage}", {A: !Ref Table}]`, want: "ref:Table-dev"},
		{name: "if true", expr: `!If [IsDev, yes, no]`, want: "yes"},
		{name: "if false", expr: `!If [IsProd, yes, no]`, want: "no"},
		{name: "if override flips condition", expr: `!If [IsDev, yes, no]`, overrides: map[string]string{"Stage": "prod"}, want: "no"},
		{name: "and", expr: `!If [Both, yes, no]`, want: "yes"},
		{name: "or compares numbers as strings", expr: `!If [Either, yes, no]`, want: "yes"},
		{
			name: "novalue dropped from lists and maps",
			expr: `{a: [1, !Ref AWS::NoValue, 2], b: !Ref AWS::NoValue, c: !If [IsProd, x, !Ref AWS::NoValue]}`,
			want: map[string]any{"a": []any{1, 2}},
		},
		{name: "join", expr: `!Join ["-", [a, !Ref Stage, !Ref Size]]`, want: "a-dev-5"},
		{name: "select", expr: `!Select [1, !Ref Names]`, want: "b"},
		{name: "split", expr: `!Split [",", "x,y"]`, want: []any{"x", "y"}},
		{name: "nested maps keep plain keys", expr: `{Condition: {Bool: {"aws:SecureTransport": "false"}}}`, want: map[string]any{"Condition": map[string]any{"Bool": map[string]any{"aws:SecureTransport": "false"}}}},
		{name: "unknown reference", expr: `!Ref Nope`, wantErr: "Ref Nope: no such parameter or resource"},
		{name: "parameter without default", expr: `!Ref NoDefault`, wantErr: "parameter has no Default"},
		{name: "unknown pseudo parameter", expr: `!Ref AWS::Nope`, wantErr: "unknown pseudo parameter"},
		{name: "unsupported function", expr: `!FindInMap [M, K, V]`, wantErr: "Fn::FindInMap: intrinsic function not supported"},
		{name: "undefined condition", expr: `!If [Nope, a, b]`, wantErr: "condition Nope: not defined"},
		{name: "self-referencing condition is false", expr: `!If [Loop, a, b]`, want: "b"},
		{name: "getatt on unknown resource", expr: `!GetAtt Nope.Arn`, wantErr: "no resource Nope"},
		{name: "sub with unknown name", expr: `!Sub "${Nope}"`, wantErr: "Fn::Sub ${Nope}"},
		{name: "select out of range", expr: `!Select [5, [a]]`, wantErr: "out of range"},
		{name: "override of undeclared parameter", expr: `x`, overrides: map[string]string{"Nope": "1"}, wantErr: "no such parameter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tpl, err := parseTemplate([]byte(evalTemplate))
			if err != nil {
				t.Fatalf("parse template: %v", err)
			}
			expr := parseExpr(t, tc.expr)
			ev, err := newEvaluator(tpl, tc.overrides, testPseudo, symbolic{})
			var got any
			if err == nil {
				got, err = ev.eval(expr)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("eval(%s) error = %v, want it to contain %q (value %v)", tc.expr, err, tc.wantErr, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("eval(%s): %v", tc.expr, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("eval(%s) mismatch (-want +got):\n%s", tc.expr, diff)
			}
		})
	}
}

func parseExpr(t *testing.T, text string) any {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(text), &n); err != nil {
		t.Fatalf("parse %q: %v", text, err)
	}
	v, err := fromNode(&n)
	if err != nil {
		t.Fatalf("convert %q: %v", text, err)
	}
	return v
}

func TestParseTemplateErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		text    string
		wantErr string
	}{
		{name: "not yaml", text: "Resources: [", wantErr: "parse"},
		{name: "top level list", text: "- a", wantErr: "top level is not a mapping"},
		{name: "no resources", text: "Parameters: {}", wantErr: "Resources is missing"},
		{name: "resource without type", text: "Resources: {A: {Properties: {}}}", wantErr: "resource A has no Type"},
		{name: "getatt without attribute", text: "Resources: {A: {Type: T, Properties: {X: !GetAtt A}}}", wantErr: "is not Resource.Attribute"},
		{name: "duplicate key", text: "Resources:\n  A: {Type: T}\n  A: {Type: T}\n", wantErr: `duplicate key "A"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseTemplate([]byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseTemplate error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestSubstitute(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		def     string
		subs    map[string]string
		want    string
		wantErr string
	}{
		{name: "all defined", def: `{"a": "${A}", "b": "${B}${A}"}`, subs: map[string]string{"A": "1", "B": "2"}, want: `{"a": "1", "b": "21"}`},
		{name: "unused substitution is fine", def: `{}`, subs: map[string]string{"A": "1"}, want: `{}`},
		{name: "undefined placeholder", def: `{"a": "${A}", "b": "${B}"}`, subs: map[string]string{"A": "1"}, wantErr: "${B}"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := substitute(tc.def, tc.subs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("substitute error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("substitute: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("substitute mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// repoTemplate is the deployment template these tests pin to the contract the
// Go code is written against.
const repoTemplate = "../../template.yaml"

// contractTemplate loads template.yaml with a symbolic resolver.
func contractTemplate(t *testing.T) (*template, *evaluator) {
	t.Helper()
	tpl, err := loadTemplate(repoTemplate)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := newEvaluator(tpl, nil, testPseudo, symbolic{})
	if err != nil {
		t.Fatal(err)
	}
	return tpl, ev
}

// evalPath resolves a resource property by path through maps.
func evalPath(t *testing.T, tpl *template, ev *evaluator, id string, path ...string) any {
	t.Helper()
	res, ok := tpl.resources[id]
	if !ok {
		t.Fatalf("template has no resource %s", id)
	}
	var v any = res.properties
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s.%s: parent is %T", id, strings.Join(path, "."), v)
		}
		v = m[p]
	}
	out, err := ev.eval(v)
	if err != nil {
		t.Fatalf("%s.%s: %v", id, strings.Join(path, "."), err)
	}
	return out
}

// functionProps returns a function's properties with the SAM Globals merged
// in, as the SAM transform does (environment variables merge key by key).
func functionProps(t *testing.T, tpl *template, ev *evaluator, id string) map[string]any {
	t.Helper()
	res, ok := tpl.resources[id]
	if !ok || res.typ != typeSAMFunction {
		t.Fatalf("template has no AWS::Serverless::Function %s", id)
	}
	merged := map[string]any{}
	if g, ok := tpl.globals["Function"].(map[string]any); ok {
		for k, v := range g {
			merged[k] = v
		}
	}
	for k, v := range res.properties {
		if k == "Environment" {
			vars := map[string]any{}
			for _, src := range []any{merged["Environment"], v} {
				if env, ok := src.(map[string]any); ok {
					if vv, ok := env["Variables"].(map[string]any); ok {
						for name, val := range vv {
							vars[name] = val
						}
					}
				}
			}
			v = map[string]any{"Variables": vars}
		}
		merged[k] = v
	}
	out, err := ev.eval(merged)
	if err != nil {
		t.Fatalf("function %s: %v", id, err)
	}
	return out.(map[string]any)
}

func mustInt(t *testing.T, v any) int64 {
	t.Helper()
	n, err := toInt(v)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// functions maps the contract's function names to their logical IDs.
var functions = map[string]string{
	"splitter":  "SplitterFunction",
	"generator": "GeneratorFunction",
	"exporter":  "ExporterFunction",
	"api":       "ApiFunction",
	"sweeper":   "SweeperFunction",
}

func TestTemplateTable(t *testing.T) {
	t.Parallel()
	tpl, ev := contractTemplate(t)
	props := evalPath(t, tpl, ev, "Table").(map[string]any)
	type gsi struct{ Hash, Range, Projection string }
	type table struct {
		Billing    string
		Attributes map[string]string
		Keys       []string
		GSIs       map[string]gsi
		TTL        string
		PITR, SSE  bool
	}
	got := table{Attributes: map[string]string{}, GSIs: map[string]gsi{}}
	got.Billing, _ = props["BillingMode"].(string)
	defs, err := attributeDefinitions(props["AttributeDefinitions"])
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range defs {
		got.Attributes[*d.AttributeName] = string(d.AttributeType)
	}
	keys, err := keySchema(props["KeySchema"])
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		got.Keys = append(got.Keys, *k.AttributeName+" "+string(k.KeyType))
	}
	for _, raw := range props["GlobalSecondaryIndexes"].([]any) {
		g, err := parseGSI(raw)
		if err != nil {
			t.Fatal(err)
		}
		got.GSIs[*g.IndexName] = gsi{
			Hash:       *g.KeySchema[0].AttributeName,
			Range:      *g.KeySchema[1].AttributeName,
			Projection: string(g.Projection.ProjectionType),
		}
	}
	got.TTL, _ = props["TimeToLiveSpecification"].(map[string]any)["AttributeName"].(string)
	got.PITR, _ = props["PointInTimeRecoverySpecification"].(map[string]any)["PointInTimeRecoveryEnabled"].(bool)
	got.SSE, _ = props["SSESpecification"].(map[string]any)["SSEEnabled"].(bool)

	want := table{
		Billing:    "PAY_PER_REQUEST",
		Attributes: map[string]string{"PK": "S", "SK": "S", "open_pk": "S", "open_sk": "S", "list_pk": "S", "created_at": "S", "task_owner": "S", "owner_sk": "S"},
		Keys:       []string{"PK HASH", "SK RANGE"},
		GSIs: map[string]gsi{
			"open-batches":   {Hash: "open_pk", Range: "open_sk", Projection: "ALL"},
			"tasks-by-time":  {Hash: "list_pk", Range: "created_at", Projection: "ALL"},
			"tasks-by-owner": {Hash: "task_owner", Range: "owner_sk", Projection: "ALL"},
		},
		TTL:  "expires_at",
		PITR: true,
		SSE:  true,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Table mismatch with the store contract (-want +got):\n%s", diff)
	}
}

func TestTemplateQueues(t *testing.T) {
	t.Parallel()
	tpl, ev := contractTemplate(t)
	gen := functionProps(t, tpl, ev, functions["generator"])
	genTimeout := mustInt(t, gen["Timeout"])
	visibility := mustInt(t, evalPath(t, tpl, ev, "WorkQueue", "VisibilityTimeout"))
	if visibility < 6*genTimeout {
		t.Errorf("WorkQueue VisibilityTimeout = %d, want >= 6 x generator Timeout %d", visibility, genTimeout)
	}
	lease := mustInt(t, tpl.parameters["LeaseSeconds"].def)
	if lease <= genTimeout {
		t.Errorf("LeaseSeconds default = %d, want > generator Timeout %d so a live worker keeps its batch", lease, genTimeout)
	}
	redrive := evalPath(t, tpl, ev, "WorkQueue", "RedrivePolicy").(map[string]any)
	got := map[string]any{
		"target":          redrive["deadLetterTargetArn"],
		"maxReceiveCount": mustInt(t, redrive["maxReceiveCount"]),
		"dlqRetention":    mustInt(t, evalPath(t, tpl, ev, "DeadLetterQueue", "MessageRetentionPeriod")),
	}
	want := map[string]any{
		"target":          "att:DeadLetterQueue.Arn",
		"maxReceiveCount": int64(5),
		"dlqRetention":    int64(14 * 24 * 3600),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("queues mismatch (-want +got):\n%s", diff)
	}
}

func TestTemplateFunctions(t *testing.T) {
	t.Parallel()
	tpl, ev := contractTemplate(t)
	common := []string{
		"BATCH_SIZE", "BEDROCK_INFERENCE_PROFILE", "BUCKET_NAME", "DEFAULT_COLUMNS", "DEFAULT_PROMPT", "DEFAULT_ROWS_PER_CALL", "DLQ_URL", "DROP_OWNER", "DROP_RESULT_FORMAT", "LEASE_SECONDS", "LOG_LEVEL", "MAX_CONCURRENCY", "MAX_INPUT_BYTES", "MAX_ROWS",
		"MODEL_API_KEY_PARAM", "MODEL_BASE_URL", "MODEL_NAME", "MODEL_PROVIDER", "QUEUE_URL",
		"QUOTA_RPM", "QUOTA_TPM", "STACK_NAME", "TABLE_NAME",
	}
	for name, id := range functions {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			props := functionProps(t, tpl, ev, id)
			type fn struct {
				CodeUri, Runtime, Handler, BuildMethod string
				Architectures                          []any
				Env                                    []string
			}
			got := fn{Architectures: props["Architectures"].([]any)}
			got.CodeUri, _ = props["CodeUri"].(string)
			got.Runtime, _ = props["Runtime"].(string)
			got.Handler, _ = props["Handler"].(string)
			got.BuildMethod, _ = tpl.resources[id].metadata["BuildMethod"].(string)
			for k := range props["Environment"].(map[string]any)["Variables"].(map[string]any) {
				got.Env = append(got.Env, k)
			}
			sort.Strings(got.Env)
			wantEnv := append([]string(nil), common...)
			if name != "exporter" {
				wantEnv = append(wantEnv, "STATE_MACHINE_ARN")
			}
			if name == "generator" {
				// Calls in flight per instance, part of the sizing that
				// lambdafn.TestGeneratorSizing checks.
				wantEnv = append(wantEnv, "GENERATOR_CONCURRENCY")
				// The cache policy (CacheMode, CacheTtlDays): only the
				// generator reads or writes the cache.
				wantEnv = append(wantEnv, "CACHE_MODE", "CACHE_SCOPE", "CACHE_TTL")
				// What the role is granted for the providers file, checked
				// at cold start.
				wantEnv = append(wantEnv, "PROVIDER_API_KEY_PARAMS", "PROVIDER_BEDROCK_MODELS")
				// The service role of Bedrock's batch inference jobs.
				wantEnv = append(wantEnv, "BEDROCK_BATCH_ROLE_ARN")
			}
			if name == "generator" || name == "sweeper" {
				// How long an economy batch waits between looks at its
				// provider batches: the generator parks it that long, the
				// sweeper lets it wait.
				wantEnv = append(wantEnv, "PROVIDER_BATCH_POLL")
			}
			if name == "generator" || name == "splitter" || name == "api" {
				// The providers file: the generator routes over it, and
				// every function that builds a task spec records it there.
				wantEnv = append(wantEnv, "PROVIDERS_FILE")
			}
			if name == "api" {
				// The API's request limits (api.Limits).
				wantEnv = append(wantEnv, "ALLOWED_MODELS", "MAX_BATCH_SIZE", "MAX_TOKENS_LIMIT", "MAX_ACTIVE_TASKS", "MAX_ROWS_PER_DAY")
				// Task links point at the events function's URL: API Gateway cannot stream.
				wantEnv = append(wantEnv, "EVENTS_URL")
			}
			sort.Strings(wantEnv)
			want := fn{
				CodeUri:       "functions/" + name,
				Runtime:       "provided.al2023",
				Handler:       "bootstrap",
				BuildMethod:   "go1.x",
				Architectures: []any{"arm64"},
				Env:           wantEnv,
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("function %s mismatch (-want +got):\n%s", id, diff)
			}
			env := props["Environment"].(map[string]any)["Variables"].(map[string]any)
			if v := env["MODEL_API_KEY_PARAM"]; v != "" {
				t.Errorf("MODEL_API_KEY_PARAM default = %v, want the empty parameter name (a key is never a plain value)", v)
			}
			if name != "exporter" && env["STATE_MACHINE_ARN"] != "ref:ExportStateMachine" {
				t.Errorf("STATE_MACHINE_ARN = %v, want ref:ExportStateMachine", env["STATE_MACHINE_ARN"])
			}
		})
	}
}

func TestTemplateEvents(t *testing.T) {
	t.Parallel()
	tpl, ev := contractTemplate(t)
	events := func(name string) map[string]any {
		return functionProps(t, tpl, ev, functions[name])["Events"].(map[string]any)
	}

	work := events("generator")["Work"].(map[string]any)
	gotWork := work["Properties"].(map[string]any)
	wantWork := map[string]any{
		"Queue":                 "att:WorkQueue.Arn",
		"BatchSize":             2,
		"FunctionResponseTypes": []any{"ReportBatchItemFailures"},
		"ScalingConfig":         map[string]any{"MaximumConcurrency": 17},
	}
	if diff := cmp.Diff(wantWork, gotWork); diff != "" {
		t.Errorf("generator SQS event mismatch (-want +got):\n%s", diff)
	}
	if work["Type"] != "SQS" {
		t.Errorf("generator event type = %v, want SQS", work["Type"])
	}

	var uploads []string
	for _, e := range events("splitter") {
		em := e.(map[string]any)
		props := em["Properties"].(map[string]any)
		rules := props["Filter"].(map[string]any)["S3Key"].(map[string]any)["Rules"].([]any)
		desc := []string{em["Type"].(string), props["Bucket"].(string), props["Events"].(string)}
		for _, r := range rules {
			rm := r.(map[string]any)
			desc = append(desc, rm["Name"].(string)+"="+rm["Value"].(string))
		}
		uploads = append(uploads, strings.Join(desc, " "))
	}
	sort.Strings(uploads)
	wantUploads := []string{
		// Prefix only: suffix filters are case-sensitive, so the splitter picks the sheets (pipeline.IsInputKey).
		"S3 ref:Bucket s3:ObjectCreated:* prefix=incoming/",
	}
	if diff := cmp.Diff(wantUploads, uploads); diff != "" {
		t.Errorf("splitter S3 events mismatch (-want +got):\n%s", diff)
	}

	sweep := events("sweeper")["Sweep"].(map[string]any)
	if got := sweep["Properties"].(map[string]any)["Schedule"]; got != "rate(1 minute)" {
		t.Errorf("sweeper schedule = %v, want rate(1 minute)", got)
	}
}

// TestTemplateAPIRoutes pins which routes of the HTTP API skip the JWT
// authorizer: the page and its assets (a browser loads them before it has a
// token) and the OpenAPI document (routes, no task data); everything else,
// the API and POST /ui/inspect included, falls to the proxy route under the
// default authorizer.
func TestTemplateAPIRoutes(t *testing.T) {
	t.Parallel()
	tpl, ev := contractTemplate(t)
	var got []string
	for _, e := range functionProps(t, tpl, ev, functions["api"])["Events"].(map[string]any) {
		em := e.(map[string]any)
		if em["Type"] != "HttpApi" {
			continue
		}
		props := em["Properties"].(map[string]any)
		if props["ApiId"] != "ref:HttpApi" {
			t.Errorf("route %v %v is on API %v, want ref:HttpApi", props["Method"], props["Path"], props["ApiId"])
		}
		auth := "default"
		if a, ok := props["Auth"].(map[string]any); ok {
			auth = a["Authorizer"].(string)
		}
		got = append(got, props["Method"].(string)+" "+props["Path"].(string)+" "+auth)
	}
	sort.Strings(got)
	want := []string{
		"ANY /{proxy+} default",
		"GET / NONE",
		"GET /api/openapi.yaml NONE",
		"GET /ui/{proxy+} NONE",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("api routes and their authorizers (-want +got):\n%s", diff)
	}
	if got := evalPath(t, tpl, ev, "HttpApi", "Auth", "DefaultAuthorizer"); got != "Jwt" {
		t.Errorf("HttpApi default authorizer = %v, want Jwt: the proxy route must need a token", got)
	}
}

// TestTemplateBucketCORS: the page PUTs large sheets to their presigned
// upload URL from the API's origin (or an allowed one), which the browser
// does only if the bucket answers CORS for it: PUT with the signed
// Content-Type. It also fetches the result through the API, whose 302 to a
// presigned GET the browser follows with the page's Origin: GET, with the
// Content-Disposition the page names the download after.
func TestTemplateBucketCORS(t *testing.T) {
	t.Parallel()
	tpl, ev := contractTemplate(t)
	got := evalPath(t, tpl, ev, "Bucket", "CorsConfiguration")
	rule := func(id string, origins ...any) map[string]any {
		return map[string]any{"Id": id, "AllowedMethods": []any{"PUT", "GET"}, "AllowedOrigins": origins, "AllowedHeaders": []any{"content-type"},
			"ExposedHeaders": []any{"Content-Disposition"}, "MaxAge": 600}
	}
	want := map[string]any{"CorsRules": []any{
		rule("page-uploads-and-results", "https://*.execute-api.us-east-1.amazonaws.com"),
		rule("allowed-origins-uploads-and-results", "http://localhost:8080"),
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("bucket CORS (-want +got):\n%s", diff)
	}
}

func TestTemplateStateMachineAndOutputs(t *testing.T) {
	t.Parallel()
	tpl, ev := contractTemplate(t)
	sm := tpl.resources["ExportStateMachine"]
	if sm.typ != typeSAMStateMachine {
		t.Fatalf("ExportStateMachine type = %q, want %s", sm.typ, typeSAMStateMachine)
	}
	subs := evalPath(t, tpl, ev, "ExportStateMachine", "DefinitionSubstitutions")
	wantSubs := map[string]any{"ExporterFunctionArn": "att:ExporterFunction.Arn", "TableName": "ref:Table"}
	if diff := cmp.Diff(wantSubs, subs); diff != "" {
		t.Errorf("DefinitionSubstitutions mismatch (-want +got):\n%s", diff)
	}
	uri, _ := sm.properties["DefinitionUri"].(string)
	if uri != "infra/statemachine/export.asl.json" {
		t.Errorf("DefinitionUri = %q, want infra/statemachine/export.asl.json", uri)
	}
	def, err := os.ReadFile(filepath.Join(tpl.dir, uri))
	if err != nil {
		t.Fatal(err)
	}
	strSubs := map[string]string{}
	for k := range wantSubs {
		strSubs[k] = "x"
	}
	if _, err := substitute(string(def), strSubs); err != nil {
		t.Errorf("definition and DefinitionSubstitutions disagree: %v", err)
	}

	var outputs []string
	for k := range tpl.outputs {
		outputs = append(outputs, k)
	}
	for _, want := range []string{"BucketName", "ApiUrl", "QueueUrl", "DlqUrl", "TableName", "StateMachineArn"} {
		if _, ok := tpl.outputs[want]; !ok {
			t.Errorf("Outputs lack %s (have %v)", want, outputs)
		}
	}
}

// aslState is the part of an ASL state the export contract is about.
type aslState struct {
	Type       string
	Resource   string
	Next       string
	End        bool
	Parameters map[string]any
	Retry      []struct {
		ErrorEquals []string
		MaxAttempts *int
		BackoffRate float64
	}
	Catch []struct {
		ErrorEquals []string
		Next        string
	}
}

func TestExportDefinition(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../infra/statemachine/export.asl.json")
	if err != nil {
		t.Fatal(err)
	}
	var def struct {
		StartAt string
		States  map[string]aslState
	}
	if err := json.Unmarshal(b, &def); err != nil {
		t.Fatalf("export.asl.json: %v", err)
	}
	export := def.States[def.StartAt]
	if export.Type != "Task" || export.Resource != "arn:aws:states:::lambda:invoke" {
		t.Fatalf("start state %s = %s %s, want a lambda:invoke Task", def.StartAt, export.Type, export.Resource)
	}
	gotInvoke := map[string]any{"FunctionName": export.Parameters["FunctionName"], "Payload": export.Parameters["Payload"]}
	wantInvoke := map[string]any{"FunctionName": "${ExporterFunctionArn}", "Payload": map[string]any{"task_id.$": "$.task_id"}}
	if diff := cmp.Diff(wantInvoke, gotInvoke); diff != "" {
		t.Errorf("exporter invocation mismatch (-want +got):\n%s", diff)
	}
	retried := map[string]bool{}
	for _, r := range export.Retry {
		if r.BackoffRate <= 1 {
			t.Errorf("retrier %v has BackoffRate %v, want backoff > 1", r.ErrorEquals, r.BackoffRate)
		}
		for _, e := range r.ErrorEquals {
			retried[e] = true
		}
	}
	for _, e := range []string{"Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException", "Lambda.TooManyRequestsException"} {
		if !retried[e] {
			t.Errorf("export does not retry %s", e)
		}
	}
	if len(export.Catch) == 0 || export.Catch[0].ErrorEquals[0] != "States.ALL" {
		t.Fatalf("export Catch = %+v, want States.ALL first", export.Catch)
	}
	mark := def.States[export.Catch[0].Next]
	if mark.Resource != "arn:aws:states:::dynamodb:updateItem" {
		t.Errorf("catch goes to %s with resource %q, want the DynamoDB updateItem integration", export.Catch[0].Next, mark.Resource)
	}
	gotKey := map[string]any{"TableName": mark.Parameters["TableName"], "Key": mark.Parameters["Key"]}
	wantKey := map[string]any{
		"TableName": "${TableName}",
		"Key": map[string]any{
			"PK": map[string]any{"S.$": "States.Format('TASK#{}', $.task_id)"},
			"SK": map[string]any{"S": "TASK"},
		},
	}
	if diff := cmp.Diff(wantKey, gotKey); diff != "" {
		t.Errorf("task key mismatch (-want +got):\n%s", diff)
	}
	if fail := def.States[mark.Next]; fail.Type != "Fail" {
		t.Errorf("after marking the task, state %q is %q, want a Fail state", mark.Next, fail.Type)
	}
}

func TestProvisionRejectsBadInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		template string
		prefix   string
		wantErr  string
	}{
		{name: "uppercase prefix", template: repoTemplate, prefix: "Test", wantErr: "prefix"},
		{name: "empty prefix", template: repoTemplate, prefix: "", wantErr: "prefix"},
		{name: "missing template", template: "testdata/nope.yaml", prefix: "t", wantErr: "read template"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// No endpoint is configured: these must fail before any call.
			_, err := Provision(t.Context(), aws.Config{Region: Region}, tc.template, tc.prefix)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Provision error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestUniquePrefix(t *testing.T) {
	t.Parallel()
	a, b := UniquePrefix("samstack"), UniquePrefix("samstack")
	if a == b {
		t.Errorf("UniquePrefix returned %q twice", a)
	}
	for _, p := range []string{a, b} {
		if !validPrefix.MatchString(p) {
			t.Errorf("UniquePrefix = %q, which Provision rejects", p)
		}
	}
}

func TestConfig(t *testing.T) {
	tests := []struct {
		name     string
		endpoint string
		wantErr  error
		errText  string
	}{
		{name: "unset", endpoint: "", wantErr: ErrNoEndpoint},
		{name: "no scheme", endpoint: "localhost:4566", errText: "want http(s)://host:port"},
		{name: "no host", endpoint: "http://", errText: "want http(s)://host:port"},
		{name: "moto", endpoint: "http://127.0.0.1:5000"},
		{name: "localstack", endpoint: "http://localhost:4566"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EndpointEnv, tc.endpoint)
			cfg, err := Config(t.Context())
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Config error = %v, want %v", err, tc.wantErr)
				}
				return
			case tc.errText != "":
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("Config error = %v, want it to contain %q", err, tc.errText)
				}
				return
			case err != nil:
				t.Fatalf("Config: %v", err)
			}
			creds, err := cfg.Credentials.Retrieve(t.Context())
			if err != nil {
				t.Fatalf("retrieve credentials: %v", err)
			}
			got := []string{cfg.Region, *cfg.BaseEndpoint, creds.AccessKeyID, creds.SecretAccessKey}
			want := []string{"us-east-1", tc.endpoint, "test", "test"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Config mismatch (-want +got):\n%s", diff)
			}
			whole, ok := cfg.HTTPClient.(emulatorHTTPClient)
			if !ok {
				t.Fatalf("HTTPClient = %T, want emulatorHTTPClient", cfg.HTTPClient)
			}
			if hc, ok := whole.next.(*awshttp.BuildableClient); !ok || hc.GetTimeout() != EmulatorRequestTimeout {
				t.Errorf("HTTPClient sends through %T, want a BuildableClient with timeout %v", whole.next, EmulatorRequestTimeout)
			}
		})
	}
}
