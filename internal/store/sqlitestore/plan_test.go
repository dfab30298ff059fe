package sqlitestore

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestListRowsSearchesARange holds ListRows' query to a bounded search of
// the rows' (task_id, no) key. Its earlier form, "no >= ? AND (? = 0 OR no <= ?)",
// returned the same rows but scanned every row after the first one asked
// for, so reading each batch of a 100,000-row task cost time in proportion
// to the task: a third of the run's CPU. Only the plan shows the difference.
func TestListRowsSearchesARange(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "tasks.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.read.QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+listRowsSQL, "t", 101, 200, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(plan, "; ")
	if !strings.Contains(got, "(task_id=? AND no>? AND no<?)") {
		t.Fatalf("ListRows does not search a bounded range of the primary key; plan: %s", got)
	}
}
