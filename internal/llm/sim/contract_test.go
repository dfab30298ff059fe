package sim_test

import (
	"testing"
	"time"

	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/llm/llmtest"
	"github.com/batchgen/batchgen/internal/llm/sim"
)

// TestContract: the simulator's scripted faults (Config.Fault) fail as the
// real providers do.
func TestContract(t *testing.T) {
	llmtest.Run(t, func(t *testing.T, b llmtest.Behavior) llm.Provider {
		classes := map[llmtest.Behavior]llm.ErrorClass{
			llmtest.Throttle: llm.ClassRateLimited, llmtest.Overload: llm.ClassServer, llmtest.Reject: llm.ClassBadRequest,
			llmtest.Deny: llm.ClassAuth, llmtest.Filter: llm.ClassContentFilter,
		}
		cfg := sim.Config{}
		if class, ok := classes[b]; ok {
			cfg.Fault = func(llm.Request, int64) error { return &llm.Error{Class: class, Message: "scripted " + string(b)} }
		}
		if b == llmtest.Hang {
			cfg.Latency = time.Hour
		}
		return sim.New(cfg)
	})
}
