// Package stepfn starts the export state machine (infra/statemachine/
// export.asl.json) on AWS Step Functions: the AWS implementation of
// pipeline.ExportStarter.
//
// The execution is named after the task and its export generation (see
// ExecutionName), and Step Functions keeps an execution name for 90 days
// after the execution closes, so starting an export is idempotent: a second
// start while the first runs (with the same input) returns the running
// execution, and one after it has closed fails with ExecutionAlreadyExists,
// which Starter treats as done. A task reopened by a retry has the next
// generation, hence a new name, and is exported again.
package stepfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
)

// Starter implements pipeline.ExportStarter; the assertion lives in the
// tests so that this package does not pull the pipeline into its importers.

// ErrInvalidName is returned for a task ID that Step Functions does not
// accept as an execution name.
var ErrInvalidName = errors.New("invalid execution name")

// maxNameLen is Step Functions' execution name limit.
const maxNameLen = 80

// FromConfig returns a Starter of the state machine stateMachineARN with a
// client built from cfg.
func FromConfig(cfg aws.Config, stateMachineARN string) Starter {
	return Starter{Client: sfn.NewFromConfig(cfg), StateMachineARN: stateMachineARN}
}

// Starter starts one export execution per task.
type Starter struct {
	// Client is the Step Functions client.
	Client *sfn.Client
	// StateMachineARN is the export state machine (STATE_MACHINE_ARN).
	StateMachineARN string
}

// input is the state machine's input.
type input struct {
	TaskID string `json:"task_id"`
}

// ExecutionName is the execution name of taskID's export of generation: the
// task ID for the first export (generation 0), so executions started before
// generations existed keep their names, then "<task>-g<generation>".
func ExecutionName(taskID string, generation int) string {
	if generation <= 0 {
		return taskID
	}
	return taskID + "-g" + strconv.Itoa(generation)
}

// StartExport starts the export execution of taskID's export generation,
// named ExecutionName(taskID, generation), with input {"task_id": taskID}. A
// start whose execution already exists is a no-op (nil).
func (s Starter) StartExport(ctx context.Context, taskID string, generation int) error {
	name := ExecutionName(taskID, generation)
	if err := checkName(name); err != nil {
		return fmt.Errorf("start export of %s: %w", taskID, err)
	}
	in, err := json.Marshal(input{TaskID: taskID})
	if err != nil {
		return fmt.Errorf("start export of %s: encode input: %w", taskID, err)
	}
	_, err = s.Client.StartExecution(ctx, &sfn.StartExecutionInput{
		StateMachineArn: aws.String(s.StateMachineARN),
		Name:            aws.String(name),
		Input:           aws.String(string(in)),
	})
	var exists *types.ExecutionAlreadyExists
	if errors.As(err, &exists) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("start export of %s on %s: %w", taskID, s.StateMachineARN, err)
	}
	return nil
}

// checkName returns ErrInvalidName unless name is a valid execution name:
// 1 to 80 characters, no whitespace, control characters, or any of
// < > { } [ ] ? * " # % \ ^ | ~ ` $ & , ; : /.
func checkName(name string) error {
	if name == "" || len([]rune(name)) > maxNameLen {
		return fmt.Errorf("%w %q: want 1 to %d characters", ErrInvalidName, name, maxNameLen)
	}
	for _, r := range name {
		if unicode.IsSpace(r) || unicode.IsControl(r) || strings.ContainsRune("<>{}[]?*\"#%\\^|~`$&,;:/", r) {
			return fmt.Errorf("%w %q: character %q is not allowed", ErrInvalidName, name, r)
		}
	}
	return nil
}
