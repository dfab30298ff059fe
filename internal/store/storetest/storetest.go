// Package storetest is the conformance suite for store.Store and store.Cache
// adapters. Every adapter's tests call Run (and RunCache) so that the
// pipeline can rely on one set of semantics whichever backend it runs on.
//
// What the suite asks of an adapter beyond the doc comments in package store:
//   - newStore returns an empty store that no other test writes to (a fresh
//     database file, table or key prefix); subtests run in parallel.
//   - Times keep at least millisecond precision and may come back in any
//     location: the suite compares instants with time.Time.Equal, uses
//     millisecond-aligned times wherever a comparison decides an outcome
//     (lease expiry), and allows 1 ms of rounding in the round-trip tests.
//   - Every write that takes a Now sets UpdatedAt to it; TransitionTask to a
//     final state also sets FinishedAt to it.
//   - Nil and empty slices are interchangeable (Header, Values).
//   - Reads of a task that has no rows or batches return none, not an error.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/store"
)

// base is the suite's reference time: millisecond-aligned so that adapters
// that keep milliseconds compare exactly.
var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// runPrefix keeps IDs unique across runs against a persistent backend
// (an emulator table that outlives one go test invocation).
var runPrefix = strconv.FormatInt(time.Now().UnixNano(), 36)

var idSeq atomic.Int64

// newID returns an ID unique within this process and, via runPrefix, across runs.
func newID(kind string) string {
	return fmt.Sprintf("%s-%s-%d", kind, runPrefix, idSeq.Add(1))
}

// ptr returns a pointer to v, for the optional spec fields.
func ptr[T any](v T) *T { return &v }

// exactOpts compare stored values exactly, treating nil and empty slices alike.
var exactOpts = []cmp.Option{cmpopts.EquateEmpty()}

// roundTripOpts additionally allow the millisecond rounding adapters may do.
var roundTripOpts = []cmp.Option{cmpopts.EquateEmpty(), cmpopts.EquateApproxTime(time.Millisecond)}

// Run runs the store conformance suite. newStore must return a new, empty
// store for each call; it should register its own cleanup with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"TaskRoundTrip", testTaskRoundTrip},
		{"CreateTaskConflict", testCreateTaskConflict},
		{"GetTaskNotFound", testGetTaskNotFound},
		{"SetTerms", testSetTerms},
		{"ReopenCancelled", testReopenCancelled},
		{"TransitionTaskRecount", testTransitionTaskRecount},
		{"ListTasks", testListTasks},
		{"ListTasksByOwner", testListTasksByOwner},
		{"TransitionTask", testTransitionTask},
		{"PutRowsRoundTrip", testPutRowsRoundTrip},
		{"PutRowsIdempotent", testPutRowsIdempotent},
		{"PutRowsMany", testPutRowsMany},
		{"ListRows", testListRows},
		{"PutBatchesIdempotent", testPutBatchesIdempotent},
		{"GetBatchNotFound", testGetBatchNotFound},
		{"ListBatches", testListBatches},
		{"ListOpenBatches", testListOpenBatches},
		{"ListOpenBatchesPaged", testListOpenBatchesPaged},
		{"ParkBatch", testParkBatch},
		{"StrandedBatches", testStrandedBatches},
		{"ReopenTask", testReopenTask},
		{"NextExportGen", testNextExportGen},
		{"TouchBatch", testTouchBatch},
		{"ClaimBatch", testClaimBatch},
		{"ClaimBatchRefused", testClaimBatchRefused},
		{"RenewLease", testRenewLease},
		{"ReleaseBatch", testReleaseBatch},
		{"SaveRowResults", testSaveRowResults},
		{"SaveRowResultsFenced", testSaveRowResultsFenced},
		{"SaveRowResultsCancelled", testSaveRowResultsCancelled},
		{"SaveRowResultsCache", testSaveRowResultsCache},
		{"SaveRowResultsInvalid", testSaveRowResultsInvalid},
		{"FinishBatch", testFinishBatch},
		{"FinishBatchFenced", testFinishBatchFenced},
		{"FinishBatchUsageRefused", testFinishBatchUsageRefused},
		{"UsageByProvider", testUsageByProvider},
		{"ConcurrentClaim", testConcurrentClaim},
		{"ConcurrentFinish", testConcurrentFinish},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// wantErr fails the test unless err matches target (errors.Is).
func wantErr(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error = %v, want %v", what, err, target)
	}
}

// noErr fails the test on a non-nil err.
func noErr(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// sampleTask returns a task with every field set, as a split would create it.
func sampleTask() store.Task {
	return store.Task{
		ID:    newID("task"),
		State: store.TaskRunning,
		Spec: store.TaskSpec{
			Prompt:    "为商品{{商品名称}}（类目：{{类目}}）写一段 50 字以内的营销文案",
			Provider:  "sim",
			BatchSize: 100,
		},
		Source:    "incoming/products.xlsx",
		Sheet:     "Sheet1",
		Header:    []string{"商品名称", "类目"},
		CreatedAt: base,
		UpdatedAt: base,
	}
}

// seed creates a RUNNING task with nBatches batches numbered from 1 of size
// rows each, rows numbered from 1, and returns the task as stored.
func seed(t *testing.T, s store.Store, nBatches, size int) store.Task {
	t.Helper()
	return seedTask(t, s, nBatches, size, true)
}

// seedTask is seed, with the rows written only when withRows is set: a
// test of batches alone (the sweeper's index) spends no writes on rows.
func seedTask(t *testing.T, s store.Store, nBatches, size int, withRows bool) store.Task {
	t.Helper()
	ctx := t.Context()
	task := sampleTask()
	task.RowsTotal = nBatches * size
	task.BatchesTotal = nBatches
	noErr(t, s.CreateTask(ctx, task), "seed: create task")
	if !withRows {
		noErr(t, s.PutBatches(ctx, seedBatches(task.ID, nBatches, size)), "seed: put batches")
		return task
	}
	rows := make([]store.Row, 0, nBatches*size)
	for no := 1; no <= nBatches*size; no++ {
		rows = append(rows, store.Row{
			TaskID:   task.ID,
			No:       no,
			SheetRow: no + 1,
			Values:   []string{fmt.Sprintf("item %d", no), "toys"},
		})
	}
	noErr(t, s.PutRows(ctx, rows), "seed: put rows")
	noErr(t, s.PutBatches(ctx, seedBatches(task.ID, nBatches, size)), "seed: put batches")
	return task
}

// seedBatches are the nBatches batches of size rows of task id.
func seedBatches(id string, nBatches, size int) []store.Batch {
	batches := make([]store.Batch, 0, nBatches)
	for no := 1; no <= nBatches; no++ {
		batches = append(batches, store.Batch{
			TaskID:    id,
			No:        no,
			FirstRow:  (no-1)*size + 1,
			RowCount:  size,
			CreatedAt: base,
			UpdatedAt: base,
		})
	}
	return batches
}

// claim claims a batch at now with a one-minute lease and fails the test
// if it cannot.
func claim(t *testing.T, s store.Store, taskID string, no int, owner string, now time.Time) store.Batch {
	t.Helper()
	b, err := s.ClaimBatch(t.Context(), store.ClaimBatchParams{
		TaskID: taskID, BatchNo: no, Owner: owner, Now: now, LeaseUntil: now.Add(time.Minute),
	})
	noErr(t, err, fmt.Sprintf("claim batch %s/%d by %s", taskID, no, owner))
	return b
}

// getTask reads a task and fails the test if it cannot.
func getTask(t *testing.T, s store.Store, id string) store.Task {
	t.Helper()
	got, err := s.GetTask(t.Context(), id)
	noErr(t, err, "get task "+id)
	return got
}

// getBatch reads a batch and fails the test if it cannot.
func getBatch(t *testing.T, s store.Store, taskID string, no int) store.Batch {
	t.Helper()
	got, err := s.GetBatch(t.Context(), taskID, no)
	noErr(t, err, fmt.Sprintf("get batch %s/%d", taskID, no))
	return got
}

// listRows reads all rows of a task and fails the test if it cannot.
func listRows(t *testing.T, s store.Store, taskID string) []store.Row {
	t.Helper()
	got, err := s.ListRows(t.Context(), store.ListRowsParams{TaskID: taskID})
	noErr(t, err, "list rows of "+taskID)
	return got
}

// diff fails the test when want and got differ.
func diff(t *testing.T, what string, want, got any, opts ...cmp.Option) {
	t.Helper()
	if opts == nil {
		opts = exactOpts
	}
	if d := cmp.Diff(want, got, opts...); d != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", what, d)
	}
}

func testTaskRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	// Sub-millisecond parts check that adapters keep at least milliseconds.
	created := base.Add(123456789 * time.Nanosecond)
	tests := []struct {
		name string
		task store.Task
	}{
		{
			name: "every field",
			task: store.Task{
				ID:    newID("task"),
				State: store.TaskPartial,
				Spec: store.TaskSpec{
					Prompt:       "Write copy for {{name}} in {{category}}",
					System:       "You are a copywriter.",
					Provider:     "openai",
					Model:        "gpt-4o-mini",
					Temperature:  ptr(0.7),
					TopP:         ptr(0.0),
					MaxTokens:    256,
					BatchSize:    50,
					ResultFormat: store.ResultCSV,
				},
				Owner:         "alice",
				Source:        "incoming/商品.xlsx",
				Sheet:         "Products",
				Encoding:      "windows-1252",
				Delimiter:     ";",
				Rerun:         &store.RerunCounts{Kept: 4900, Changed: 30, New: 2, Cleared: 10, Flagged: 20, Failed: 28, Blank: 10},
				Header:        []string{"name", "category", "价格", ""},
				RowsTotal:     5000,
				BatchesTotal:  100,
				BatchesDone:   99,
				RowsSucceeded: 4900,
				RowsFailed:    90,
				RowsSkipped:   10,
				Usage:         store.Usage{InputTokens: 5000, OutputTokens: 700, CachedInputTokens: 1024},
				UsageByProvider: map[string]store.Usage{
					"openai/gpt-4o-mini":                 {InputTokens: 3000, OutputTokens: 500, CachedInputTokens: 1024},
					"bedrock/anthropic.claude-3-haiku:0": {InputTokens: 1990, OutputTokens: 200},
					"":                                   {InputTokens: 10},
				},
				ResultKey:  "results/task.xlsx",
				Error:      "row 17: content filter",
				CreatedAt:  created,
				UpdatedAt:  created.Add(150 * time.Second),
				FinishedAt: created.Add(151 * time.Second).In(time.FixedZone("CST", 8*3600)),
			},
		},
		{
			name: "minimal",
			task: store.Task{
				ID:        newID("task"),
				State:     store.TaskPending,
				Spec:      store.TaskSpec{Prompt: "{{a}}", Provider: "sim", BatchSize: 100},
				CreatedAt: base,
				UpdatedAt: base,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			noErr(t, s.CreateTask(ctx, tt.task), "create task")
			got := getTask(t, s, tt.task.ID)
			diff(t, "task", tt.task, got, roundTripOpts...)
			if tt.task.FinishedAt.IsZero() && !got.FinishedAt.IsZero() {
				t.Errorf("FinishedAt = %v, want zero", got.FinishedAt)
			}
		})
	}
}

