package samgrants

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// translated is the shape SAM's translator gives a function's and a state
// machine's roles: statements, a Deny, an !If with AWS::NoValue, a policy
// template's expansion without a Sid, and the managed policies SAM adds.
const translated = `{"Resources": {
  "Fn": {"Type": "AWS::Lambda::Function", "Properties": {"Role": {"Fn::GetAtt": ["FnRole", "Arn"]}}},
  "FnRole": {"Type": "AWS::IAM::Role", "Properties": {
    "ManagedPolicyArns": ["arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"],
    "Policies": [
      {"PolicyName": "FnRolePolicy0", "PolicyDocument": {"Statement": [
        {"Sid": "Rw", "Effect": "Allow", "Action": ["dynamodb:UpdateItem", "dynamodb:GetItem"], "Resource": "*"},
        {"Sid": "NoDelete", "Effect": "Deny", "Action": "dynamodb:DeleteItem", "Resource": "*"}]}},
      {"PolicyName": "FnRolePolicy1", "PolicyDocument": {"Statement": [
        {"Effect": "Allow", "Action": ["sqs:SendMessage*"], "Resource": "*"}]}},
      {"Fn::If": ["HasKey",
        {"PolicyName": "FnRolePolicy2", "PolicyDocument": {"Statement": [{"Sid": "Key", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": "*"}]}},
        {"Ref": "AWS::NoValue"}]}]}},
  "Machine": {"Type": "AWS::StepFunctions::StateMachine", "Properties": {"RoleArn": {"Fn::GetAtt": ["MachineRole", "Arn"]}}},
  "MachineRole": {"Type": "AWS::IAM::Role", "Properties": {"Policies": [
    {"PolicyName": "MachineRolePolicy0", "PolicyDocument": {"Statement": [{"Effect": "Allow", "Action": ["lambda:InvokeFunction"], "Resource": "*"}]}}]}},
  "Table": {"Type": "AWS::DynamoDB::Table"}
}}`

func TestRoleGrants(t *testing.T) {
	t.Parallel()
	got, err := roleGrants([]byte(translated))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]Grant{
		"Fn": {
			{Action: "dynamodb:GetItem", From: "Rw"},
			{Action: "dynamodb:UpdateItem", From: "Rw"},
			{Action: "sqs:SendMessage*", From: "FnRolePolicy1"},
			{Action: "ssm:GetParameter", From: "Key", Condition: "HasKey"},
		},
		"Machine": {{Action: "lambda:InvokeFunction", From: "MachineRolePolicy0"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("roleGrants (-want +got):\n%s", d)
	}
	send := got["Fn"][2]
	for action, want := range map[string]bool{"sqs:SendMessage": true, "SQS:sendmessagebatch": true, "sqs:ReceiveMessage": false} {
		if send.Matches(action) != want {
			t.Errorf("%s matches %s = %v, want %v", send.Action, action, !want, want)
		}
	}
}

func TestRoleGrantsRejectsWhatItCannotCheck(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"managed policy": `{"Resources": {"Fn": {"Type": "AWS::Lambda::Function", "Properties": {"Role": {"Fn::GetAtt": ["R", "Arn"]}}},
			"R": {"Type": "AWS::IAM::Role", "Properties": {"ManagedPolicyArns": ["arn:aws:iam::aws:policy/AmazonDynamoDBFullAccess"]}}}}`,
		"role from outside": `{"Resources": {"Fn": {"Type": "AWS::Lambda::Function", "Properties": {"Role": "arn:aws:iam::1:role/x"}}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := roleGrants([]byte(doc)); err == nil {
				t.Errorf("roleGrants accepted %s", doc)
			}
		})
	}
}

// TestNoBinaryLinksIt: the grants reader is for tests; no command or
// function links it (nor anything else under samstack but what
// batchgen-localaws runs).
func TestNoBinaryLinksIt(t *testing.T) {
	t.Parallel()
	const mod = "github.com/batchgen/batchgen/"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod+"cmd/...", mod+"functions/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		if d == mod+"internal/samstack/samgrants" {
			t.Errorf("a binary links %s, which only tests use", d)
		}
	}
	if len(deps) < 50 {
		t.Errorf("go list -deps listed %d packages; the binaries link more than that", len(deps))
	}
}
