package sheet

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

func TestZZWide(t *testing.T) {
	for _, n := range []int{1000, 2000, 4000} {
		h := make([]string, n)
		for i := range h {
			h[i] = fmt.Sprintf("c%d", i+1)
		}
		start := time.Now()
		w, err := NewWriter("x", h)
		if err != nil {
			t.Fatal(err)
		}
		for r := 0; r < 3; r++ {
			if err := w.WriteRow(h); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := w.WriteTo(io.Discard); err != nil {
			t.Fatal(err)
		}
		w.Close()
		fmt.Println("write", n, time.Since(start))
		start = time.Now()
		data := "c" + strings.Join(h, ",c") + "\n" + strings.Join(h, ",") + "\n"
		p := writeFile(t, t.TempDir(), "w.csv", []byte(data))
		if _, err := Validate(p, Options{}); err != nil {
			t.Fatal(err)
		}
		fmt.Println("read csv", n, time.Since(start))
	}
}