func testCreateTaskConflict(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := sampleTask()
	noErr(t, s.CreateTask(ctx, first), "first create")
	second := first
	second.State = store.TaskFailed
	second.Source = "other.csv"
	second.RowsTotal = 7
	wantErr(t, s.CreateTask(ctx, second), store.ErrConflict, "second create")
	diff(t, "task after conflicting create", first, getTask(t, s, first.ID))
	// The same create again (its first answer lost, the call retried) is
	// no conflict; the same task created at another time (a second split
	// of the same input) is.
	noErr(t, s.CreateTask(ctx, first), "identical create repeated")
	later := first
	later.CreatedAt, later.UpdatedAt = first.CreatedAt.Add(time.Second), first.UpdatedAt.Add(time.Second)
	wantErr(t, s.CreateTask(ctx, later), store.ErrConflict, "create of the same id at another time")
	diff(t, "task after repeated creates", first, getTask(t, s, first.ID))
}

func testGetTaskNotFound(t *testing.T, s store.Store) {
	_, err := s.GetTask(t.Context(), newID("missing"))
	wantErr(t, err, store.ErrNotFound, "get unknown task")
}

// testSetTerms: a task's terms (cap, mode, deadline, sample) are kept from its
// create, replaced together in any state, removed with zero values, and
// refused for an unknown task.
func testSetTerms(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := sampleTask()
	deadline := time.Date(2026, 12, 3, 9, 30, 0, 0, time.UTC)
	task.Terms = store.Terms{MaxCost: 1.25, Mode: store.ModeAuto, Deadline: deadline, Sample: 20}
	noErr(t, s.CreateTask(ctx, task), "create task")
	got, err := s.GetTask(ctx, task.ID)
	noErr(t, err, "get task")
	diff(t, "terms as created", task.Terms, got.Terms)
	for _, terms := range []store.Terms{
		{MaxCost: 7.5, Mode: store.ModeEconomy},
		{Sample: 35},
		{MaxCost: 0.000125, Mode: store.ModeAuto, Deadline: deadline.Add(90 * time.Minute)},
		{},
	} {
		updated, err := s.SetTerms(ctx, task.ID, terms)
		noErr(t, err, "set terms")
		diff(t, "terms returned", terms, updated.Terms)
		diff(t, "the rest of the task", task.Spec, updated.Spec)
		got, err := s.GetTask(ctx, task.ID)
		noErr(t, err, "get task")
		diff(t, "terms read back", terms, got.Terms)
	}
	_, err = s.SetTerms(ctx, newID("missing"), store.Terms{MaxCost: 1})
	wantErr(t, err, store.ErrNotFound, "set terms of an unknown task")
}

// testTransitionTaskRecount: a transition with a Recount replaces the
// task's row counts and token sums, in all and per provider; one without
// keeps them.
func testTransitionTaskRecount(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := sampleTask()
	task.State = store.TaskCancelled
	task.RowsSucceeded, task.RowsFailed = 1, 1
	task.Usage = store.Usage{InputTokens: 1, OutputTokens: 2}
	task.UsageByProvider = map[string]store.Usage{"a": {InputTokens: 1, OutputTokens: 2}}
	noErr(t, s.CreateTask(ctx, task), "create task")
	want := store.TaskRecount{
		Rows:       store.RowCounts{Succeeded: 7, Failed: 2, Skipped: 1},
		Total:      store.Usage{InputTokens: 30, OutputTokens: 50, CachedInputTokens: 5},
		ByProvider: map[string]store.Usage{"a": {InputTokens: 10, OutputTokens: 20}, "b/m-1": {InputTokens: 20, OutputTokens: 30, CachedInputTokens: 5}},
	}
	recount := func(t store.Task) store.TaskRecount {
		return store.TaskRecount{Rows: store.RowCounts{Succeeded: t.RowsSucceeded, Failed: t.RowsFailed, Skipped: t.RowsSkipped}, Total: t.Usage, ByProvider: t.UsageByProvider}
	}
	got, err := s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskCancelled}, To: store.TaskCancelled, Recount: &want, Now: base})
	noErr(t, err, "transition with a recount")
	diff(t, "recount returned", want, recount(got))
	got, err = s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskCancelled}, To: store.TaskCancelled, Now: base})
	noErr(t, err, "transition without a recount")
	diff(t, "recount kept", want, recount(got))
	read, err := s.GetTask(ctx, task.ID)
	noErr(t, err, "get task")
	diff(t, "recount read back", want, recount(read))
}

func testListTasks(t *testing.T, s store.Store) {
	ctx := t.Context()
	var ids []string
	// Created out of order so that insertion order cannot pass for age order.
	for _, offset := range []time.Duration{2 * time.Second, 0, 3 * time.Second, time.Second} {
		task := sampleTask()
		task.CreatedAt = base.Add(offset)
		task.UpdatedAt = task.CreatedAt
		noErr(t, s.CreateTask(ctx, task), "create task")
		ids = append(ids, task.ID)
	}
	newestFirst := []string{ids[2], ids[0], ids[3], ids[1]}
	tests := []struct {
		name  string
		limit int
		want  []string
	}{
		{"all", 0, newestFirst},
		{"limit 2", 2, newestFirst[:2]},
		{"limit 1", 1, newestFirst[:1]},
		{"limit above count", 10, newestFirst},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tasks, err := s.ListTasks(ctx, tt.limit)
			noErr(t, err, "list tasks")
			var got []string
			for _, task := range tasks {
				got = append(got, task.ID)
			}
			diff(t, "task IDs", tt.want, got)
		})
	}
}

func testListTasksByOwner(t *testing.T, s store.Store) {
	ctx := t.Context()
	// Owners unique to this store, so a shared backend cannot leak in.
	alice, bob := newID("alice"), newID("bob")
	create := func(owner string, offset time.Duration, id string) store.Task {
		task := sampleTask()
		if id != "" {
			task.ID = id
		}
		task.Owner = owner
		task.CreatedAt = base.Add(offset)
		task.UpdatedAt = task.CreatedAt
		noErr(t, s.CreateTask(ctx, task), "create task")
		return task
	}
	// Out of order, interleaved with another owner's and an ownerless
	// task, and two of alice's created at the same instant (ties go by id,
	// descending).
	a2 := create(alice, 2*time.Second, "")
	create(bob, 5*time.Second, "")
	a0 := create(alice, 0, "")
	create("", 4*time.Second, "")
	tieLow := create(alice, 3*time.Second, newID("a-tie"))
	tieHigh := create(alice, 3*time.Second, newID("b-tie"))
	a1 := create(alice, time.Second, "")
	newestFirst := []string{tieHigh.ID, tieLow.ID, a2.ID, a1.ID, a0.ID}

	list := func(p store.ListTasksByOwnerParams) []string {
		t.Helper()
		tasks, err := s.ListTasksByOwner(ctx, p)
		noErr(t, err, "list tasks by owner")
		var ids []string
		for _, task := range tasks {
			if task.Owner != p.Owner {
				t.Errorf("task %s of owner %q listed for %q", task.ID, task.Owner, p.Owner)
			}
			ids = append(ids, task.ID)
		}
		return ids
	}
	tests := []struct {
		name string
		p    store.ListTasksByOwnerParams
		want []string
	}{
		{"all", store.ListTasksByOwnerParams{Owner: alice}, newestFirst},
		{"limit 2", store.ListTasksByOwnerParams{Owner: alice, Limit: 2}, newestFirst[:2]},
		{"after the first of a tie", store.ListTasksByOwnerParams{Owner: alice, After: tieHigh.Cursor(), Limit: 2}, newestFirst[1:3]},
		{"after the oldest", store.ListTasksByOwnerParams{Owner: alice, After: a0.Cursor()}, nil},
		{"unknown owner", store.ListTasksByOwnerParams{Owner: newID("nobody")}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			diff(t, "task IDs", tt.want, list(tt.p))
		})
	}
	t.Run("paged through", func(t *testing.T) {
		var got []string
		p := store.ListTasksByOwnerParams{Owner: alice, Limit: 2}
		for range 10 {
			tasks, err := s.ListTasksByOwner(ctx, p)
			noErr(t, err, "list page")
			for _, task := range tasks {
				got = append(got, task.ID)
			}
			if len(tasks) < p.Limit {
				break
			}
			p.After = tasks[len(tasks)-1].Cursor()
		}
		diff(t, "task IDs over pages", newestFirst, got)
	})
}

func testTransitionTask(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := base.Add(time.Hour)
	tests := []struct {
		name    string
		initial store.Task // ID is filled in
		p       store.TransitionTaskParams
		wantErr error
		want    func(store.Task) store.Task // from initial; nil when an error is expected
	}{
		{
			name:    "allowed",
			initial: store.Task{State: store.TaskPending},
			p:       store.TransitionTaskParams{From: []store.TaskState{store.TaskPending}, To: store.TaskRunning},
			want: func(w store.Task) store.Task {
				w.State, w.UpdatedAt = store.TaskRunning, now
				return w
			},
		},
		{
			name:    "allowed from one of several, final records result key",
			initial: store.Task{State: store.TaskExporting},
			p: store.TransitionTaskParams{
				From:      []store.TaskState{store.TaskRunning, store.TaskExporting},
				To:        store.TaskSucceeded,
				ResultKey: "results/out.xlsx",
			},
			want: func(w store.Task) store.Task {
				w.State, w.UpdatedAt, w.FinishedAt, w.ResultKey = store.TaskSucceeded, now, now, "results/out.xlsx"
				return w
			},
		},
		{
			name:    "final records error",
			initial: store.Task{State: store.TaskRunning},
			p: store.TransitionTaskParams{
				From: []store.TaskState{store.TaskRunning}, To: store.TaskFailed, Error: "export: disk full",
			},
			want: func(w store.Task) store.Task {
				w.State, w.UpdatedAt, w.FinishedAt, w.Error = store.TaskFailed, now, now, "export: disk full"
				return w
			},
		},
		{
			name:    "empty error keeps the recorded one",
			initial: store.Task{State: store.TaskExporting, Error: "first export attempt failed"},
			p:       store.TransitionTaskParams{From: []store.TaskState{store.TaskExporting}, To: store.TaskPartial},
			want: func(w store.Task) store.Task {
				w.State, w.UpdatedAt, w.FinishedAt = store.TaskPartial, now, now
				return w
			},
		},
		{
			name:    "denied",
			initial: store.Task{State: store.TaskPending},
			p: store.TransitionTaskParams{
				From: []store.TaskState{store.TaskRunning, store.TaskExporting}, To: store.TaskCancelled, Error: "x",
			},
			wantErr: store.ErrConflict,
		},
		{
			name:    "denied from final",
			initial: store.Task{State: store.TaskSucceeded, FinishedAt: base},
			p:       store.TransitionTaskParams{From: []store.TaskState{store.TaskRunning}, To: store.TaskRunning},
			wantErr: store.ErrConflict,
		},
		{
			name:    "empty From allows nothing",
			initial: store.Task{State: store.TaskPending},
			p:       store.TransitionTaskParams{To: store.TaskRunning},
			wantErr: store.ErrConflict,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			initial := sampleTask()
			initial.State, initial.Error, initial.FinishedAt = tt.initial.State, tt.initial.Error, tt.initial.FinishedAt
			noErr(t, s.CreateTask(ctx, initial), "create task")
			p := tt.p
			p.ID, p.Now = initial.ID, now
			got, err := s.TransitionTask(ctx, p)
			if tt.wantErr != nil {
				wantErr(t, err, tt.wantErr, "transition")
				diff(t, "task after refused transition", initial, getTask(t, s, initial.ID))
				return
			}
			noErr(t, err, "transition")
			want := tt.want(initial)
			diff(t, "returned task", want, got)
			diff(t, "stored task", want, getTask(t, s, initial.ID))
		})
	}
	t.Run("unknown task", func(t *testing.T) {
		_, err := s.TransitionTask(ctx, store.TransitionTaskParams{
			ID: newID("missing"), From: []store.TaskState{store.TaskPending}, To: store.TaskRunning, Now: now,
		})
		wantErr(t, err, store.ErrNotFound, "transition unknown task")
	})
}

func testPutRowsRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := sampleTask()
	noErr(t, s.CreateTask(ctx, task), "create task")
	rows := []store.Row{
		{TaskID: task.ID, No: 1, SheetRow: 2, Values: []string{"积木", "玩具"}},
		{TaskID: task.ID, No: 2, SheetRow: 4, Values: []string{"", ""}, RowResult: store.RowResult{State: store.RowSkipped}},
		{TaskID: task.ID, No: 3, SheetRow: 5, Values: []string{"kite", ""}, RowResult: store.RowResult{State: store.RowPending}},
		{TaskID: task.ID, No: 4, SheetRow: 6, Values: []string{"a \"quoted\"\nline", "x,y"}},
		// A row of a result sent back in: one kept with its answer, one
		// that asks for a new answer.
		{TaskID: task.ID, No: 5, SheetRow: 7, Values: []string{"kept", ""}, RowResult: store.RowResult{State: store.RowSucceeded, Output: "the answer", Cached: true}},
		{TaskID: task.ID, No: 6, SheetRow: 8, Values: []string{"flagged", ""}, Fresh: true},
	}
	noErr(t, s.PutRows(ctx, rows), "put rows")
	want := append([]store.Row(nil), rows...)
	// A row put without a state is stored as PENDING.
	want[0].State = store.RowPending
	want[3].State = store.RowPending
	want[5].State = store.RowPending
	diff(t, "rows", want, listRows(t, s, task.ID))
	noErr(t, s.PutRows(ctx, nil), "put no rows")
}

func testPutRowsIdempotent(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 1, 3)
	before := listRows(t, s, task.ID)
	b := claim(t, s, task.ID, 1, "w1", base.Add(time.Minute))
	result := store.RowResult{State: store.RowSucceeded, Output: "Bright kites", Attempts: 1, LatencyMS: 290}
	_, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{
		TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: []store.RowResultWrite{{RowNo: 2, Result: result}}, Now: base.Add(time.Minute),
	})
	noErr(t, err, "save row 2")

	// A resumed split puts the same rows again, possibly with changed
	// values; nothing already stored changes.
	again := make([]store.Row, len(before))
	for i, r := range before {
		again[i] = store.Row{TaskID: r.TaskID, No: r.No, SheetRow: r.SheetRow + 10, Values: []string{"changed"}}
	}
	noErr(t, s.PutRows(ctx, again), "put rows again")
	want := append([]store.Row(nil), before...)
	want[1].RowResult = result
	diff(t, "rows after second put", want, listRows(t, s, task.ID))
}

func testPutRowsMany(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := sampleTask()
	noErr(t, s.CreateTask(ctx, task), "create task")
	// More than any backend's single-request limit (DynamoDB: 25 items,
	// SQLite: 32766 variables) so that adapters must chunk.
	const n = 3001
	rows := make([]store.Row, n)
	for i := range rows {
		rows[i] = store.Row{TaskID: task.ID, No: i + 1, SheetRow: i + 2, Values: []string{strconv.Itoa(i + 1), "v"}}
	}
	noErr(t, s.PutRows(ctx, rows), "put rows")
	got := listRows(t, s, task.ID)
	if len(got) != n {
		t.Fatalf("listed %d rows, want %d", len(got), n)
	}
	for i, r := range got {
		if r.No != i+1 || r.SheetRow != i+2 || r.Values[0] != strconv.Itoa(i+1) || r.State != store.RowPending {
			t.Fatalf("row %d = %+v, want No %d in order and PENDING", i, r, i+1)
		}
	}
}

func testListRows(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 2, 5)
	seed(t, s, 1, 3) // rows of another task must not leak in
	seq := func(from, to int) []int {
		var out []int
		for i := from; i <= to; i++ {
			out = append(out, i)
		}
		return out
	}
	tests := []struct {
		name string
		p    store.ListRowsParams
		want []int
	}{
		{"all", store.ListRowsParams{}, seq(1, 10)},
		{"from", store.ListRowsParams{FromNo: 4}, seq(4, 10)},
		{"from to", store.ListRowsParams{FromNo: 3, ToNo: 5}, seq(3, 5)},
		{"single", store.ListRowsParams{FromNo: 7, ToNo: 7}, seq(7, 7)},
		{"limit", store.ListRowsParams{Limit: 4}, seq(1, 4)},
		{"from limit past end", store.ListRowsParams{FromNo: 8, Limit: 10}, seq(8, 10)},
		{"from to limit", store.ListRowsParams{FromNo: 3, ToNo: 9, Limit: 2}, seq(3, 4)},
		{"to past end", store.ListRowsParams{ToNo: 99}, seq(1, 10)},
		{"from past end", store.ListRowsParams{FromNo: 11}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.p
			p.TaskID = task.ID
			rows, err := s.ListRows(ctx, p)
			noErr(t, err, "list rows")
			var got []int
			for _, r := range rows {
				if r.TaskID != task.ID {
					t.Errorf("row %d has task %q, want %q", r.No, r.TaskID, task.ID)
				}
				got = append(got, r.No)
			}
			diff(t, "row numbers", tt.want, got)
		})
	}
	t.Run("unknown task", func(t *testing.T) {
		rows, err := s.ListRows(ctx, store.ListRowsParams{TaskID: newID("missing")})
		noErr(t, err, "list rows of unknown task")
		if len(rows) != 0 {
			t.Errorf("listed %d rows of an unknown task, want none", len(rows))
		}
	})
}

func testPutBatchesIdempotent(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := sampleTask()
	noErr(t, s.CreateTask(ctx, task), "create task")
	batches := []store.Batch{
		{TaskID: task.ID, No: 0, FirstRow: 1, RowCount: 100, CreatedAt: base, UpdatedAt: base},
		{TaskID: task.ID, No: 1, FirstRow: 101, RowCount: 100, CreatedAt: base, UpdatedAt: base},
		// Rows final at the split (skipped, kept) are counted as saved.
		{TaskID: task.ID, No: 2, FirstRow: 201, RowCount: 7, Saved: store.RowCounts{Succeeded: 4, Skipped: 2}, CreatedAt: base, UpdatedAt: base},
	}
	noErr(t, s.PutBatches(ctx, batches), "put batches")
	want := make([]store.Batch, len(batches))
	for i, b := range batches {
		b.State = store.BatchPending
		want[i] = b
		diff(t, fmt.Sprintf("batch %d", b.No), b, getBatch(t, s, task.ID, b.No))
	}

	now := base.Add(time.Minute)
	want[1] = claim(t, s, task.ID, 1, "w1", now)
	again := append([]store.Batch(nil), batches...)
	again[2].RowCount = 99
	noErr(t, s.PutBatches(ctx, again), "put batches again")
	got, err := s.ListBatches(ctx, store.ListBatchesParams{TaskID: task.ID})
	noErr(t, err, "list batches")
	diff(t, "batches after second put", want, got)
	noErr(t, s.PutBatches(ctx, nil), "put no batches")
}

func testGetBatchNotFound(t *testing.T, s store.Store) {
	task := seed(t, s, 1, 1)
	tests := []struct {
		name   string
		taskID string
		no     int
	}{
		{"unknown batch", task.ID, 2},
		{"unknown task", newID("missing"), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.GetBatch(t.Context(), tt.taskID, tt.no)
			wantErr(t, err, store.ErrNotFound, "get batch")
		})
	}
}

func testListBatches(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 4, 2)
	seed(t, s, 2, 2) // batches of another task must not leak in
	now := base.Add(time.Minute)
	b2 := claim(t, s, task.ID, 2, "w", now)
	b3 := claim(t, s, task.ID, 3, "w", now)
	_, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 3, Attempt: b3.Attempt, Succeeded: 2, Now: now})
	noErr(t, err, "finish batch 3")
	tests := []struct {
		name   string
		states []store.BatchState
		want   []int
	}{
		{"all", nil, []int{1, 2, 3, 4}},
		{"pending", []store.BatchState{store.BatchPending}, []int{1, 4}},
		{"running", []store.BatchState{store.BatchRunning}, []int{2}},
		{"open", []store.BatchState{store.BatchRunning, store.BatchPending}, []int{1, 2, 4}},
		{"done", []store.BatchState{store.BatchDone}, []int{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			batches, err := s.ListBatches(ctx, store.ListBatchesParams{TaskID: task.ID, States: tt.states})
			noErr(t, err, "list batches")
			var got []int
			for _, b := range batches {
				got = append(got, b.No)
				if b.No == 2 {
					diff(t, "running batch", b2, b)
				}
			}
			diff(t, "batch numbers", tt.want, got)
		})
	}
	t.Run("unknown task", func(t *testing.T) {
		batches, err := s.ListBatches(ctx, store.ListBatchesParams{TaskID: newID("missing")})
		noErr(t, err, "list batches of unknown task")
		if len(batches) != 0 {
			t.Errorf("listed %d batches of an unknown task, want none", len(batches))
		}
	})
}

// testListOpenBatches checks the sweeper's cross-task query. Other tests may
// share the backend (one DynamoDB table), so results are filtered to this
// test's tasks.
func testListOpenBatches(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := seed(t, s, 3, 2)
	b := seed(t, s, 2, 2)
	later := base.Add(time.Minute)
	claim(t, s, a.ID, 2, "w", later)
	a3 := claim(t, s, a.ID, 3, "w", later)
	_, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: a.ID, BatchNo: 3, Attempt: a3.Attempt, Succeeded: 2, Now: later})
	noErr(t, err, "finish batch 3")

	ours := func(before time.Time) []string {
		t.Helper()
		batches, err := s.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: before})
		noErr(t, err, "list open batches")
		var got []string
		var last time.Time
		for _, x := range batches {
			if x.UpdatedAt.Before(last) {
				t.Errorf("open batches not oldest first: %v after %v", x.UpdatedAt, last)
			}
			last = x.UpdatedAt
			if x.State == store.BatchDone {
				t.Errorf("done batch %s/%d listed as open", x.TaskID, x.No)
			}
			switch x.TaskID {
			case a.ID:
				got = append(got, fmt.Sprintf("a%d", x.No))
			case b.ID:
				got = append(got, fmt.Sprintf("b%d", x.No))
			}
		}
		slices.Sort(got)
		return got
	}
	diff(t, "open before the claims", []string{"a1", "b1", "b2"}, ours(base.Add(30*time.Second)))
	diff(t, "open after the claims", []string{"a1", "a2", "b1", "b2"}, ours(base.Add(2*time.Minute)))
	diff(t, "nothing changed before base", []string(nil), ours(base))

	limited, err := s.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: base.Add(2 * time.Minute), Limit: 1})
	noErr(t, err, "list open batches with limit")
	if len(limited) != 1 {
		t.Errorf("limit 1 returned %d batches", len(limited))
	}
}

// openOf lists open batches changed before before, page by page of limit
// from the start of the index, and returns them in listing order with the
// number of pages it took.
func openOf(t *testing.T, s store.Store, before time.Time, limit int) ([]store.Batch, int) {
	t.Helper()
	var all []store.Batch
	var after store.OpenCursor
	for pages := 1; ; pages++ {
		page, err := s.ListOpenBatches(t.Context(), store.ListOpenBatchesParams{UpdatedBefore: before, After: after, Limit: limit})
		noErr(t, err, fmt.Sprintf("list open batches, page %d", pages))
		all = append(all, page...)
		if len(page) < limit || limit == 0 {
			return all, pages
		}
		if pages > 10_000 {
			t.Fatalf("paging through open batches does not end")
		}
		after = page[len(page)-1].Cursor()
	}
}

