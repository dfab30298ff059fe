package lambdafn_test

// Checks of template.yaml that need no emulator: what the functions and the
// alarms rely on is declared there.

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/sheet"
)

// loadTemplate decodes template.yaml into plain Go values; a short-form
// intrinsic becomes a one-key map such as {"!Ref": "AWS::StackName"}.
func loadTemplate(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile("../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return fromNode(t, doc.Content[0]).(map[string]any)
}

func fromNode(t *testing.T, n *yaml.Node) any {
	t.Helper()
	var v any
	switch n.Kind {
	case yaml.MappingNode:
		m := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			m[n.Content[i].Value] = fromNode(t, n.Content[i+1])
		}
		v = m
	case yaml.SequenceNode:
		var s []any
		for _, c := range n.Content {
			s = append(s, fromNode(t, c))
		}
		v = s
	case yaml.AliasNode:
		return fromNode(t, n.Alias)
	default:
		if strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!") {
			v = n.Value
		} else if err := n.Decode(&v); err != nil {
			t.Fatalf("line %d: %v", n.Line, err)
		}
	}
	if strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!") {
		return map[string]any{n.Tag: v}
	}
	return v
}

// dig walks keys down nested maps.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

func resourcesOfType(tpl map[string]any, typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range dig(tpl, "Resources").(map[string]any) {
		if dig(r, "Type") == typ {
			out[id] = r.(map[string]any)
		}
	}
	return out
}

// TestSplitterEphemeralStorage: /tmp holds the downloaded input and the
// worksheets excelize unzips to temporary files.
func TestSplitterEphemeralStorage(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	size, ok := dig(tpl, "Resources", "SplitterFunction", "Properties", "EphemeralStorage", "Size").(int)
	if !ok {
		t.Fatal("SplitterFunction has no EphemeralStorage.Size: /tmp stays at 512 MiB")
	}
	// The input, its unzipped worksheets and the rows spooled from them (no larger than the XML that
	// holds them) are on disk at once.
	need := (pipeline.DefaultMaxInputBytes + 2*sheet.DefaultMaxUnzippedBytes) >> 20
	if int64(size) < need {
		t.Errorf("SplitterFunction EphemeralStorage is %d MiB; the input (%d MiB), its unzipped worksheets (%d MiB) and the spooled rows (as much again) need %d MiB",
			size, pipeline.DefaultMaxInputBytes>>20, sheet.DefaultMaxUnzippedBytes>>20, need)
	}
	if v, set := dig(tpl, "Globals", "Function", "Environment", "Variables", "MAX_INPUT_BYTES").(string); set {
		t.Errorf("MAX_INPUT_BYTES=%s is set; EphemeralStorage is sized for the default", v)
	}
}

// TestSplitterFailureDestination: an upload the splitter fails on three
// times lands in a queue, with its error, instead of being dropped.
func TestSplitterFailureDestination(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	onFailure := dig(tpl, "Resources", "SplitterFunction", "Properties", "EventInvokeConfig", "DestinationConfig", "OnFailure")
	if dig(onFailure, "Type") != "SQS" {
		t.Fatalf("SplitterFunction OnFailure = %v, want an SQS destination", onFailure)
	}
	dest, _ := dig(onFailure, "Destination", "!GetAtt").(string)
	queue, _, _ := strings.Cut(dest, ".")
	if dig(tpl, "Resources", queue, "Type") != "AWS::SQS::Queue" {
		t.Errorf("OnFailure destination %v is not a queue of the stack", dig(onFailure, "Destination"))
	}
	if !alarmWatchesQueue(tpl, queue) {
		t.Errorf("no alarm watches %s: a failed split would wait there unseen", queue)
	}
}

func alarmWatchesQueue(tpl map[string]any, queue string) bool {
	for _, a := range resourcesOfType(tpl, "AWS::CloudWatch::Alarm") {
		for _, d := range asList(dig(a, "Properties", "Dimensions")) {
			if dig(d, "Value", "!GetAtt") == queue+".QueueName" {
				return true
			}
		}
	}
	return false
}

func asList(v any) []any { l, _ := v.([]any); return l }

func TestStateMachineLogging(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	logging := dig(tpl, "Resources", "ExportStateMachine", "Properties", "Logging")
	if lvl := dig(logging, "Level"); lvl == nil || lvl == "OFF" {
		t.Errorf("ExportStateMachine logging level = %v, want on", lvl)
	}
	if len(asList(dig(logging, "Destinations"))) == 0 {
		t.Error("ExportStateMachine logging has no destination")
	}
}

