package sheet

import (
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestZZHunt(t *testing.T) {
	seeds := [][]byte{
		buildXLSX(t, testSheet{name: "Sheet1", rows: row(1, "a", "b") + row(2, "1", "2")}),
		writeWorkbook(t, "out", []string{"名称", "output"}, [][]string{{"苹果", "=1+1"}, {"", ""}, {"梨", "多行\n文本"}}),
	}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	dir := t.TempDir()
	deadline := time.Now().Add(90 * time.Second)
	n := 0
	for time.Now().Before(deadline) {
		n++
		s := seeds[rng.Intn(len(seeds))]
		b := append([]byte(nil), s...)
		for k := rng.Intn(4) + 1; k > 0; k-- {
			switch rng.Intn(3) {
			case 0:
				b[rng.Intn(len(b))] = byte(rng.Intn(256))
			case 1:
				i := rng.Intn(len(b))
				b[i] ^= 1 << rng.Intn(8)
			case 2:
				i := rng.Intn(len(b))
				b = append(b[:i], b[i+1:]...)
			}
		}
		p := filepath.Join(dir, "f.xlsx")
		os.WriteFile(p, b, 0o600)
		done := make(chan struct{})
		go func() {
			defer close(done)
			checkReads(t, p, Options{Limits: Limits{MaxUnzippedBytes: 8 << 20, MaxRows: 1000, MaxColumns: 100, MaxCellChars: 1000}})
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			os.WriteFile("/tmp/hang.xlsx", b, 0o600)
			t.Fatalf("hang after %d inputs", n)
		}
	}
	t.Logf("%d inputs", n)
}