// batchKeys names batches "task/no" in the order given.
func batchKeys(batches []store.Batch) []string {
	out := make([]string, len(batches))
	for i, b := range batches {
		out[i] = fmt.Sprintf("%s/%d", b.TaskID, b.No)
	}
	return out
}

// testListOpenBatchesPaged checks that a cursor pages through the open
// index in its order (change time, task, number), each batch exactly once,
// ties on the change time included.
func testListOpenBatchesPaged(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := seed(t, s, 7, 1) // seven batches changed at the same instant
	seed(t, s, 3, 1)
	later := base.Add(time.Minute)
	for _, no := range []int{2, 5} {
		b := claim(t, s, a.ID, no, "w", later)
		noErr(t, s.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: a.ID, BatchNo: no, Attempt: b.Attempt, Now: later}), "release")
	}
	whole, _ := openOf(t, s, later.Add(time.Second), 0)
	if len(whole) != 10 {
		t.Fatalf("unpaged listing has %d batches, want 10: %v", len(whole), batchKeys(whole))
	}
	want := batchKeys(whole)
	sorted := slices.Clone(whole)
	slices.SortStableFunc(sorted, func(x, y store.Batch) int {
		if c := x.UpdatedAt.Compare(y.UpdatedAt); c != 0 {
			return c
		}
		if c := strings.Compare(x.TaskID, y.TaskID); c != 0 {
			return c
		}
		return x.No - y.No
	})
	diff(t, "unpaged listing order (change time, task, number)", batchKeys(sorted), want)
	for _, limit := range []int{1, 2, 3, 4, 9, 10, 11} {
		got, pages := openOf(t, s, later.Add(time.Second), limit)
		diff(t, fmt.Sprintf("paged by %d", limit), want, batchKeys(got))
		if wantPages := 10/limit + 1; pages != wantPages {
			t.Errorf("paged by %d: %d pages, want %d", limit, pages, wantPages)
		}
	}
	// A cursor at or past UpdatedBefore gives an empty page, not an error.
	page, err := s.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: later, After: whole[len(whole)-1].Cursor(), Limit: 5})
	noErr(t, err, "list after the last batch")
	if len(page) != 0 {
		t.Errorf("listing after the window's end = %v, want nothing", batchKeys(page))
	}
}

// testParkBatch checks that a parked batch leaves the open index until its
// next change, and that the park is fenced on the change time it saw.
func testParkBatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 4, 1)
	later := base.Add(time.Minute)
	running := claim(t, s, task.ID, 2, "w", later)
	done := claim(t, s, task.ID, 3, "w", later)
	_, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 3, Attempt: done.Attempt, Succeeded: 1, Now: later})
	noErr(t, err, "finish batch 3")

	noErr(t, s.ParkBatch(ctx, store.ParkBatchParams{TaskID: task.ID, BatchNo: 1, UpdatedAt: base}), "park pending batch 1")
	noErr(t, s.ParkBatch(ctx, store.ParkBatchParams{TaskID: task.ID, BatchNo: 2, UpdatedAt: running.UpdatedAt}), "park running batch 2")
	noErr(t, s.ParkBatch(ctx, store.ParkBatchParams{TaskID: task.ID, BatchNo: 1, UpdatedAt: base}), "park batch 1 again")
	wantErr(t, s.ParkBatch(ctx, store.ParkBatchParams{TaskID: task.ID, BatchNo: 4, UpdatedAt: base.Add(-time.Second)}), store.ErrConflict, "park at a stale change time")
	wantErr(t, s.ParkBatch(ctx, store.ParkBatchParams{TaskID: task.ID, BatchNo: 3, UpdatedAt: later}), store.ErrConflict, "park a done batch")
	wantErr(t, s.ParkBatch(ctx, store.ParkBatchParams{TaskID: task.ID, BatchNo: 99, UpdatedAt: base}), store.ErrNotFound, "park a missing batch")

	open, _ := openOf(t, s, later.Add(time.Hour), 0)
	diff(t, "open after parking 1 and 2", []string{task.ID + "/4"}, batchKeys(open))
	diff(t, "a parked batch keeps its state", store.BatchPending, getBatch(t, s, task.ID, 1).State)

	// The next change puts a parked batch back: a claim of batch 1, a
	// release of batch 2 once its lease is gone.
	claim(t, s, task.ID, 1, "w2", later.Add(2*time.Minute))
	noErr(t, s.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: task.ID, BatchNo: 2, Attempt: running.Attempt, Now: later.Add(2 * time.Minute)}), "release batch 2")
	open, _ = openOf(t, s, later.Add(time.Hour), 0)
	got := batchKeys(open)
	slices.Sort(got)
	want := []string{task.ID + "/1", task.ID + "/2", task.ID + "/4"}
	slices.Sort(want)
	diff(t, "open after the parked batches changed", want, got)
}

// testStrandedBatches is the sweeper's starvation case: a cancelled task
// leaves thousands of open batches at the oldest end of the index, and one
// live batch of another task changed later. Paging must reach the live
// batch; parking the stranded ones must bring it to the first page.
func testStrandedBatches(t *testing.T, s store.Store) {
	ctx := t.Context()
	// Thousands of batches, as a cancelled big task leaves; no rows are
	// written (nothing here reads them), and pages of 1,000 still take the
	// paging through three pages. On the emulator every call counts.
	const stranded, page = 2000, 1000
	dead := seedTask(t, s, stranded, 1, false)
	live := seedTask(t, s, 1, 1, false)
	liveAt := base.Add(time.Minute)
	lb := claim(t, s, live.ID, 1, "w", liveAt)
	noErr(t, s.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: live.ID, BatchNo: 1, Attempt: lb.Attempt, Now: liveAt}), "release the live batch")
	before := liveAt.Add(time.Minute)

	first, err := s.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: before, Limit: page})
	noErr(t, err, "first page")
	if slices.Contains(batchKeys(first), live.ID+"/1") {
		t.Fatalf("the live batch is on the first page before parking; the test does not set up starvation")
	}
	all, pages := openOf(t, s, before, page)
	if len(all) != stranded+1 || all[len(all)-1].TaskID != live.ID {
		t.Fatalf("paging found %d batches in %d pages, last %v; want %d ending with the live batch", len(all), pages, batchKeys(all[max(0, len(all)-1):]), stranded+1)
	}
	seen := map[string]bool{}
	for _, k := range batchKeys(all) {
		if seen[k] {
			t.Fatalf("paging listed %s twice", k)
		}
		seen[k] = true
	}

	_, err = s.TransitionTask(ctx, store.TransitionTaskParams{ID: dead.ID, From: []store.TaskState{store.TaskRunning}, To: store.TaskCancelled, Now: liveAt})
	noErr(t, err, "cancel the stranded task")
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, b := range all[:stranded] {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := s.ParkBatch(ctx, store.ParkBatchParams{TaskID: b.TaskID, BatchNo: b.No, UpdatedAt: b.UpdatedAt}); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	noErr(t, errors.Join(errs...), "park the stranded batches")
	first, err = s.ListOpenBatches(ctx, store.ListOpenBatchesParams{UpdatedBefore: before, Limit: page})
	noErr(t, err, "first page after parking")
	diff(t, "first page after parking", []string{live.ID + "/1"}, batchKeys(first))
}

// reopener is the retry port (pipeline.Reopener), which every adapter
// implements so that `batchgen retry` works on both runtimes.
type reopener interface {
	ReopenTask(ctx context.Context, taskID, errorClass string, now time.Time) (store.Task, []int, error)
}

// reopenLabels are the provider labels testReopenTask's rows record, by
// row number parity.
var reopenLabels = [2]string{"bedrock/anthropic.claude-3-haiku-20240307-v1:0", "openai/gpt-4o-mini"}

// testReopenTask finishes a task with two failed rows of different classes,
// reopens one class, and checks rows, batches, counters and the export
// generation.
// testReopenCancelled: a task cancelled while its batch was open refuses
// that batch's row saves (TaskCancelled); reopened, the batch's rows save
// again, and the retry runs to the end.
func testReopenCancelled(t *testing.T, s store.Store) {
	ctx := t.Context()
	r, ok := s.(reopener)
	if !ok {
		t.Fatalf("%T does not implement ReopenTask", s)
	}
	task := seed(t, s, 1, 3)
	at := base.Add(time.Minute)
	b := claim(t, s, task.ID, 1, "w", at)
	answer := func(no int) store.RowResult {
		return store.RowResult{State: store.RowSucceeded, Output: fmt.Sprintf("out %d", no), Attempts: 1}
	}
	res, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: []store.RowResultWrite{{RowNo: b.FirstRow, Result: answer(b.FirstRow)}}, Now: at})
	noErr(t, err, "save the first row")
	diff(t, "cancelled before the cancel", false, res.TaskCancelled)
	_, err = s.TransitionTask(ctx, store.EventCancel.Params(task.ID, at))
	noErr(t, err, "cancel")
	// A save in flight at the cancel: the adapter may keep it or not, but
	// says the task is cancelled.
	res, err = s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: []store.RowResultWrite{{RowNo: b.FirstRow + 1, Result: answer(b.FirstRow + 1)}}, Now: at})
	if err == nil && !res.TaskCancelled {
		t.Fatal("a row saved into a cancelled task's batch without TaskCancelled")
	}
	noErr(t, s.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, LastError: "task cancelled", Now: at}), "release")
	later := at.Add(time.Minute)
	_, batches, err := r.ReopenTask(ctx, task.ID, "", later)
	noErr(t, err, "reopen the cancelled task")
	diff(t, "batches to enqueue", []int{1}, batches)
	b = claim(t, s, task.ID, 1, "w2", later)
	rows, err := s.ListRows(ctx, store.ListRowsParams{TaskID: task.ID})
	noErr(t, err, "list rows")
	var writes []store.RowResultWrite
	for _, row := range rows {
		if !row.State.Final() {
			writes = append(writes, store.RowResultWrite{RowNo: row.No, Result: answer(row.No)})
		}
	}
	if len(writes) == 0 {
		t.Fatal("no row left to run after the reopen")
	}
	res, err = s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: writes, Now: later})
	noErr(t, err, "save the rows left after the reopen")
	diff(t, "cancelled after the reopen", false, res.TaskCancelled)
	_, err = s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 3, Now: later})
	noErr(t, err, "finish the reopened batch")
	diff(t, "batches done", 1, getTask(t, s, task.ID).BatchesDone)
}

