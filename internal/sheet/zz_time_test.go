package sheet

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestZZTime(t *testing.T) {
	dir := os.Getenv("FZDIR")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		lines := strings.SplitN(string(b), "\n", 2)
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(lines[1]), "[]byte("), ")"))
		if err != nil {
			t.Log(err)
			continue
		}
		p := filepath.Join(t.TempDir(), "f.xlsx")
		os.WriteFile(p, []byte(s), 0o600)
		st := time.Now()
		checkReads(t, p, Options{Limits: Limits{MaxUnzippedBytes: 8 << 20, MaxRows: 1000, MaxColumns: 100, MaxCellChars: 1000}})
		t.Logf("%s %v len=%d", e.Name(), time.Since(st), len(s))
	}
}
