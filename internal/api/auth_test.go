package api_test

import (
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/batchgen/batchgen/internal/api"
)

func TestParseTokens(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		list       string
		principals []string
		err        string
	}{
		{"named pairs", "alice:alice-secret-0123456789, bob:bob-secret-0123456789", []string{"alice", "bob"}, ""},
		// A bare token's principal is derived from its hash: stable, and
		// it reveals nothing usable.
		{"bare token", "0123456789abcdef0123", []string{"token-1bd8fd472970"}, ""},
		{"lines and comments", "# ops\nalice:alice-secret-0123456789\n\n", []string{"alice"}, ""},
		{"short secret", "alice:short", nil, "at least 16"},
		{"bad name", "al ice:alice-secret-0123456789", nil, "name"},
		{"name twice", "a:aaaaaaaaaaaaaaaaaaaa,a:bbbbbbbbbbbbbbbbbbbbb", nil, "twice"},
		{"secret twice", "a:aaaaaaaaaaaaaaaaaaaa,b:aaaaaaaaaaaaaaaaaaaa", nil, "twice"},
		{"empty", " , ", nil, "no tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := api.ParseTokens(tc.list)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseTokens = %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.principals, tok.Principals()); diff != "" {
				t.Errorf("principals (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTokensAuthenticate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("# people\nalice:alice-secret-0123456789\nbob:bob-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := api.LoadTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ header, principal string }{
		{"Bearer alice-secret-0123456789", "alice"},
		{"bearer bob-secret-0123456789", "bob"},
		{"Bearer alice-secret-012345678", ""},
		{"Basic YWxpY2U6eA==", ""},
		{"", ""},
	}
	for _, tc := range tests {
		r := httptest.NewRequest("GET", "/api/tasks", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		got, err := tok.Authenticate(r)
		if got != tc.principal || (tc.principal == "") != errors.Is(err, api.ErrUnauthenticated) {
			t.Errorf("Authorization %q: %q, %v; want %q", tc.header, got, err, tc.principal)
		}
	}
}

func TestSanitizeFilename(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"products.xlsx", "products.xlsx"},
		{"../../etc/passwd.csv", "passwd.csv"},
		{`C:\fakepath\商品.xlsx`, "商品.xlsx"},
		{"..\\..\\data\\db.sqlite", "db.sqlite"},
		{" .hidden.csv ", "hidden.csv"},
		{"a\x00b\r\n.csv", "ab.csv"},
		{"..", ""},
	}
	for _, tc := range tests {
		if got := api.SanitizeFilename(tc.in); got != tc.want {
			t.Errorf("SanitizeFilename(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