func testReopenTask(t *testing.T, s store.Store) {
	ctx := t.Context()
	r, ok := s.(reopener)
	if !ok {
		t.Fatalf("%T does not implement ReopenTask", s)
	}
	task := seed(t, s, 3, 2)
	at := base.Add(time.Minute)
	failed := map[int]string{3: "server_error", 5: "content_filter"}
	for no := 1; no <= 3; no++ {
		b := claim(t, s, task.ID, no, "w", at)
		var ok, bad int
		var sum store.Usage
		split := map[string]store.Usage{}
		for row := b.FirstRow; row < b.FirstRow+b.RowCount; row++ {
			// Every row was billed 100 input and row-number output tokens.
			// Odd rows were answered by one provider, even rows by another.
			u := store.Usage{InputTokens: 100, OutputTokens: int64(row)}
			label := reopenLabels[row%2]
			res := store.RowResult{State: store.RowSucceeded, Output: fmt.Sprintf("out %d", row), Attempts: 1, Provider: label, Usage: u}
			if class, f := failed[row]; f {
				res = store.RowResult{State: store.RowFailed, Error: "boom", ErrorClass: class, Attempts: 3, Provider: label, Usage: u}
				bad++
			} else {
				ok++
			}
			sum = sum.Add(u)
			split[label] = split[label].Add(u)
			_, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: no, Attempt: b.Attempt, Rows: []store.RowResultWrite{{RowNo: row, Result: res}}, Now: at})
			noErr(t, err, "save row")
		}
		_, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: no, Attempt: b.Attempt, Succeeded: ok, Failed: bad,
			Usage: sum, UsageByProvider: split, Now: at})
		noErr(t, err, "finish batch")
	}
	_, err := s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskRunning}, To: store.TaskExporting, Now: at})
	noErr(t, err, "mark exporting")
	_, err = s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskExporting}, To: store.TaskPartial, ResultKey: "results/x.xlsx", Now: at})
	noErr(t, err, "mark partial")

	_, _, err = r.ReopenTask(ctx, task.ID, "no_such_class", at)
	noErr(t, err, "reopen a class no row has")
	diff(t, "task after reopening nothing", store.TaskPartial, getTask(t, s, task.ID).State)

	later := at.Add(time.Minute)
	got, batches, err := r.ReopenTask(ctx, task.ID, "server_error", later)
	noErr(t, err, "reopen server errors")
	diff(t, "batches to enqueue", []int{2}, batches)
	type counts struct {
		State                        store.TaskState
		Gen, Done, Succeeded, Failed int
		ResultKey                    string
		Usage                        store.Usage
		UsageByProvider              map[string]store.Usage
	}
	// The tokens of the batches still DONE (rows 1, 2, 5, 6) stay, split
	// by provider (odd rows 1 and 5, even rows 2 and 6); the reopened
	// batch's come back when it finishes again.
	kept := store.Usage{InputTokens: 400, OutputTokens: 1 + 2 + 5 + 6}
	keptSplit := map[string]store.Usage{
		reopenLabels[1]: {InputTokens: 200, OutputTokens: 1 + 5},
		reopenLabels[0]: {InputTokens: 200, OutputTokens: 2 + 6},
	}
	want := counts{State: store.TaskRunning, Gen: 1, Done: 2, Succeeded: 3, Failed: 1, Usage: kept, UsageByProvider: keptSplit}
	diff(t, "reopened task", want,
		counts{got.State, got.ExportGen, got.BatchesDone, got.RowsSucceeded, got.RowsFailed, got.ResultKey, got.Usage, got.UsageByProvider})
	stored := getTask(t, s, task.ID)
	diff(t, "stored task", want,
		counts{stored.State, stored.ExportGen, stored.BatchesDone, stored.RowsSucceeded, stored.RowsFailed, stored.ResultKey, stored.Usage, stored.UsageByProvider})
	rows := listRows(t, s, task.ID)
	var states []string
	for _, row := range rows {
		states = append(states, fmt.Sprintf("%d:%s:%s:%d:%s:%d/%d", row.No, row.State, row.ErrorClass, row.Attempts, row.Provider, row.InputTokens, row.OutputTokens))
	}
	odd, even := reopenLabels[1], reopenLabels[0]
	diff(t, "rows", []string{"1:SUCCEEDED::1:" + odd + ":100/1", "2:SUCCEEDED::1:" + even + ":100/2", "3:PENDING::0::0/0",
		"4:SUCCEEDED::1:" + even + ":100/4", "5:FAILED:content_filter:3:" + odd + ":100/5", "6:SUCCEEDED::1:" + even + ":100/6"}, states)
	if b := getBatch(t, s, task.ID, 2); b.State != store.BatchPending {
		t.Errorf("batch 2 is %s, want PENDING", b.State)
	}
	// The reopened batch counts the rows it still holds final (row 4);
	// the others keep the counts they finished with.
	for no, want := range map[int]store.RowCounts{1: {Succeeded: 2}, 2: {Succeeded: 1}, 3: {Succeeded: 1, Failed: 1}} {
		diff(t, fmt.Sprintf("batch %d saved counts after reopen", no), want, getBatch(t, s, task.ID, no).Saved)
	}
	open, _ := openOf(t, s, later.Add(time.Second), 0)
	diff(t, "open index after reopen", []string{task.ID + "/2"}, batchKeys(open))
	_, _, err = r.ReopenTask(ctx, task.ID, "", later)
	wantErr(t, err, store.ErrConflict, "reopen a running task")
}

// testNextExportGen: a re-export moves a finished task back to EXPORTING
// under its next export generation; other transitions keep it.
func testNextExportGen(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := sampleTask()
	task.State = store.TaskSucceeded
	noErr(t, s.CreateTask(ctx, task), "create task")
	got, err := s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskSucceeded}, To: store.TaskExporting, NextExportGen: true, Now: base})
	noErr(t, err, "re-export transition")
	diff(t, "generation after a re-export", 1, got.ExportGen)
	got, err = s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskExporting}, To: store.TaskSucceeded, ResultKey: "results/x.xlsx", Now: base})
	noErr(t, err, "finish the re-export")
	diff(t, "generation after an ordinary transition", 1, got.ExportGen)
	diff(t, "stored generation", 1, getTask(t, s, task.ID).ExportGen)
}

func testTouchBatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 2, 2)
	later := base.Add(time.Hour)
	noErr(t, s.TouchBatch(ctx, store.TouchBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: 0, Now: later}), "touch pending batch")
	got := getBatch(t, s, task.ID, 1)
	if !got.UpdatedAt.Equal(later) || got.State != store.BatchPending || got.Attempt != 0 {
		t.Errorf("touched batch = %+v, want PENDING attempt 0 updated at %v", got, later)
	}
	// A claimed batch, or a stale attempt, is not the sweeper's to touch.
	claimed := claim(t, s, task.ID, 2, "w", later)
	wantErr(t, s.TouchBatch(ctx, store.TouchBatchParams{TaskID: task.ID, BatchNo: 2, Attempt: claimed.Attempt, Now: later.Add(time.Minute)}), store.ErrConflict, "touch running batch")
	wantErr(t, s.TouchBatch(ctx, store.TouchBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: 5, Now: later}), store.ErrConflict, "touch at a stale attempt")
	diff(t, "running batch untouched", claimed, getBatch(t, s, task.ID, 2))
}

func testClaimBatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 2, 3)
	t1 := base.Add(time.Hour)
	lease := t1.Add(time.Minute)
	got, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 2, Owner: "w1", Now: t1, LeaseUntil: lease})
	noErr(t, err, "first claim")
	want := store.Batch{
		TaskID: task.ID, No: 2, FirstRow: 4, RowCount: 3, State: store.BatchRunning,
		Attempt: 1, LeaseUntil: lease, Owner: "w1", CreatedAt: base, UpdatedAt: t1,
	}
	diff(t, "claimed batch", want, got)
	diff(t, "stored batch", want, getBatch(t, s, task.ID, 2))

	// While the lease holds, and at its very end, nobody else gets the batch.
	for _, now := range []time.Time{t1, t1.Add(30 * time.Second), lease} {
		_, err = s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 2, Owner: "w2", Now: now, LeaseUntil: now.Add(time.Minute)})
		wantErr(t, err, store.ErrConflict, "claim at "+now.Sub(t1).String()+" into the lease")
	}
	diff(t, "batch after refused claims", want, getBatch(t, s, task.ID, 2))

	// Once the lease has expired, another worker takes over.
	t2 := lease.Add(time.Millisecond)
	got, err = s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 2, Owner: "w2", Now: t2, LeaseUntil: t2.Add(time.Minute)})
	noErr(t, err, "claim after lease expiry")
	want.Attempt, want.Owner, want.LeaseUntil, want.UpdatedAt = 2, "w2", t2.Add(time.Minute), t2
	diff(t, "batch after takeover", want, got)
	diff(t, "other batch untouched", store.BatchPending, getBatch(t, s, task.ID, 1).State)
}

func testClaimBatchRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 1, 2)
	now := base.Add(time.Hour)
	b := claim(t, s, task.ID, 1, "w1", now)
	_, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 2, Now: now})
	noErr(t, err, "finish batch")
	done := getBatch(t, s, task.ID, 1)
	tests := []struct {
		name    string
		taskID  string
		no      int
		now     time.Time
		wantErr error
	}{
		{"done", task.ID, 1, now.Add(time.Minute), store.ErrConflict},
		{"done long after its lease", task.ID, 1, now.Add(24 * time.Hour), store.ErrConflict},
		{"unknown batch", task.ID, 2, now, store.ErrNotFound},
		{"unknown task", newID("missing"), 1, now, store.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: tt.taskID, BatchNo: tt.no, Owner: "w2", Now: tt.now, LeaseUntil: tt.now.Add(time.Minute)})
			wantErr(t, err, tt.wantErr, "claim")
		})
	}
	diff(t, "done batch after refused claims", done, getBatch(t, s, task.ID, 1))
}

func testRenewLease(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 2, 2)
	t1 := base.Add(time.Hour)
	b := claim(t, s, task.ID, 1, "w1", t1)

	t2 := t1.Add(30 * time.Second)
	noErr(t, s.RenewLease(ctx, store.RenewLeaseParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, LeaseUntil: t2.Add(2 * time.Minute), Now: t2}), "renew")
	b.LeaseUntil, b.UpdatedAt = t2.Add(2*time.Minute), t2
	diff(t, "renewed batch", b, getBatch(t, s, task.ID, 1))
	// The renewed lease holds past the original one.
	_, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: 1, Owner: "w2", Now: t1.Add(90 * time.Second), LeaseUntil: t2.Add(time.Hour)})
	wantErr(t, err, store.ErrConflict, "claim within the renewed lease")

	tests := []struct {
		name    string
		no      int
		attempt int
	}{
		{"wrong attempt", 1, b.Attempt + 1},
		{"stale attempt", 1, b.Attempt - 1},
		{"batch not claimed", 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := getBatch(t, s, task.ID, tt.no)
			err := s.RenewLease(ctx, store.RenewLeaseParams{TaskID: task.ID, BatchNo: tt.no, Attempt: tt.attempt, LeaseUntil: t2.Add(time.Hour), Now: t2})
			wantErr(t, err, store.ErrConflict, "renew")
			diff(t, "batch after refused renewal", before, getBatch(t, s, task.ID, tt.no))
		})
	}

	t.Run("after takeover", func(t *testing.T) {
		t3 := b.LeaseUntil.Add(time.Second)
		b2 := claim(t, s, task.ID, 1, "w2", t3)
		err := s.RenewLease(ctx, store.RenewLeaseParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, LeaseUntil: t3.Add(time.Hour), Now: t3})
		wantErr(t, err, store.ErrConflict, "renew by the fenced-out owner")
		diff(t, "batch of the new owner", b2, getBatch(t, s, task.ID, 1))
	})
}

func testReleaseBatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 1, 2)
	t1 := base.Add(time.Hour)
	b := claim(t, s, task.ID, 1, "w1", t1)

	t2 := t1.Add(10 * time.Second)
	noErr(t, s.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, LastError: "429 rate limited", Now: t2}), "release")
	got := getBatch(t, s, task.ID, 1)
	if got.State != store.BatchPending || got.LastError != "429 rate limited" || got.Attempt != 1 || !got.UpdatedAt.Equal(t2) {
		t.Errorf("released batch = %+v, want PENDING, LastError recorded, Attempt 1, UpdatedAt %v", got, t2)
	}
	wantErr(t, s.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Now: t2}),
		store.ErrConflict, "second release")

	// Claimable again at once, although the old lease has not expired.
	b2 := claim(t, s, task.ID, 1, "w2", t2)
	if b2.Attempt != 2 || b2.Owner != "w2" {
		t.Errorf("claim after release = %+v, want Attempt 2 by w2", b2)
	}
	wantErr(t, s.ReleaseBatch(ctx, store.ReleaseBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, LastError: "late", Now: t2}),
		store.ErrConflict, "release by the fenced-out owner")
	diff(t, "batch of the new owner", b2, getBatch(t, s, task.ID, 1))
}

