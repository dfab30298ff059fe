package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
)

// stuckAfter is how long an unfinished task may go without progress before
// `batchgen tasks` calls it stuck.
const stuckAfter = 10 * time.Minute

// WriteTasks lays the tasks out (batchgen tasks); ROWS done are as saved so far, TOKENS the
// input/output tokens of the finished batches and COST their estimate at
// prices, each provider's tokens at its own price.
func WriteTasks(w io.Writer, tasks []pipeline.TaskOverview, rerun string, prices *pricing.Table) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tSTATE\tROWS\tSUCCEEDED\tFAILED\tTOKENS\tCOST\tSOURCE\tCREATED\tNOTE")
	for _, o := range tasks {
		t := o.Task
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d/%d\t%s\t%s\t%s\t%s\n", t.ID, t.State, t.RowsTotal, t.RowsSucceeded, t.RowsFailed,
			t.Usage.InputTokens, t.Usage.OutputTokens, prices.Task(t),
			t.Source, t.CreatedAt.Local().Format("2006-01-02 15:04"), taskNote(o, rerun))
	}
	return tw.Flush()
}

// taskNote tells an operator what needs attention: dead-lettered messages,
// no progress for a while, failed rows to retry. rerun says what to do
// about a task that stopped progressing.
func taskNote(o pipeline.TaskOverview, rerun string) string {
	t := o.Task
	var notes []string
	if o.Dead > 0 {
		notes = append(notes, fmt.Sprintf("stuck: %d dead-lettered message(s), see batchgen dlq list", o.Dead))
	}
	if !t.State.Final() && time.Since(t.UpdatedAt) > stuckAfter {
		notes = append(notes, fmt.Sprintf("no progress for %s (%s)", time.Since(t.UpdatedAt).Round(time.Minute), rerun))
	}
	if t.State.Final() && t.RowsFailed > 0 {
		notes = append(notes, "batchgen retry "+t.ID+" reruns the failed rows")
	}
	if t.Owner == "" {
		// Such a task belongs to no principal (pipeline.OwnedTask): the
		// ops commands are the only way to it.
		notes = append(notes, "no owner: not visible through the API")
	}
	return strings.Join(notes, "; ")
}

// WriteDeadLetters lays dead-lettered messages out (batchgen dlq list).
func WriteDeadLetters(w io.Writer, letters []pipeline.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tBATCH\tRECEIVES\tMESSAGE\tBODY")
	for _, l := range letters {
		task, batch := "?", "?"
		if l.TaskID != "" {
			task, batch = l.TaskID, fmt.Sprint(l.BatchNo)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.60q\n", task, batch, l.ReceiveCount, l.ID, l.Body)
	}
	return tw.Flush()
}
