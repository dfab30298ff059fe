package awswire_test

import (
	"go/parser"
	"go/token"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
	return slices.ContainsFunc(list, func(p string) bool { return p == prefix || strings.HasPrefix(p, prefix+"/") })
}

const (
	sdk         = "github.com/aws/aws-sdk-go-v2"
	sdkServices = sdk + "/service/"
	lambdaGo    = "github.com/aws/aws-lambda-go"
	apiProxy    = "github.com/awslabs/aws-lambda-go-api-proxy"
	openai      = "github.com/openai/openai-go"
)

// credentialServices are the service clients the SDK's configuration
// loader links into every function for its credential chain (SSO, STS
// web identity, sign-in); no code of ours calls them.
var credentialServices = []string{"signin", "sso", "ssooidc", "sts"}

// services returns the AWS service clients list links besides the
// credential chain's, by service package name.
func services(list []string) []string {
	var out []string
	for _, p := range list {
		name, ok := strings.CutPrefix(p, sdkServices)
		if ok && !strings.Contains(name, "/") && !slices.Contains(credentialServices, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// fnPackages are each function's own package (its handler and its
// wiring): no function links another's.
var fnPackages = map[string]string{
	"splitter":  "internal/lambdafn/splitterfn",
	"generator": "internal/lambdafn/generatorfn",
	"exporter":  "internal/lambdafn/exporterfn",
	"api":       "internal/lambdafn/apifn",
	"sweeper":   "internal/lambdafn/sweeperfn",
	"events":    "internal/lambdafn/eventsfn",
}

// handlerDeps lists what a function's handler file links: the packages its
// imports link (go list -deps of each), the rest of its own package (the
// wiring in wire.go, which builds the AWS clients) left out.
func handlerDeps(t *testing.T, file string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../"+file, nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var out []string
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		cmd := exec.Command("go", "list", "-deps", "-tags", "lambda.norpc", "-f", "{{.ImportPath}}", path)
		cmd.Env = append(cmd.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
		list, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", path, err, list)
		}
		for _, d := range strings.Fields(string(list)) {
			if !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
	}
	return out
}

// checkLinks fails t unless what (a package or file) links, by list, every
// package of must and none of mustNot.
func checkLinks(t *testing.T, what string, list, must, mustNot []string) {
	t.Helper()
	for _, p := range must {
		if !links(list, p) {
			t.Errorf("%s does not link %s; the test's picture of the layout is out of date", what, p)
		}
	}
	for _, p := range mustNot {
		if links(list, p) {
			t.Errorf("%s links %s", what, p)
		}
	}
}

// TestHandlersKeepToThePorts: each function's handler file (its package
// holds its wiring too) links neither the AWS SDK nor the model providers:
// it turns events into calls of the core and nothing else, so it is tested
// without AWS.
func TestHandlersKeepToThePorts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file          string
		must, mustNot []string
	}{
		{file: "internal/lambdafn/splitterfn/splitterfn.go", must: []string{lambdaGo + "/events"}, mustNot: []string{sdk, openai, mod + "internal/api"}},
		{file: "internal/lambdafn/generatorfn/generatorfn.go", must: []string{lambdaGo + "/events"}, mustNot: []string{sdk, openai, mod + "internal/api"}},
		{file: "internal/lambdafn/exporterfn/exporterfn.go", mustNot: []string{sdk, openai, mod + "internal/api"}},
		{file: "internal/lambdafn/sweeperfn/sweeperfn.go", must: []string{lambdaGo + "/events"}, mustNot: []string{sdk, openai, mod + "internal/api"}},
		{file: "internal/lambdafn/apifn/apifn.go", must: []string{lambdaGo + "/events", apiProxy}, mustNot: []string{sdk, openai, mod + "internal/pipeline"}},
		{file: "internal/lambdafn/eventsfn/eventsfn.go", must: []string{lambdaGo + "/lambdaurl"}, mustNot: []string{sdk, openai, apiProxy, mod + "internal/pipeline"}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			checkLinks(t, tc.file, handlerDeps(t, tc.file), tc.must, tc.mustNot)
		})
	}
}