// writes builds a SaveRowResults group from row number, result pairs.
func writes(pairs ...any) []store.RowResultWrite {
	var out []store.RowResultWrite
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, store.RowResultWrite{RowNo: pairs[i].(int), Result: pairs[i+1].(store.RowResult)})
	}
	return out
}

func testSaveRowResults(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := sampleTask()
	noErr(t, s.CreateTask(ctx, task), "create task")
	rows := []store.Row{
		{TaskID: task.ID, No: 1, SheetRow: 2, Values: []string{"a"}},
		{TaskID: task.ID, No: 2, SheetRow: 3, Values: []string{"b"}},
		{TaskID: task.ID, No: 3, SheetRow: 4, Values: []string{"c"}},
		{TaskID: task.ID, No: 4, SheetRow: 5, Values: []string{""}, RowResult: store.RowResult{State: store.RowSkipped}},
		{TaskID: task.ID, No: 5, SheetRow: 6, Values: []string{"e"}},
		{TaskID: task.ID, No: 6, SheetRow: 7, Values: []string{"outside the batch"}},
	}
	noErr(t, s.PutRows(ctx, rows), "put rows")
	noErr(t, s.PutBatches(ctx, []store.Batch{{TaskID: task.ID, No: 1, FirstRow: 1, RowCount: 5, CreatedAt: base, UpdatedAt: base}}), "put batch")
	now := base.Add(time.Hour)
	b := claim(t, s, task.ID, 1, "w1", now)

	succeeded := store.RowResult{State: store.RowSucceeded, Output: "文案一", Attempts: 1, LatencyMS: 290,
		Provider: "bedrock/anthropic.claude-3-haiku", Usage: store.Usage{InputTokens: 1234, OutputTokens: 56, CachedInputTokens: 1000}}
	failed := store.RowResult{State: store.RowFailed, Error: "request timed out", ErrorClass: "transient", Attempts: 3, LatencyMS: 30000,
		Provider: "openai/gpt-4o-mini", Usage: store.Usage{InputTokens: 7}}
	// retried overwrites pending's error on row 5 with none.
	retried := store.RowResult{State: store.RowSucceeded, Output: "second time lucky", Attempts: 4, LatencyMS: 310, Cached: true}
	permanent := store.RowResult{State: store.RowFailed, Error: "content filter", ErrorClass: "permanent", Attempts: 1}
	pending := store.RowResult{State: store.RowPending, Error: "rate limited", ErrorClass: "rate_limited", Attempts: 2}
	steps := []struct {
		name    string
		attempt int
		rows    []store.RowResultWrite
		wantErr error
	}{
		{"a group of pending rows", b.Attempt, writes(1, succeeded, 2, failed, 5, pending), nil},
		{"a pending row may be written again", b.Attempt, writes(5, pending), nil},
		// A save whose answer was lost, sent again: the rows it made final
		// hold exactly it (to the save's time), so it is that save, and
		// counts nothing twice (Saved, below).
		{"the first group again, as it was", b.Attempt, writes(1, succeeded, 2, failed, 5, pending), nil},
		// All or nothing: row 3 would be writable, but row 1 is SUCCEEDED.
		{"a group with a succeeded row is refused whole", b.Attempt, writes(3, failed, 1, failed), store.ErrConflict},
		// A final row is never written twice, so Saved counts it once.
		{"a group with a failed row is refused whole", b.Attempt, writes(3, failed, 2, retried), store.ErrConflict},
		{"a group with a skipped row is refused whole", b.Attempt, writes(3, failed, 4, succeeded), store.ErrConflict},
		{"the first group again, later", b.Attempt, writes(1, succeeded, 2, failed), store.ErrConflict},
		{"a group with a row outside the batch is refused whole", b.Attempt, writes(3, failed, 6, succeeded), store.ErrConflict},
		{"an attempt that never claimed", b.Attempt + 1, writes(3, succeeded), store.ErrConflict},
		{"pending rows become final", b.Attempt, writes(5, retried, 3, permanent), nil},
		{"an empty group", b.Attempt, nil, nil},
	}
	for _, st := range steps {
		at := now
		if strings.HasSuffix(st.name, "later") {
			at = now.Add(time.Second)
		}
		res, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: st.attempt, Rows: st.rows, Now: at})
		if st.wantErr != nil {
			wantErr(t, err, st.wantErr, st.name)
		} else {
			noErr(t, err, st.name)
		}
		if res.TaskCancelled {
			t.Errorf("%s: TaskCancelled for a running task", st.name)
		}
	}
	want := append([]store.Row(nil), rows...)
	want[0].RowResult = succeeded
	want[1].RowResult = failed
	want[2].RowResult = permanent
	want[4].RowResult = retried
	want[5].RowResult = store.RowResult{State: store.RowPending}
	diff(t, "rows", want, listRows(t, s, task.ID))
	// Rows 1 and 5 succeeded, 2 and 3 failed, under this batch's claim;
	// the skipped row 4 was not given as saved when the batch was put.
	diff(t, "saved counts", store.RowCounts{Succeeded: 2, Failed: 2}, getBatch(t, s, task.ID, 1).Saved)
}

func testSaveRowResultsFenced(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 2, 3)
	t1 := base.Add(time.Hour)
	save := func(batch, attempt int, rows []store.RowResultWrite, now time.Time) error {
		_, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: batch, Attempt: attempt, Rows: rows, Now: now})
		return err
	}
	old := store.RowResult{State: store.RowFailed, Error: "late", ErrorClass: "transient", Attempts: 1}
	newer := store.RowResult{State: store.RowSucceeded, Output: "new owner's text", Attempts: 1, LatencyMS: 250}

	wantErr(t, save(1, 0, writes(1, newer), t1), store.ErrConflict, "save into an unclaimed batch")
	wantErr(t, save(3, 1, writes(1, newer), t1), store.ErrNotFound, "save into a missing batch")

	b1 := claim(t, s, task.ID, 1, "w1", t1)
	t2 := b1.LeaseUntil.Add(time.Second)
	b2 := claim(t, s, task.ID, 1, "w2", t2)
	noErr(t, save(1, b2.Attempt, writes(1, newer), t2), "save by the new owner")
	wantErr(t, save(1, b1.Attempt, writes(1, old), t2), store.ErrConflict, "late save over the new owner's result")
	wantErr(t, save(1, b1.Attempt, writes(2, old, 3, old), t2), store.ErrConflict, "late save into pending rows")

	_, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b2.Attempt, Succeeded: 1, Failed: 2, Now: t2})
	noErr(t, err, "finish")
	wantErr(t, save(1, b2.Attempt, writes(3, old), t2), store.ErrConflict, "save into a done batch")

	rows := listRows(t, s, task.ID)
	want := []store.RowResult{newer, {State: store.RowPending}, {State: store.RowPending}}
	var got []store.RowResult
	for _, r := range rows[:3] {
		got = append(got, r.RowResult)
	}
	diff(t, "row results", want, got)
}

// testSaveRowResultsCancelled: cancelling a task reaches its running batch
// through the batch's next group write, which is still saved.
func testSaveRowResultsCancelled(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 2, 3)
	now := base.Add(time.Hour)
	b1 := claim(t, s, task.ID, 1, "w1", now)
	ok := store.RowResult{State: store.RowSucceeded, Output: "done", Attempts: 1}
	res, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b1.Attempt, Rows: writes(1, ok), Now: now})
	noErr(t, err, "save before the cancel")
	if res.TaskCancelled {
		t.Error("TaskCancelled before the task was cancelled")
	}
	_, err = s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskRunning}, To: store.TaskCancelled, Now: now})
	noErr(t, err, "cancel")
	b2 := claim(t, s, task.ID, 2, "w2", now) // claimed after the cancel
	for _, c := range []struct {
		batch, attempt int
		rows           []store.RowResultWrite
	}{{1, b1.Attempt, writes(2, ok, 3, ok)}, {2, b2.Attempt, writes(4, ok)}} {
		res, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: c.batch, Attempt: c.attempt, Rows: c.rows, Now: now})
		noErr(t, err, fmt.Sprintf("save into batch %d after the cancel", c.batch))
		if !res.TaskCancelled {
			t.Errorf("batch %d: TaskCancelled = false after the task was cancelled", c.batch)
		}
	}
	// The fence still holds for a cancelled task's batch.
	_, err = s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 2, Attempt: b2.Attempt + 1, Rows: writes(5, ok), Now: now})
	wantErr(t, err, store.ErrConflict, "save by an attempt that never claimed, after the cancel")
	var got []store.RowState
	for _, r := range listRows(t, s, task.ID) {
		got = append(got, r.State)
	}
	diff(t, "row states", []store.RowState{store.RowSucceeded, store.RowSucceeded, store.RowSucceeded, store.RowSucceeded, store.RowPending, store.RowPending}, got)
}

// testSaveRowResultsCache: cache entries ride with the group: written when
// it is, kept first-wins, and not written when the group is refused.
func testSaveRowResultsCache(t *testing.T, s store.Store) {
	ctx := t.Context()
	c, ok := s.(store.Cache)
	if !ok {
		t.Fatalf("%T does not implement store.Cache; every store adapter keeps the result cache", s)
	}
	task := seed(t, s, 1, 3)
	now := base.Add(time.Hour)
	b := claim(t, s, task.ID, 1, "w1", now)
	k1, k2, k3 := newID("key"), newID("key"), newID("key")
	noErr(t, c.PutCached(ctx, k2, "cached before"), "put cached")
	ok1 := store.RowResult{State: store.RowSucceeded, Output: "one", Attempts: 1}
	_, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{
		TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: writes(1, ok1, 2, ok1),
		Cache: []store.CacheEntry{{Key: k1, Output: "one"}, {Key: k2, Output: "not kept"}, {Key: k1, Output: "not kept either"}},
		Now:   now,
	})
	noErr(t, err, "save with cache entries")
	_, err = s.SaveRowResults(ctx, store.SaveRowResultsParams{
		TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt + 1, Rows: writes(3, ok1),
		Cache: []store.CacheEntry{{Key: k3, Output: "refused"}}, Now: now,
	})
	wantErr(t, err, store.ErrConflict, "fenced save with a cache entry")
	got, err := c.GetCached(ctx, []string{k1, k2, k3, k1})
	noErr(t, err, "get cached")
	diff(t, "cached outputs", map[string]string{k1: "one", k2: "cached before"}, got)
}

func testSaveRowResultsInvalid(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 1, store.MaxSaveRows+1)
	now := base.Add(time.Hour)
	b := claim(t, s, task.ID, 1, "w1", now)
	ok := store.RowResult{State: store.RowSucceeded, Output: "x", Attempts: 1}
	var tooMany []store.RowResultWrite
	for no := 1; no <= store.MaxSaveRows+1; no++ {
		tooMany = append(tooMany, store.RowResultWrite{RowNo: no, Result: ok})
	}
	for _, tc := range []struct {
		name string
		rows []store.RowResultWrite
	}{
		{"more than MaxSaveRows rows", tooMany},
		{"a row twice", writes(1, ok, 1, ok)},
		{"an invalid state", writes(1, store.RowResult{State: "DONE"})},
	} {
		_, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: tc.rows, Now: now})
		if err == nil || errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: error = %v, want a validation error", tc.name, err)
		}
	}
	for _, r := range listRows(t, s, task.ID) {
		if r.State != store.RowPending {
			t.Fatalf("row %d is %s after refused groups, want PENDING", r.No, r.State)
		}
	}
	// At MaxSaveRows the group is written.
	_, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Rows: tooMany[:store.MaxSaveRows], Now: now})
	noErr(t, err, "save MaxSaveRows rows")
}

func testFinishBatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 2, 3)
	t1 := base.Add(time.Hour)
	b := claim(t, s, task.ID, 1, "w1", t1)
	t2 := t1.Add(20 * time.Second)
	u1 := store.Usage{InputTokens: 3_000_000_000, OutputTokens: 250, CachedInputTokens: 1024}
	split1 := map[string]store.Usage{"openai/gpt-4o-mini": u1}
	got, err := s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 1, Failed: 1, Skipped: 1,
		Usage: u1, UsageByProvider: split1, Now: t2})
	noErr(t, err, "finish")
	want := task
	want.BatchesDone, want.RowsSucceeded, want.RowsFailed, want.RowsSkipped, want.Usage, want.UpdatedAt = 1, 1, 1, 1, u1, t2
	want.UsageByProvider = split1
	diff(t, "returned task", want, got)
	diff(t, "stored task", want, getTask(t, s, task.ID))
	gotBatch := getBatch(t, s, task.ID, 1)
	if gotBatch.State != store.BatchDone || !gotBatch.UpdatedAt.Equal(t2) {
		t.Errorf("finished batch = %+v, want DONE updated at %v", gotBatch, t2)
	}
	diff(t, "finished batch's saved counts", store.RowCounts{Succeeded: 1, Failed: 1, Skipped: 1}, gotBatch.Saved)

	// The very finish sent again (a retry of one whose answer was lost) is
	// that finish: it answers the task, and counts nothing twice.
	got, err = s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 1, Failed: 1, Skipped: 1,
		Usage: u1, UsageByProvider: split1, Now: t2})
	noErr(t, err, "the same finish again")
	diff(t, "task returned by the same finish again", want, got)
	diff(t, "task after the same finish again", want, getTask(t, s, task.ID))
	// Any other finish of the DONE batch is a conflict: a later attempt's,
	// or this attempt's with other counts or at another time.
	for _, other := range []store.FinishBatchParams{
		{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt + 1, Succeeded: 1, Failed: 1, Skipped: 1, Now: t2},
		{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 3, Now: t2},
		{TaskID: task.ID, BatchNo: 1, Attempt: b.Attempt, Succeeded: 1, Failed: 1, Skipped: 1, Now: t2.Add(time.Second)},
	} {
		_, err = s.FinishBatch(ctx, other)
		wantErr(t, err, store.ErrConflict, fmt.Sprintf("another finish of the DONE batch (%+v)", other))
	}
	diff(t, "task after the other finishes", want, getTask(t, s, task.ID))

	b2 := claim(t, s, task.ID, 2, "w2", t2)
	t3 := t2.Add(time.Second)
	u2 := store.Usage{InputTokens: 10, OutputTokens: 20}
	got, err = s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: 2, Attempt: b2.Attempt, Succeeded: 3,
		Usage: u2, UsageByProvider: map[string]store.Usage{"openai/gpt-4o-mini": u2}, Now: t3})
	noErr(t, err, "finish last batch")
	want.BatchesDone, want.RowsSucceeded, want.UpdatedAt = 2, 4, t3
	want.Usage = u1.Add(u2)
	want.UsageByProvider = map[string]store.Usage{"openai/gpt-4o-mini": u1.Add(u2)}
	diff(t, "task after last batch", want, got)
}

func testFinishBatchFenced(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 2, 3)
	t1 := base.Add(time.Hour)
	finish := func(no, attempt int, now time.Time) (store.Task, error) {
		return s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: no, Attempt: attempt, Succeeded: 3, Now: now})
	}
	_, err := finish(2, 0, t1)
	wantErr(t, err, store.ErrConflict, "finish an unclaimed batch")

	b1 := claim(t, s, task.ID, 1, "w1", t1)
	t2 := b1.LeaseUntil.Add(time.Second)
	b2 := claim(t, s, task.ID, 1, "w2", t2)
	_, err = finish(1, b1.Attempt, t2)
	wantErr(t, err, store.ErrConflict, "finish by the fenced-out owner")
	diff(t, "task after fenced finish", task, getTask(t, s, task.ID))
	diff(t, "batch after fenced finish", b2, getBatch(t, s, task.ID, 1))

	got, err := finish(1, b2.Attempt, t2)
	noErr(t, err, "finish by the owner")
	if got.BatchesDone != 1 || got.RowsSucceeded != 3 {
		t.Errorf("task after finish: BatchesDone %d RowsSucceeded %d, want 1 and 3", got.BatchesDone, got.RowsSucceeded)
	}
	_, err = finish(1, b1.Attempt, t2)
	wantErr(t, err, store.ErrConflict, "finish a done batch by the fenced-out owner")
	diff(t, "task after all finishes", got, getTask(t, s, task.ID))
}

// workers is the number of goroutines racing in the concurrency tests.
const workers = 8

func testConcurrentClaim(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 1, 2)
	now := base.Add(time.Hour)
	start := make(chan struct{})
	errs := make([]error, workers)
	claimed := make([]store.Batch, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			<-start
			claimed[i], errs[i] = s.ClaimBatch(ctx, store.ClaimBatchParams{
				TaskID: task.ID, BatchNo: 1, Owner: fmt.Sprintf("w%d", i), Now: now, LeaseUntil: now.Add(time.Minute),
			})
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("workers %d and %d both claimed the batch", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, store.ErrConflict):
			t.Errorf("worker %d: error = %v, want %v", i, err, store.ErrConflict)
		}
	}
	if winner < 0 {
		t.Fatal("no worker claimed the batch")
	}
	got := getBatch(t, s, task.ID, 1)
	if got.Attempt != 1 || got.Owner != fmt.Sprintf("w%d", winner) {
		t.Errorf("batch = Attempt %d Owner %q, want Attempt 1 Owner w%d", got.Attempt, got.Owner, winner)
	}
	diff(t, "winner's claim", claimed[winner], got)
}

// finishCounts gives worker i's batch of 3 rows its own mix of outcomes, so
// that a lost or doubled counter update shows in the sums.
func finishCounts(i int) (succeeded, failed, skipped int) {
	failed, skipped = i%2, i/2%2
	return 3 - failed - skipped, failed, skipped
}

func testConcurrentFinish(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, workers, 3)
	now := base.Add(time.Hour)
	start := make(chan struct{})
	errs := make([]error, workers)
	done := make([]int, workers)
	var wg sync.WaitGroup
	for i := range workers {
		no := i + 1
		wg.Go(func() {
			<-start
			b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: no, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
			if err != nil {
				errs[i] = fmt.Errorf("claim: %w", err)
				return
			}
			succeeded, failed, skipped := finishCounts(i)
			got, err := s.FinishBatch(ctx, store.FinishBatchParams{
				TaskID: task.ID, BatchNo: no, Attempt: b.Attempt, Succeeded: succeeded, Failed: failed, Skipped: skipped, Now: now,
			})
			if err != nil {
				errs[i] = fmt.Errorf("finish: %w", err)
				return
			}
			done[i] = got.BatchesDone
		})
	}
	close(start)
	wg.Wait()
	wantSucceeded, wantFailed, wantSkipped := 0, 0, 0
	for i, err := range errs {
		noErr(t, err, fmt.Sprintf("worker %d", i))
		succeeded, failed, skipped := finishCounts(i)
		wantSucceeded += succeeded
		wantFailed += failed
		wantSkipped += skipped
	}
	got := getTask(t, s, task.ID)
	want := task
	want.BatchesDone, want.RowsSucceeded, want.RowsFailed, want.RowsSkipped, want.UpdatedAt = workers, wantSucceeded, wantFailed, wantSkipped, now
	diff(t, "task counters", want, got)

	// Whoever finishes last must see every batch done: that worker starts
	// the export. Adapters may read the task back after their atomic
	// update (DynamoDB transactions return nothing), so others may see
	// later increments too; starting the export is idempotent.
	sawLast := false
	for i, n := range done {
		if n < 1 || n > workers {
			t.Errorf("worker %d: FinishBatch returned BatchesDone %d, want 1..%d", i, n, workers)
		}
		sawLast = sawLast || n == workers
	}
	if !sawLast {
		t.Errorf("no FinishBatch returned BatchesDone %d; returned %v", workers, done)
	}
}

// RunCacheTTL checks that a cache entry is reused for the store's TTL and
// no longer: newCache must return a new cache whose clock is clk and whose
// TTL is ttl.
func RunCacheTTL(t *testing.T, newCache func(t *testing.T, clk clock.Clock, ttl time.Duration) store.Cache) {
	t.Helper()
	ctx := t.Context()
	clk := clock.NewFake(base)
	c := newCache(t, clk, time.Hour)
	key := newID("key")
	noErr(t, c.PutCached(ctx, key, "first"), "put")
	get := func(what string, want map[string]string) {
		t.Helper()
		got, err := c.GetCached(ctx, []string{key})
		noErr(t, err, "get "+what)
		diff(t, what, want, got)
	}
	clk.Advance(59 * time.Minute)
	get("before the TTL", map[string]string{key: "first"})
	clk.Advance(2 * time.Minute)
	get("after the TTL", map[string]string{})
}

// RunCache runs the cache conformance suite. newCache must return a new,
// empty cache for each call.
func RunCache(t *testing.T, newCache func(t *testing.T) store.Cache) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, ctx context.Context, c store.Cache)
	}{
		{"Miss", func(t *testing.T, ctx context.Context, c store.Cache) {
			got, err := c.GetCached(ctx, []string{newID("key")})
			noErr(t, err, "get")
			diff(t, "GetCached of a missing key", map[string]string{}, got)
			got, err = c.GetCached(ctx, nil)
			noErr(t, err, "get no keys")
			diff(t, "GetCached of no keys", map[string]string{}, got)
		}},
		{"RoundTrip", func(t *testing.T, ctx context.Context, c store.Cache) {
			key := newID("key")
			outputs := map[string]string{
				key + "-ascii":   "Bright kites for windy days.",
				key + "-unicode": "为孩子们准备的彩色积木，安全环保。🧱",
				key + "-empty":   "",
				key + "-large":   strings.Repeat("长文案 long copy ", 4000),
			}
			for k, out := range outputs {
				noErr(t, c.PutCached(ctx, k, out), "put "+k)
			}
			keys := []string{key + "-missing"}
			for k := range outputs {
				keys = append(keys, k)
			}
			got, err := c.GetCached(ctx, keys)
			noErr(t, err, "get")
			diff(t, "GetCached", outputs, got)
		}},
		{"ManyKeys", func(t *testing.T, ctx context.Context, c store.Cache) {
			// More keys than one batched read takes (DynamoDB: 100).
			key := newID("key")
			want := map[string]string{}
			var keys []string
			for i := range 250 {
				k := fmt.Sprintf("%s-%d", key, i)
				keys = append(keys, k)
				if i%3 == 0 {
					want[k] = fmt.Sprintf("out %d", i)
					noErr(t, c.PutCached(ctx, k, want[k]), "put "+k)
				}
			}
			got, err := c.GetCached(ctx, keys)
			noErr(t, err, "get")
			diff(t, "GetCached of 250 keys", want, got)
		}},
		{"KeepsFirst", func(t *testing.T, ctx context.Context, c store.Cache) {
			key := newID("key")
			noErr(t, c.PutCached(ctx, key, "first"), "first put")
			noErr(t, c.PutCached(ctx, key, "second"), "second put")
			got, err := c.GetCached(ctx, []string{key})
			noErr(t, err, "get")
			diff(t, "GetCached", map[string]string{key: "first"}, got)
		}},
		{"Concurrent", func(t *testing.T, ctx context.Context, c store.Cache) {
			key := newID("key")
			var wg sync.WaitGroup
			errs := make([]error, workers)
			for i := range workers {
				wg.Go(func() { errs[i] = c.PutCached(ctx, key, fmt.Sprintf("out %d", i)) })
			}
			wg.Wait()
			for i, err := range errs {
				noErr(t, err, fmt.Sprintf("put %d", i))
			}
			got, err := c.GetCached(ctx, []string{key})
			noErr(t, err, "get")
			if out, ok := got[key]; !ok || !strings.HasPrefix(out, "out ") {
				t.Errorf("GetCached = %q, %v; want one of the outputs put", out, ok)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, t.Context(), newCache(t))
		})
	}
}

