// Package samstack deploys template.yaml onto an AWS API endpoint and
// points the SDK at it: Provision submits the template itself, SAM-translated
// as `sam deploy` submits it, through the endpoint's CloudFormation (the
// moto server that infra/emulator/start.sh starts, which prints
// AWS_ENDPOINT_URL), and tracks what it made so Cleanup can remove it.
// localrun runs the stack's functions in process against what was
// provisioned (batchgen-localaws, the end-to-end tests); samgrants reads the
// template's roles for the tests that hold each function's operations
// against its policy. It is not an emulator: the emulator is moto.
//
// The AWS adapters (DynamoDB store, SQS queue, S3 blobs, Step Functions
// export trigger) are tested on a stack it provisioned, so a template that
// disagrees with the code fails the adapters' tests instead of a
// deployment. Provision needs the project's Python virtualenv
// (infra/venv.sh) for the SAM translator.
//
// The package is plain Go so that `go vet ./...` sees it; tests that need the
// emulator carry the build tag `emulator` and fail, never skip, when
// AWS_ENDPOINT_URL is unset.
package samstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// EndpointEnv is the environment variable naming the emulator's endpoint,
// e.g. http://127.0.0.1:50925. The AWS SDKs and CLI read the same variable.
const EndpointEnv = "AWS_ENDPOINT_URL"

// Region is the region every emulator client uses.
const Region = "us-east-1"

// EmulatorRequestTimeout bounds one HTTP attempt against the emulator.
const EmulatorRequestTimeout = time.Minute

// AccountID is the account the emulator reports for static test credentials
// (moto's default). Placeholder ARNs for resources that are not provisioned,
// such as Lambda functions, use it.
const AccountID = "123456789012"

// ErrNoEndpoint is returned by Config when AWS_ENDPOINT_URL is unset. Tests
// fail on it: start the emulator with infra/emulator/start.sh.
var ErrNoEndpoint = errors.New(EndpointEnv + " is not set; start the emulator with infra/emulator/start.sh and export the line it prints")

// Config returns an aws.Config for the emulator at AWS_ENDPOINT_URL, with
// static test credentials and region us-east-1. It does not read shared AWS
// config files or profiles, so a developer's real credentials can never be
// used by a test. It returns ErrNoEndpoint when the variable is unset.
func Config(ctx context.Context) (aws.Config, error) {
	if err := ctx.Err(); err != nil {
		return aws.Config{}, fmt.Errorf("emulator config: %w", err)
	}
	endpoint := os.Getenv(EndpointEnv)
	if endpoint == "" {
		return aws.Config{}, ErrNoEndpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return aws.Config{}, fmt.Errorf("%s=%q: %w", EndpointEnv, endpoint, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return aws.Config{}, fmt.Errorf("%s=%q: want http(s)://host:port", EndpointEnv, endpoint)
	}
	return aws.Config{
		Region:       Region,
		Credentials:  aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("test", "test", "")),
		BaseEndpoint: aws.String(endpoint),
		// A bound on each attempt, which the SDK then retries: in AWS a
		// Lambda's deadline bounds a call that hangs, but a run against the
		// emulator has no deadline, and a request moto never answers
		// (seen under many concurrent requests) would stall a function
		// silently until the test's own timeout. The longest call made here
		// is a 20 s long poll.
		HTTPClient: emulatorHTTPClient{awshttp.NewBuildableClient().WithTimeout(EmulatorRequestTimeout)},
		Retryer:    func() aws.Retryer { return SaidRetryer{RetryerV2: retry.NewStandard(), Out: os.Stderr} },
	}, nil
}

// emulatorHTTPClient sends each request's body in memory, so that the
// transport writes a request's headers and body at once. With a body it
// cannot see the length of in memory (the SDK's), net/http flushes the
// headers first; on a loaded machine moto then answered now and then
// before the body came (a connection's log: headers out, a 200 in, the
// body out), net/http closed the connection on the late body's write, and
// the SDK sent the call again: the retries behind two emulator flakes.
type emulatorHTTPClient struct{ next aws.HTTPClient }

// maxInMemoryBody bounds the bodies emulatorHTTPClient reads into memory;
// a larger one (an S3 upload) goes as it is.
const maxInMemoryBody = 1 << 20

// Do implements aws.HTTPClient.
func (c emulatorHTTPClient) Do(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength > 0 && r.ContentLength <= maxInMemoryBody {
		b, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("read the request body: %w", err)
		}
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	return c.next.Do(r)
}

// SaidRetryer is the SDK's retryer that writes each error it retries
// after to Out. A retried write whose first answer the emulator lost is
// applied twice (an ADD counts twice, a message is sent twice), and a
// test that then fails shows this line beside its own message: the cause,
// which otherwise leaves no trace.
type SaidRetryer struct {
	aws.RetryerV2
	Out io.Writer
}

// IsErrorRetryable implements aws.Retryer, and says so when err is.
func (r SaidRetryer) IsErrorRetryable(err error) bool {
	ok := r.RetryerV2.IsErrorRetryable(err)
	if ok {
		fmt.Fprintf(r.Out, "emulator: the SDK retries after: %v\n", err)
	}
	return ok
}

// UniquePrefix returns base followed by a dash and 8 random hex digits, for
// Provision prefixes that must not collide across parallel tests and runs.
// base should be short, lowercase letters, digits and dashes.
func UniquePrefix(base string) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return base + "-" + hex.EncodeToString(b[:])
}