// TestDependencyEdges asserts the layering and that each Lambda function
// links only what it uses: exactly the AWS service clients of the
// operations it performs (TestIAMGrantsMatchUse, on the emulator, holds
// those operations against each role's grants in template.yaml), no other
// function's handler or wiring, and nothing of the model provider, the
// quota or the HTTP API unless it is the function that calls them. The
// core (internal/pipeline) and the handlers never import the AWS SDK.
func TestDependencyEdges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pkg      string
		services []string // exactly these service clients (nil: none)
		must     []string
		mustNot  []string
	}{
		{pkg: "internal/pipeline", mustNot: []string{sdk, lambdaGo, openai, apiProxy, mod + "internal/api", mod + "internal/lambdafn", mod + "internal/awswire", mod + "internal/quota"}},
		{pkg: "internal/awswire", services: []string{"dynamodb"}, mustNot: []string{openai, mod + "internal/lambdafn", mod + "internal/api"}},
		{
			pkg:      "functions/splitter",
			services: []string{"dynamodb", "s3", "sfn", "sqs"},
			// The upload records it reads are the core's (pipeline.BlobUploads), not the API's.
			mustNot: []string{openai, apiProxy, mod + "internal/api", mod + "internal/llm/openai", mod + "internal/llm/bedrock", mod + "internal/llm/sim", mod + "internal/quota"},
		},
		{
			pkg:      "functions/generator",
			services: []string{"bedrock", "bedrockruntime", "dynamodb", "s3", "sfn", "sqs", "ssm"},
			must:     []string{openai, mod + "internal/llm/bedrock", mod + "internal/quota/dynamoquota"},
			mustNot:  []string{apiProxy, mod + "internal/api"},
		},
		{
			pkg:      "functions/exporter",
			services: []string{"dynamodb", "s3"},
			mustNot:  []string{openai, apiProxy, lambdaGo + "/events", mod + "internal/api", mod + "internal/quota", mod + "internal/queue/sqsqueue", mod + "internal/stepfn"},
		},
		{
			pkg:      "functions/api",
			services: []string{"dynamodb", "s3", "sfn", "sqs"},
			must:     []string{apiProxy, mod + "internal/api"},
			mustNot:  []string{openai, mod + "internal/llm/openai", mod + "internal/llm/bedrock", mod + "internal/llm/sim", mod + "internal/quota"},
		},
		{
			// The event stream only reads: the task (DynamoDB), an upload
			// record and the presigned result link (S3), and checks the JWT.
			pkg:      "functions/events",
			services: []string{"dynamodb", "s3"},
			must:     []string{lambdaGo + "/lambdaurl", mod + "internal/api", mod + "internal/api/jwtauth"},
			mustNot:  []string{openai, apiProxy, mod + "internal/llm/openai", mod + "internal/quota", mod + "internal/queue/sqsqueue", mod + "internal/stepfn"},
		},
		{
			pkg:      "functions/sweeper",
			services: []string{"dynamodb", "sfn", "sqs"},
			mustNot:  []string{openai, apiProxy, mod + "internal/api", mod + "internal/blob/s3blob", mod + "internal/quota", mod + "internal/llm/openai", mod + "internal/llm/bedrock"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.pkg, func(t *testing.T) {
			t.Parallel()
			list := deps(t, tc.pkg)
			if diff := cmp.Diff(tc.services, services(list)); diff != "" {
				t.Errorf("%s links AWS service clients (-want +got):\n%s", tc.pkg, diff)
			}
			checkLinks(t, tc.pkg, list, tc.must, tc.mustNot)
			fn, isFunction := strings.CutPrefix(tc.pkg, "functions/")
			for other, p := range fnPackages {
				if got := links(list, mod+p); isFunction && got != (other == fn) {
					t.Errorf("%s links %s: %v, want %v", tc.pkg, p, got, other == fn)
				}
			}
		})
	}
}