// testFinishBatchUsageRefused: a finish whose counts a task must not take
// (negative, or a per-provider split that does not add up to the batch's
// tokens) is refused as invalid, and neither the batch nor the task moves.
func testFinishBatchUsageRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := seed(t, s, 1, 3)
	now := base.Add(time.Hour)
	b := claim(t, s, task.ID, 1, "w", now)
	u := store.Usage{InputTokens: 100, OutputTokens: 10}
	for _, tc := range []struct {
		name string
		p    store.FinishBatchParams
	}{
		{"a negative row count", store.FinishBatchParams{Succeeded: -1}},
		{"negative tokens", store.FinishBatchParams{Succeeded: 3, Usage: store.Usage{OutputTokens: -1},
			UsageByProvider: map[string]store.Usage{"a": {OutputTokens: -1}}}},
		{"a negative provider sum", store.FinishBatchParams{Succeeded: 3, Usage: u,
			UsageByProvider: map[string]store.Usage{"a": u.Add(u), "b": {InputTokens: -100, OutputTokens: -10}}}},
		{"tokens without their split", store.FinishBatchParams{Succeeded: 3, Usage: u}},
		{"a split short of the tokens", store.FinishBatchParams{Succeeded: 3, Usage: u,
			UsageByProvider: map[string]store.Usage{"a": {InputTokens: 100}}}},
		{"a split without tokens", store.FinishBatchParams{Succeeded: 3,
			UsageByProvider: map[string]store.Usage{"a": u}}},
	} {
		p := tc.p
		p.TaskID, p.BatchNo, p.Attempt, p.Now = task.ID, 1, b.Attempt, now
		_, err := s.FinishBatch(ctx, p)
		if err == nil || errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: error = %v, want a validation error", tc.name, err)
		}
	}
	diff(t, "task after refused finishes", task, getTask(t, s, task.ID))
	if got := getBatch(t, s, task.ID, 1); got.State != store.BatchRunning {
		t.Errorf("batch is %s after refused finishes, want RUNNING", got.State)
	}
}

// testUsageByProvider: a task routed over two providers keeps its tokens
// split by provider label (including rows without one) through finishes
// from concurrent workers, a reopen (recounted from the rows of the batches
// still DONE) and the reopened batch's second finish, and the split always
// adds up to the task's Usage.
func testUsageByProvider(t *testing.T, s store.Store) {
	ctx := t.Context()
	r, ok := s.(reopener)
	if !ok {
		t.Fatalf("%T does not implement ReopenTask", s)
	}
	const nBatches, size = 4, 3
	const cheap, dear = "cheap/gpt-4o-mini", "dear/gpt-4o"
	task := seed(t, s, nBatches, size)
	at := base.Add(time.Minute)
	// Row n was answered by cheap when odd, by dear when even, billed n*100
	// input (n*10 cached) and n output tokens; row 12 came from the cache
	// (no tokens, no label) and row 9 has tokens but no label. Row 4 failed
	// after a billed call.
	rowResult := func(n int) store.RowResult {
		u := store.Usage{InputTokens: int64(n) * 100, OutputTokens: int64(n), CachedInputTokens: int64(n) * 10}
		res := store.RowResult{State: store.RowSucceeded, Output: fmt.Sprintf("out %d", n), Attempts: 1, Provider: cheap, Usage: u}
		switch {
		case n == 12:
			return store.RowResult{State: store.RowSucceeded, Output: "cached", Cached: true}
		case n == 9:
			res.Provider = ""
		case n == 4:
			res = store.RowResult{State: store.RowFailed, Error: "boom", ErrorClass: "server_error", Attempts: 1, Provider: dear, Usage: u}
		case n%2 == 0:
			res.Provider = dear
		}
		return res
	}
	want := map[string]store.Usage{}
	var wantSum store.Usage
	// finish claims batch no, saves its rows (those in resave, or all when
	// nil) and finishes it with the tokens of all its rows, as the
	// generator does.
	finish := func(no int, now time.Time, resave map[int]bool) error {
		b, err := s.ClaimBatch(ctx, store.ClaimBatchParams{TaskID: task.ID, BatchNo: no, Owner: "w", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err != nil {
			return fmt.Errorf("claim batch %d: %w", no, err)
		}
		var sum store.Usage
		split := map[string]store.Usage{}
		var okRows, bad int
		for n := b.FirstRow; n < b.FirstRow+b.RowCount; n++ {
			res := rowResult(n)
			if res.State == store.RowFailed {
				bad++
			} else {
				okRows++
			}
			if resave == nil || resave[n] {
				if _, err := s.SaveRowResults(ctx, store.SaveRowResultsParams{TaskID: task.ID, BatchNo: no, Attempt: b.Attempt,
					Rows: []store.RowResultWrite{{RowNo: n, Result: res}}, Now: now}); err != nil {
					return fmt.Errorf("save row %d: %w", n, err)
				}
			}
			if res.Usage != (store.Usage{}) {
				sum = sum.Add(res.Usage)
				split[res.Provider] = split[res.Provider].Add(res.Usage)
			}
		}
		_, err = s.FinishBatch(ctx, store.FinishBatchParams{TaskID: task.ID, BatchNo: no, Attempt: b.Attempt,
			Succeeded: okRows, Failed: bad, Usage: sum, UsageByProvider: split, Now: now})
		if err != nil {
			return fmt.Errorf("finish batch %d: %w", no, err)
		}
		return nil
	}
	for n := 1; n <= nBatches*size; n++ {
		if u := rowResult(n).Usage; u != (store.Usage{}) {
			want[rowResult(n).Provider] = want[rowResult(n).Provider].Add(u)
			wantSum = wantSum.Add(u)
		}
	}
	// Every batch finishes at once: the adapters add the split atomically,
	// as they add the task's other counters.
	errs := make([]error, nBatches)
	var wg sync.WaitGroup
	for i := range nBatches {
		wg.Go(func() { errs[i] = finish(i+1, at, nil) })
	}
	wg.Wait()
	noErr(t, errors.Join(errs...), "finish the batches")
	type usage struct {
		Usage           store.Usage
		UsageByProvider map[string]store.Usage
	}
	got := getTask(t, s, task.ID)
	diff(t, "usage after the finishes", usage{wantSum, want}, usage{got.Usage, got.UsageByProvider})
	diff(t, "split adds up", got.Usage, store.SumUsage(got.UsageByProvider))
	diff(t, "nothing unattributed", store.Usage{}, got.UsageUnattributed())

	// Retry the failed row: batch 2 (rows 4-6) reopens, and its tokens
	// leave the split: all of row 4's (dear's), row 5's (cheap's) and
	// row 6's (dear's).
	_, err := s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskRunning}, To: store.TaskExporting, Now: at})
	noErr(t, err, "mark exporting")
	_, err = s.TransitionTask(ctx, store.TransitionTaskParams{ID: task.ID, From: []store.TaskState{store.TaskExporting}, To: store.TaskPartial, Now: at})
	noErr(t, err, "mark partial")
	later := at.Add(time.Minute)
	reopened, batches, err := r.ReopenTask(ctx, task.ID, "", later)
	noErr(t, err, "reopen")
	diff(t, "batches to enqueue", []int{2}, batches)
	kept := map[string]store.Usage{}
	var keptSum store.Usage
	for n := 1; n <= nBatches*size; n++ {
		if u := rowResult(n).Usage; u != (store.Usage{}) && (n < 4 || n > 6) {
			kept[rowResult(n).Provider] = kept[rowResult(n).Provider].Add(u)
			keptSum = keptSum.Add(u)
		}
	}
	diff(t, "usage returned by the reopen", usage{keptSum, kept}, usage{reopened.Usage, reopened.UsageByProvider})
	stored := getTask(t, s, task.ID)
	diff(t, "usage after the reopen", usage{keptSum, kept}, usage{stored.Usage, stored.UsageByProvider})

	// The reopened batch finishes again (row 4 fails the same way again):
	// the split is back to what it was.
	noErr(t, finish(2, later, map[int]bool{4: true}), "finish the reopened batch")
	got = getTask(t, s, task.ID)
	diff(t, "usage after the second finish", usage{wantSum, want}, usage{got.Usage, got.UsageByProvider})
}

// RunProviderBatches checks an adapter's journal of provider batches:
// entries round-trip in order (by time, an intent before its batch's other
// entries), a repeated record adds nothing, a batch of more ids than one
// record of the backend holds comes back whole, and tasks keep their own.
func RunProviderBatches(t *testing.T, newStore func(t *testing.T) store.ProviderBatches) {
	t.Helper()
	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		if got, err := s.ListProviderBatches(ctx, "none"); err != nil || len(got) != 0 {
			t.Fatalf("a task without a journal: %v %v, want none", got, err)
		}
		t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
		lines := []string{"a-0", "b-0", "a-1"}
		want := []store.ProviderBatch{
			{Key: "k0", Intent: true, Lines: []string{"x-0"}, Submitted: t0},
			{Key: "k0", Gone: true, Submitted: t0},
			{Key: "k1", Intent: true, Lines: lines, Submitted: t0.Add(time.Second)},
			{Key: "k1", Job: "batch_1", Lines: lines, Submitted: t0.Add(time.Second)},
			{Key: "k1", Job: "batch_1", Ended: true, Submitted: t0.Add(time.Second)},
			{Job: "batch_0", Lines: []string{"y-0"}, Submitted: t0.Add(2 * time.Second)}, // a journal from before keys
		}
		// Recorded out of order, and twice: the journal sorts, and a
		// repeated record (a retried write) adds nothing.
		for _, i := range []int{3, 5, 2, 0, 4, 1, 3, 2, 5} {
			if err := s.RecordProviderBatch(ctx, "t1", want[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.RecordProviderBatch(ctx, "t2", store.ProviderBatch{Key: "other", Intent: true, Lines: []string{"z-0"}, Submitted: t0}); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListProviderBatches(ctx, "t1")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d entries, want %d: %+v", len(got), len(want), got)
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Key != w.Key || g.Job != w.Job || g.Intent != w.Intent || g.Gone != w.Gone || g.Ended != w.Ended || !slices.Equal(g.Lines, w.Lines) || !g.Submitted.Equal(w.Submitted) {
				t.Errorf("entry %d: %+v, want %+v", i, g, w)
			}
		}
		if other, err := s.ListProviderBatches(ctx, "t2"); err != nil || len(other) != 1 || other[0].Key != "other" {
			t.Errorf("task t2's journal: %+v %v, want its own entry", other, err)
		}
	})
	t.Run("ManyLines", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		lines := make([]string, 20_001)
		for i := range lines {
			lines[i] = fmt.Sprintf("%024x-%d", i, i%3)
		}
		e := store.ProviderBatch{Key: "big", Job: "batch_big", Lines: lines, Submitted: time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)}
		if err := s.RecordProviderBatch(ctx, "big", e); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListProviderBatches(ctx, "big")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || !slices.Equal(got[0].Lines, lines) {
			n := 0
			if len(got) > 0 {
				n = len(got[0].Lines)
			}
			t.Fatalf("%d entries, the first of %d lines; want one of all %d in order", len(got), n, len(lines))
		}
	})
}
