package awsemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Grant is one IAM action a template allows a role.
type Grant struct {
	// Action is the action as written ("dynamodb:GetItem"), possibly with
	// wildcards ("sqs:SendMessage*" in SAM's SQSSendMessagePolicy).
	Action string
	// From names where it came from: the statement's Sid, or the SAM policy
	// template.
	From string
	// Condition is the template condition the grant depends on (an !If
	// branch), or empty.
	Condition string
}

// Matches reports whether the grant allows action, IAM's wildcards (* and
// ?) included; action names compare case-insensitively, as IAM's do.
func (g Grant) Matches(action string) bool {
	ok, err := path.Match(strings.ToLower(g.Action), strings.ToLower(action))
	return err == nil && ok
}

// RoleGrants reads the SAM template at templatePath and returns, for each
// AWS::Serverless::Function and AWS::Serverless::StateMachine, the actions
// its Policies allow: inline statements (Effect Allow), both branches of an
// !If, and SAM policy templates expanded through policyTemplates (see
// LoadPolicyTemplates). A managed policy name or an unknown policy template
// is an error: its actions could not be checked.
//
// Resources are not compared, only actions: the statements scope them to
// the stack's own table, queues, bucket prefixes and state machine.
func RoleGrants(templatePath string, policyTemplates map[string][]string) (map[string][]Grant, error) {
	t, err := loadTemplate(templatePath)
	if err != nil {
		return nil, err
	}
	out := map[string][]Grant{}
	for _, id := range t.resourceIDs() {
		r := t.resources[id]
		if r.typ != "AWS::Serverless::Function" && r.typ != "AWS::Serverless::StateMachine" {
			continue
		}
		var grants []Grant
		if err := policyGrants(r.properties["Policies"], "", policyTemplates, &grants); err != nil {
			return nil, fmt.Errorf("%s Policies: %w", id, err)
		}
		sort.Slice(grants, func(i, j int) bool { return grants[i].Action < grants[j].Action })
		out[id] = grants
	}
	return out, nil
}

// policyGrants collects the grants of a Policies value (a list, a single
// policy, or an intrinsic around either).
func policyGrants(v any, cond string, templates map[string][]string, out *[]Grant) error {
	switch p := v.(type) {
	case nil:
		return nil
	case []any:
		for _, x := range p {
			if err := policyGrants(x, cond, templates, out); err != nil {
				return err
			}
		}
		return nil
	case string:
		return fmt.Errorf("managed policy %q: its actions are not known here; write the statements instead", p)
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
				if err := policyGrants(branch, name, templates, out); err != nil {
					return err
				}
			}
			return nil
		}
		if stmts, ok := p["Statement"]; ok {
			return statementGrants(stmts, cond, out)
		}
		if len(p) != 1 {
			return fmt.Errorf("policy %v is neither a statement list nor a policy template", p)
		}
		for name := range p {
			actions, ok := templates[name]
			if !ok {
				return fmt.Errorf("unknown SAM policy template %q", name)
			}
			for _, a := range actions {
				*out = append(*out, Grant{Action: a, From: name, Condition: cond})
			}
		}
		return nil
	default:
		return fmt.Errorf("unexpected policy %T", v)
	}
}

func statementGrants(v any, cond string, out *[]Grant) error {
	switch s := v.(type) {
	case []any:
		for _, x := range s {
			if err := statementGrants(x, cond, out); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		if args, ok := s["Fn::If"].([]any); ok && len(s) == 1 && len(args) == 3 {
			name, _ := args[0].(string)
			for _, branch := range args[1:] {
				if err := statementGrants(branch, name, out); err != nil {
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
		sid, _ := s["Sid"].(string)
		actions, err := stringList(s["Action"])
		if err != nil {
			return fmt.Errorf("statement %q Action: %w", sid, err)
		}
		for _, a := range actions {
			*out = append(*out, Grant{Action: a, From: sid, Condition: cond})
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

// LoadPolicyTemplates reads SAM's policy_templates.json (shipped inside the
// aws-sam-translator package, see PolicyTemplatesFile) and returns the
// actions each template's definition allows: SAM's own expansion, not a copy
// of it.
func LoadPolicyTemplates(file string) (map[string][]string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("SAM policy templates: %w", err)
	}
	var doc struct {
		Templates map[string]struct {
			Definition struct {
				Statement []struct {
					Effect string `json:"Effect"`
					Action any    `json:"Action"`
				} `json:"Statement"`
			} `json:"Definition"`
		} `json:"Templates"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("SAM policy templates %s: %w", file, err)
	}
	if len(doc.Templates) == 0 {
		return nil, fmt.Errorf("SAM policy templates %s: no templates", file)
	}
	out := make(map[string][]string, len(doc.Templates))
	for name, tpl := range doc.Templates {
		var actions []string
		for _, st := range tpl.Definition.Statement {
			if st.Effect != "Allow" {
				continue
			}
			a, err := stringList(st.Action)
			if err != nil {
				return nil, fmt.Errorf("SAM policy template %s: %w", name, err)
			}
			actions = append(actions, a...)
		}
		slices.Sort(actions)
		out[name] = slices.Compact(actions)
	}
	return out, nil
}

// PolicyTemplatesFile finds policy_templates.json in the project's Python
// virtualenv: $BATCHGEN_VENV, else <repoRoot>/.venv, as infra/venv.sh
// creates it (infra/emulator/start.sh installs it before the emulator
// tests run).
func PolicyTemplatesFile(repoRoot string) (string, error) {
	venv := os.Getenv("BATCHGEN_VENV")
	if venv == "" {
		venv = filepath.Join(repoRoot, ".venv")
	}
	matches, err := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages", "samtranslator", "policy_templates_data", "policy_templates.json"))
	if err != nil {
		return "", err
	}
	if len(matches) == 0 {
		return "", errors.New("no samtranslator/policy_templates_data/policy_templates.json under " + venv +
			"; run infra/venv.sh (or set BATCHGEN_VENV to the project's virtualenv)")
	}
	return matches[len(matches)-1], nil
}
