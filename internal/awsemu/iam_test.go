package awsemu

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var samTemplates = map[string][]string{
	"SQSSendMessagePolicy": {"sqs:SendMessage*"},
	"LambdaInvokePolicy":   {"lambda:InvokeFunction"},
}

func TestRoleGrants(t *testing.T) {
	t.Parallel()
	got, err := RoleGrants("testdata/iam-template.yaml", samTemplates)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]Grant{
		"Fn": {
			{Action: "dynamodb:GetItem", From: "Rw"},
			{Action: "dynamodb:UpdateItem", From: "Rw"},
			{Action: "sqs:SendMessage*", From: "SQSSendMessagePolicy"},
			{Action: "ssm:GetParameter", From: "Key", Condition: "HasKey"},
		},
		"Machine": {{Action: "lambda:InvokeFunction", From: "LambdaInvokePolicy"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("RoleGrants (-want +got):\n%s", d)
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
	for name, policies := range map[string]string{
		"managed policy":          "- AWSLambdaExecute",
		"unknown policy template": "- DynamoDBCrudPolicy: {TableName: t}",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "t.yaml")
			doc := "Resources:\n  Fn:\n    Type: AWS::Serverless::Function\n    Properties:\n      Policies:\n        " + policies + "\n"
			if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := RoleGrants(path, samTemplates); err == nil {
				t.Errorf("RoleGrants accepted %q", policies)
			}
		})
	}
}

// TestLoadPolicyTemplates reads a file shaped like SAM's: the emulator
// test of internal/lambdafn reads the real one from the virtualenv.
func TestLoadPolicyTemplates(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy_templates.json")
	doc := `{"Version":"0.0.1","Templates":{"X":{"Definition":{"Statement":[{"Effect":"Allow","Action":["b:Two","a:One"],"Resource":"*"},{"Effect":"Allow","Action":"a:One","Resource":"*"}]}}}}`
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LoadPolicyTemplates(path)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string][]string{"X": {"a:One", "b:Two"}}, got); d != "" {
		t.Errorf("LoadPolicyTemplates (-want +got):\n%s", d)
	}
}
