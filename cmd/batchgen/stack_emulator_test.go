//go:build emulator

package main

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/batchgen/batchgen/internal/samstack"
)

// deployedStack provisions template.yaml's resources on the emulator under a
// unique prefix, deletes them when the test ends, and sets the credentials
// and region the batchgen binary reads, so a test can run the ops commands
// against "the deployed stack" as an operator would.
func deployedStack(t *testing.T, prefix string) (aws.Config, *samstack.Resources) {
	t.Helper()
	ctx := context.Background()
	cfg, err := samstack.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := samstack.Provision(ctx, cfg, "../../template.yaml", samstack.UniquePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Cleanup(context.Background()) })
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_REGION", samstack.Region)
	return cfg, res
}
