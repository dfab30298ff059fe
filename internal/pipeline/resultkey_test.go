package pipeline_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

func TestTaskResultKey(t *testing.T) {
	tests := []struct {
		name string
		task store.Task
		want string
	}{
		{"dropped xlsx is named after the input", store.Task{ID: "t1", Source: "incoming/products.xlsx"}, "results/products.result.xlsx"},
		{"dropped csv in upper case", store.Task{ID: "t1", Source: "incoming/Sales Q1.CSV"}, "results/Sales Q1.result.xlsx"},
		{"mixed-case xlsx extension", store.Task{ID: "t1", Source: "incoming/a.Xlsx"}, "results/a.result.xlsx"},
		{"sub-folder keeps its sub-path", store.Task{ID: "t1", Source: "incoming/team-a/2026/products.xlsx"}, "results/team-a/2026/products.result.xlsx"},
		{"same name in another folder does not collide", store.Task{ID: "t1", Source: "incoming/team-b/products.xlsx"}, "results/team-b/products.result.xlsx"},
		{"only the last extension goes", store.Task{ID: "t1", Source: "incoming/v1.2.data.tsv"}, "results/v1.2.data.result.xlsx"},
		{"non-ASCII name", store.Task{ID: "t1", Source: "incoming/商品 list.xlsm"}, "results/商品 list.result.xlsx"},
		{"API upload keeps its id", store.Task{ID: "abc123", Source: "products.xlsx"}, "results/abc123.xlsx"},
		{"local run keeps its id", store.Task{ID: "abc123", Source: "in.csv"}, "results/abc123.xlsx"},
		{"not a sheet under the drop folder", store.Task{ID: "abc123", Source: "incoming/readme.txt"}, "results/abc123.xlsx"},
		{"outside the drop folder", store.Task{ID: "abc123", Source: "Incoming/a.xlsx"}, "results/abc123.xlsx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, pipeline.TaskResultKey(tc.task)); diff != "" {
				t.Errorf("TaskResultKey(%+v) (-want +got):\n%s", tc.task, diff)
			}
		})
	}
}
