package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/llm/sim"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// TestSplitRecordsTheEncoding splits CSV files and checks the task names the encoding the rows were read with, and
// that the header and cells stored are the text as read in it.
func TestSplitRecordsTheEncoding(t *testing.T) {
	t.Parallel()
	french, err := os.ReadFile(filepath.Join("..", "sheet", "testdata", "encodings", "excel_fr_windows-1252_also_gb18030.csv"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		data     []byte
		encoding string // asked for; "" detects
		want     store.Task
		first    []string
	}{
		{"windows-1252 detected", french, "", store.Task{Encoding: "windows-1252", Header: []string{"Catégorie", "Entrées", "Prix"}},
			[]string{"Légumes", "Carottes râpées", "2"}},
		{"forced", french, "GB18030", store.Task{Encoding: "gb18030", Header: []string{"Cat間orie", "Entr閑s", "Prix"}},
			[]string{"L間umes", "Carottes r鈖閑s", "2"}},
		{"utf-8", []byte("Catégorie,Prix\nLégumes,2\n"), "", store.Task{Encoding: "utf-8", Header: []string{"Catégorie", "Prix"}},
			[]string{"Légumes", "2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, sim.New(sim.Config{}), pipeline.GeneratorConfig{})
			path := filepath.Join(e.dir, "in.csv")
			if err := os.WriteFile(path, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			spec := store.TaskSpec{Prompt: "{{Prix}}", Provider: "sim"}
			task, err := e.splitter.Split(context.Background(), pipeline.SplitParams{
				TaskID: "t-" + c.encoding, Path: path, Source: "in.csv", Spec: spec, Encoding: c.encoding})
			if err != nil {
				t.Fatal(err)
			}
			stored, err := e.store.GetTask(context.Background(), task.ID)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := e.store.ListRows(context.Background(), store.ListRowsParams{TaskID: task.ID, FromNo: 1, Limit: 1})
			if err != nil || len(rows) != 1 {
				t.Fatalf("ListRows = %d rows, %v", len(rows), err)
			}
			got := []any{stored.Encoding, stored.Header, rows[0].Values}
			want := []any{c.want.Encoding, c.want.Header, c.first}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("[encoding, header, first row] (-want +got):\n%s", diff)
			}
		})
	}
}
