package clip_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/batchgen/batchgen/internal/clip"
)

func TestRunes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"", 3, ""},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc…"},
		// Characters, not bytes: a cut never splits a UTF-8 sequence.
		{"héllo wörld", 5, "héllo…"},
		{"日本語のテキスト", 3, "日本語…"},
		{"abc", 0, "…"},
		// Invalid bytes count one rune each and are kept.
		{"a\xffbc", 2, "a\xff…"},
	}
	for _, tt := range tests {
		if got := clip.Runes(tt.s, tt.n); got != tt.want {
			t.Errorf("Runes(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

func FuzzRunes(f *testing.F) {
	f.Add("héllo wörld", 5)
	f.Add("a\xffbc", 1)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1000 {
			return
		}
		got := clip.Runes(s, n)
		if utf8.RuneCountInString(s) <= n {
			if got != s {
				t.Fatalf("Runes(%q, %d) = %q, want it whole", s, n, got)
			}
			return
		}
		kept, ok := strings.CutSuffix(got, "…")
		if !ok || !strings.HasPrefix(s, kept) || utf8.RuneCountInString(kept) != n {
			t.Fatalf("Runes(%q, %d) = %q: want the first %d runes and …", s, n, got, n)
		}
	})
}
