package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/batchgen/batchgen/internal/store"
)

// LocalOwner is the principal of tasks started from the command line, and
// of drop-folder inputs when the deployment names no other.
const LocalOwner = "local"

// OwnedTask returns task id when it belongs to owner. A task of another
// owner is store.ErrNotFound, exactly as a missing one, so that a caller
// learns nothing about tasks that are not theirs (not even that the id
// exists). Every API route on a task goes through it.
//
// A task without an owner (written before tasks had owners, or by a tool
// that names none) belongs to no principal: no caller of the API sees it,
// and it is not handed to the drop-folder principal either. Before owners
// existed an API upload and a dropped file were stored alike, so nothing
// tells them apart now, and DropFolderOwner may be set to one user's sub:
// giving that user every owner-less task could show them another user's
// sheet. Operators still see and manage such tasks with the ops commands
// (`batchgen tasks|status|cancel|retry --table`), which read the table
// with the stack's credentials and mark them "no owner".
func OwnedTask(ctx context.Context, st store.Store, owner, id string) (store.Task, error) {
	if owner == "" {
		return store.Task{}, fmt.Errorf("get task %s: no owner given: %w", id, store.ErrNotFound)
	}
	t, err := st.GetTask(ctx, id)
	if err != nil {
		return store.Task{}, err
	}
	if t.Owner != owner {
		return store.Task{}, fmt.Errorf("get task %s: %w", id, store.ErrNotFound)
	}
	return t, nil
}

// TaskPage is one page of an owner's tasks.
type TaskPage struct {
	// Tasks are newest first.
	Tasks []store.Task
	// Next resumes the listing after the last task; zero when there are no
	// more.
	Next store.TaskCursor
}

// ListOwnedTasks returns one page of owner's tasks, newest first, of at
// most limit (at least 1) tasks, starting after the cursor. A task without
// an owner is in no one's list (see OwnedTask).
func ListOwnedTasks(ctx context.Context, st store.Store, owner string, after store.TaskCursor, limit int) (TaskPage, error) {
	if owner == "" {
		return TaskPage{}, errors.New("list tasks: no owner given")
	}
	limit = max(limit, 1)
	// One more than asked tells whether another page exists.
	tasks, err := st.ListTasksByOwner(ctx, store.ListTasksByOwnerParams{Owner: owner, After: after, Limit: limit + 1})
	if err != nil {
		return TaskPage{}, err
	}
	page := TaskPage{Tasks: tasks}
	if len(tasks) > limit {
		page.Tasks = tasks[:limit]
		page.Next = tasks[limit-1].Cursor()
	}
	return page, nil
}
