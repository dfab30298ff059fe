package awswire_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/batchgen/batchgen/"

// deps lists the packages pkg links (go list -deps), for the Lambda's
// build (linux/arm64, lambda.norpc).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-tags", "lambda.norpc", "-f", "{{.ImportPath}}", mod+pkg)
	cmd.Env = append(cmd.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	return strings.Fields(string(out))
}

func links(list []string, prefix string) bool {
	return slices.ContainsFunc(list, func(p string) bool { return strings.HasPrefix(p, prefix) })
}

// TestDependencyEdges asserts the layering: the core never imports the AWS
// SDK or Lambda, the handlers no AWS service client, and each function
// links only what it uses (the OpenAI client and SSM only in the
// generator).
func TestDependencyEdges(t *testing.T) {
	t.Parallel()
	const (
		sdkServices = "github.com/aws/aws-sdk-go-v2/service/"
		sdk         = "github.com/aws/aws-sdk-go-v2"
		lambdaGo    = "github.com/aws/aws-lambda-go"
		openai      = "github.com/openai/openai-go"
		ssm         = "github.com/aws/aws-sdk-go-v2/service/ssm"
	)
	tests := []struct {
		pkg     string
		must    []string
		mustNot []string
	}{
		{"internal/pipeline", nil, []string{sdk, lambdaGo, openai, mod + "internal/api", mod + "internal/lambdafn"}},
		{"internal/lambdafn", []string{lambdaGo + "/events"}, []string{sdkServices, openai}},
		{"internal/awswire", []string{sdkServices + "dynamodb"}, []string{openai, ssm}},
		{"functions/generator", []string{openai, ssm}, nil},
		{"functions/sweeper", []string{sdkServices + "sqs"}, []string{openai, ssm}},
		{"functions/exporter", nil, []string{openai, ssm}},
		{"functions/splitter", nil, []string{openai, ssm}},
		{"functions/api", nil, []string{openai, ssm}},
	}
	for _, tc := range tests {
		t.Run(tc.pkg, func(t *testing.T) {
			t.Parallel()
			list := deps(t, tc.pkg)
			for _, p := range tc.must {
				if !links(list, p) {
					t.Errorf("%s does not link %s; the test's picture of the layout is out of date", tc.pkg, p)
				}
			}
			for _, p := range tc.mustNot {
				if links(list, p) {
					t.Errorf("%s links %s", tc.pkg, p)
				}
			}
		})
	}
}
