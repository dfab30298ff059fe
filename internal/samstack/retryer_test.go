package samstack_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"

	"github.com/batchgen/batchgen/internal/samstack"
)

// TestSaidRetryerSaysWhatItRetries: an error the SDK retries after is
// written out with its text; one it gives up on is not; and every
// emulator client gets the retryer.
func TestSaidRetryerSaysWhatItRetries(t *testing.T) {
	var out strings.Builder
	r := samstack.SaidRetryer{RetryerV2: retry.NewStandard(), Out: &out}
	throttled := &smithy.GenericAPIError{Code: "ThrottlingException", Message: "slow down"}
	if !r.IsErrorRetryable(throttled) {
		t.Fatal("a throttling error is not retried")
	}
	if r.IsErrorRetryable(errors.New("malformed request")) {
		t.Fatal("a plain error is retried")
	}
	if got := out.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "retries after") || !strings.Contains(got, "ThrottlingException") {
		t.Errorf("written %q, want one line naming the throttling error", got)
	}

	t.Setenv(samstack.EndpointEnv, "http://127.0.0.1:1")
	cfg, err := samstack.Config(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg.Retryer().(samstack.SaidRetryer); !ok {
		t.Errorf("the emulator config's retryer is %T, want samstack.SaidRetryer", cfg.Retryer())
	}
}
