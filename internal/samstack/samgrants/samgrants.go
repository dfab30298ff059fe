// Package samgrants reads the IAM actions template.yaml grants each
// function's and state machine's role, for the tests that hold what each
// function does against its policy. Only tests use it: the binaries do not
// link it.
package samgrants

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/batchgen/batchgen/internal/samstack"
)

// Grant is one IAM action a template allows a role.
type Grant struct {
	// Action is the action as written ("dynamodb:GetItem"), possibly with
	// wildcards ("sqs:SendMessage*" in SAM's SQSSendMessagePolicy).
	Action string
	// From names where it came from: the statement's Sid, else the policy's
	// name (SAM names policy templates' expansions <Role>Policy<N>).
	From string
	// Condition is the template condition the grant depends on (an !If
	// around the policy), or empty.
	Condition string
}

// Matches reports whether the grant allows action, IAM's wildcards (* and
// ?) included; action names compare case-insensitively, as IAM's do.
func (g Grant) Matches(action string) bool {
	ok, err := path.Match(strings.ToLower(g.Action), strings.ToLower(action))
	return err == nil && ok
}

// samManagedPolicies are the AWS managed policies SAM attaches to the roles
// it generates: logging for every function, and the SQS event source
// mapping's polling for a function with an SQS event. They serve Lambda's
// own machinery, not the function's code, so RoleGrants leaves them out.
var samManagedPolicies = []string{
	"arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
	"arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole",
}

// RoleGrants returns, for each function (AWS::Lambda::Function) and state
// machine the SAM template at templatePath deploys, keyed by logical ID, the
// actions its generated role's policies allow: the template's statements
// (Effect Allow; both branches of an !If) and the SAM policy templates as
// SAM's own translator expands them (from its policy_templates.json; see
// translate). Resources are not compared, only actions.
//
// A managed policy other than those SAM attaches by itself is an error: its
// actions could not be checked.
func RoleGrants(ctx context.Context, templatePath string) (map[string][]Grant, error) {
	doc, err := samstack.Translate(ctx, templatePath)
	if err != nil {
		return nil, err
	}
	return roleGrants(doc)
}

// roleGrants reads the roles out of a translated (plain CloudFormation)
// template.
func roleGrants(doc []byte) (map[string][]Grant, error) {
	var tpl struct {
		Resources map[string]struct {
			Type       string         `json:"Type"`
			Properties map[string]any `json:"Properties"`
		} `json:"Resources"`
	}
	if err := json.Unmarshal(doc, &tpl); err != nil {
		return nil, fmt.Errorf("translated template: %w", err)
	}
	out := map[string][]Grant{}
	for id, r := range tpl.Resources {
		var roleRef any
		switch r.Type {
		case "AWS::Lambda::Function":
			roleRef = r.Properties["Role"]
		case "AWS::StepFunctions::StateMachine":
			roleRef = r.Properties["RoleArn"]
		default:
			continue
		}
		ref, _ := roleRef.(map[string]any)
		att, _ := ref["Fn::GetAtt"].([]any)
		if len(att) != 2 {
			return nil, fmt.Errorf("%s: role %v is not a role of the template", id, roleRef)
		}
		roleID, _ := att[0].(string)
		role, ok := tpl.Resources[roleID]
		if !ok || role.Type != "AWS::IAM::Role" {
			return nil, fmt.Errorf("%s: role %s is not an AWS::IAM::Role of the template", id, roleID)
		}
		managed, err := stringList(role.Properties["ManagedPolicyArns"])
		if err != nil && role.Properties["ManagedPolicyArns"] != nil {
			return nil, fmt.Errorf("%s ManagedPolicyArns: %w", roleID, err)
		}
		for _, arn := range managed {
			if !slices.Contains(samManagedPolicies, arn) {
				return nil, fmt.Errorf("%s: managed policy %s: its actions are not known here; write the statements instead", roleID, arn)
			}
		}
		var grants []Grant
		if err := policyGrants(role.Properties["Policies"], "", &grants); err != nil {
			return nil, fmt.Errorf("%s Policies: %w", roleID, err)
		}
		sort.SliceStable(grants, func(i, j int) bool { return grants[i].Action < grants[j].Action })
		out[id] = grants
	}
	return out, nil
}

// policyGrants collects the grants of a role's Policies value.
func policyGrants(v any, cond string, out *[]Grant) error {
	switch p := v.(type) {
	case nil:
		return nil
	case []any:
		for _, x := range p {
			if err := policyGrants(x, cond, out); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		if ref, ok := p["Ref"]; ok && ref == "AWS::NoValue" {
			return nil
		}
		if args, ok := p["Fn::If"].([]any); ok && len(p) == 1 {
			if len(args) != 3 {
				return fmt.Errorf("Fn::If with %d arguments", len(args))
			}
			name, _ := args[0].(string)
			for _, branch := range args[1:] {
				if err := policyGrants(branch, name, out); err != nil {
					return err
				}
			}
			return nil
		}
		doc, ok := p["PolicyDocument"].(map[string]any)
		if !ok {
			return fmt.Errorf("policy %v has no PolicyDocument", p)
		}
		name, _ := p["PolicyName"].(string)
		return statementGrants(doc["Statement"], name, cond, out)
	default:
		return fmt.Errorf("unexpected policy %T", v)
	}
}

func statementGrants(v any, policy, cond string, out *[]Grant) error {
	switch s := v.(type) {
	case []any:
		for _, x := range s {
			if err := statementGrants(x, policy, cond, out); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		if args, ok := s["Fn::If"].([]any); ok && len(s) == 1 && len(args) == 3 {
			name, _ := args[0].(string)
			for _, branch := range args[1:] {
				if err := statementGrants(branch, policy, name, out); err != nil {
					return err
				}
			}
			return nil
		}
		if ref, ok := s["Ref"]; ok && ref == "AWS::NoValue" {
			return nil
		}
		if effect, _ := s["Effect"].(string); effect != "Allow" {
			return nil
		}
		from, _ := s["Sid"].(string)
		if from == "" {
			from = policy
		}
		actions, err := stringList(s["Action"])
		if err != nil {
			return fmt.Errorf("statement %q Action: %w", from, err)
		}
		for _, a := range actions {
			*out = append(*out, Grant{Action: a, From: from, Condition: cond})
		}
		return nil
	default:
		return fmt.Errorf("unexpected statement %T", v)
	}
}

func stringList(v any) ([]string, error) {
	switch a := v.(type) {
	case string:
		return []string{a}, nil
	case []any:
		out := make([]string, 0, len(a))
		for _, x := range a {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("%v is not a string", x)
			}
			out = append(out, s)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("%v is not a string or a list of strings", v)
	}
}