// alarmMetrics returns an alarm's metrics as namespace/name and their
// dimensions, whether it names one metric or uses metric math.
func alarmMetrics(a map[string]any) (metricsOf []map[string]any) {
	p := dig(a, "Properties")
	if ns := dig(p, "Namespace"); ns != nil {
		return []map[string]any{{"Namespace": ns, "MetricName": dig(p, "MetricName"), "Dimensions": dig(p, "Dimensions")}}
	}
	for _, m := range asList(dig(p, "Metrics")) {
		if metric, ok := dig(m, "MetricStat", "Metric").(map[string]any); ok {
			metricsOf = append(metricsOf, metric)
		}
	}
	return metricsOf
}

func TestAlarms(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	alarms := resourcesOfType(tpl, "AWS::CloudWatch::Alarm")
	if got := dig(tpl, "Globals", "Function", "Environment", "Variables", "STACK_NAME", "!Ref"); got != "AWS::StackName" {
		t.Errorf("Globals STACK_NAME = %v, want !Ref AWS::StackName (the functions' metrics dimension)", got)
	}
	seen := map[string]bool{}
	for id, a := range alarms {
		actions := asList(dig(a, "Properties", "AlarmActions"))
		if !slices.ContainsFunc(actions, func(v any) bool { return dig(v, "!Ref") == "AlarmTopic" }) {
			t.Errorf("%s does not notify AlarmTopic: %v", id, actions)
		}
		if !slices.ContainsFunc(actions, func(v any) bool { return strings.Contains(strings.Join(flatten(v), " "), "AlarmTopicArn") }) {
			t.Errorf("%s does not notify AlarmTopicArn when it is set: %v", id, actions)
		}
		for _, m := range alarmMetrics(a) {
			name := dig(m, "Namespace").(string) + "/" + dig(m, "MetricName").(string)
			seen[name] = true
			if name == "AWS/SQS/ApproximateAgeOfOldestMessage" {
				t.Errorf("%s alarms on the oldest message's age, which any long healthy job exceeds", id)
			}
			if dig(m, "Namespace") != metrics.Namespace {
				continue
			}
			dims := asList(dig(m, "Dimensions"))
			if len(dims) != 1 || dig(dims[0], "Name") != metrics.StackDimension || dig(dims[0], "Value", "!Ref") != "AWS::StackName" {
				t.Errorf("%s reads %s with dimensions %v; the functions publish it with exactly Stack=${AWS::StackName}", id, name, dims)
			}
		}
	}
	for _, want := range []string{
		"AWS/ApiGateway/5xx", "AWS/DynamoDB/WriteThrottleEvents", "AWS/DynamoDB/ReadThrottleEvents",
		"batchgen/RowsSucceeded", "batchgen/RowsFailed", "AWS/SQS/ApproximateNumberOfMessagesVisible",
	} {
		if !seen[want] {
			t.Errorf("no alarm reads %s", want)
		}
	}
	// Lack of progress: work waiting while no row completes.
	expr := ""
	for _, m := range asList(dig(alarms["NoProgressAlarm"], "Properties", "Metrics")) {
		if e, ok := dig(m, "Expression").(string); ok {
			expr = e
		}
	}
	for _, id := range []string{"waiting", "succeeded", "failed"} {
		if !regexp.MustCompile(`\b` + id + `\b`).MatchString(expr) {
			t.Errorf("NoProgressAlarm expression %q does not use %s", expr, id)
		}
	}
}

func flatten(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, flatten(e)...)
		}
		return out
	case map[string]any:
		var out []string
		for k, e := range x {
			out = append(out, k)
			out = append(out, flatten(e)...)
		}
		return out
	}
	return nil
}

// TestProdAlarmsReachSomeone: the prod profile cannot deploy a stack whose
// alarms notify nobody.
func TestProdAlarmsReachSomeone(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	rule := dig(tpl, "Rules", "ProdAlarmsReachSomeone")
	if rule == nil {
		t.Fatal("no rule requires an alarm subscriber in prod")
	}
	text := strings.Join(flatten(rule), " ")
	for _, want := range []string{"Stage", "prod", "AlarmEmail", "AlarmTopicArn"} {
		if !strings.Contains(text, want) {
			t.Errorf("rule ProdAlarmsReachSomeone does not mention %s: %s", want, text)
		}
	}
	data, err := os.ReadFile("../../samconfig.toml")
	if err != nil {
		t.Fatal(err)
	}
	_, prod, found := strings.Cut(string(data), "[prod.deploy.parameters]")
	if !found {
		t.Fatal("samconfig.toml has no prod deploy profile")
	}
	prod, _, _ = strings.Cut(prod, "\n[")
	if !strings.Contains(prod, `"Stage=prod"`) {
		t.Error("the prod profile does not set Stage=prod")
	}
	if !regexp.MustCompile(`"(AlarmEmail|AlarmTopicArn)=[^"]+"`).MatchString(prod) {
		t.Error("the prod profile sets neither AlarmEmail nor AlarmTopicArn")
	}
}
