package splitterfn_test

import (
	"testing"

	"github.com/batchgen/batchgen/internal/lambdafn/lambdatest"
)

// env is the handlers' test adapters (lambdatest.Env) with this package's
// fixtures.
type env struct{ *lambdatest.Env }

func newEnv(t *testing.T) *env { return &env{lambdatest.NewEnv(t)} }
