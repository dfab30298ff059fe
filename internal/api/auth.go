package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
)

// Authenticator identifies the principal behind a request. Every route of
// the API runs behind one (see RequireAuth); tasks belong to the principal
// that created them and are invisible to every other.
type Authenticator interface {
	// Authenticate returns the principal making r: a short, stable name
	// such as a token's name or a JWT subject. A request without valid
	// credentials returns an error wrapping ErrUnauthenticated, whose
	// message the client may see; any other error is logged and answered
	// with 500.
	Authenticate(r *http.Request) (string, error)
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(r *http.Request) (string, error)

// Authenticate calls f(r).
func (f AuthenticatorFunc) Authenticate(r *http.Request) (string, error) { return f(r) }

// ErrUnauthenticated marks a request without valid credentials: 401.
var ErrUnauthenticated = errors.New("unauthenticated")

// Fixed is an Authenticator that makes every request the same principal:
// `batchgen serve` without tokens, which then listens on loopback only.
type Fixed string

// Authenticate returns the fixed principal.
func (f Fixed) Authenticate(*http.Request) (string, error) { return string(f), nil }

type principalKey struct{}

// WithPrincipal returns ctx carrying principal, as RequireAuth stores it.
func WithPrincipal(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// PrincipalFrom returns the principal RequireAuth stored in ctx.
func PrincipalFrom(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(principalKey{}).(string)
	return p, ok && p != ""
}

// RequireAuth runs next only for requests auth accepts, with the principal
// in the request's context (PrincipalFrom). Others get the API's JSON 401
// with a WWW-Authenticate challenge. It is exported so that routes served
// beside the API (the event stream) authenticate the same way.
func RequireAuth(auth Authenticator, logger Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		principal, err := auth.Authenticate(r)
		if err == nil && principal == "" {
			err = fmt.Errorf("%w: no principal", ErrUnauthenticated)
		}
		if errors.Is(err, ErrUnauthenticated) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="batchgen"`)
			WriteError(w, http.StatusUnauthorized, "unauthenticated", "send a valid token: Authorization: Bearer <token>")
			return
		}
		if err != nil {
			if logger != nil {
				logger.Error("api: authenticate", "method", r.Method, "path", r.URL.Path, "error", err)
			}
			WriteError(w, http.StatusInternalServerError, "internal", "internal error")
			return
		}
		next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), principal)))
	})
}

// Logger is the part of *slog.Logger the API uses.
type Logger interface {
	Error(msg string, args ...any)
}

// BearerToken returns the token of an "Authorization: Bearer <token>"
// header, or "" when there is none.
func BearerToken(r *http.Request) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// Tokens authenticates static bearer tokens, each its own principal: the
// local runtime's BATCHGEN_API_TOKENS or token file (see ParseTokens).
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	principal string
	digest    [32]byte
}

// principalPattern is what a token's name may look like: it is shown in
// logs and stored on tasks.
var principalPattern = regexp.MustCompile(`^[A-Za-z0-9@._+-]{1,64}$`)

// minTokenBytes keeps guessable secrets out.
const minTokenBytes = 16

// ParseTokens reads a token list: entries separated by commas or new
// lines, blank entries and lines starting with '#' ignored. An entry is
// either NAME:SECRET, whose principal is NAME (letters, digits, @ . _ + -,
// at most 64), or a bare SECRET, whose principal is "token-" and the first
// 12 hex digits of the secret's SHA-256 (stable, and reveals nothing
// usable). Secrets have at least 16 characters; names and secrets are
// unique.
func ParseTokens(list string) (*Tokens, error) {
	t := &Tokens{}
	seenName := map[string]bool{}
	seenSecret := map[string]bool{}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, raw := range strings.Split(line, ",") {
			entry := strings.TrimSpace(raw)
			if entry == "" {
				continue
			}
			n++
			name, secret, named := strings.Cut(entry, ":")
			if !named {
				secret = entry
				sum := sha256.Sum256([]byte(secret))
				name = "token-" + hex.EncodeToString(sum[:6])
			}
			switch {
			case !principalPattern.MatchString(name):
				return nil, fmt.Errorf("token %d: name %q: use 1 to 64 letters, digits or @ . _ + -", n, name)
			case len(secret) < minTokenBytes:
				return nil, fmt.Errorf("token %d (%s): the secret has %d characters; use at least %d", n, name, len(secret), minTokenBytes)
			case strings.ContainsFunc(secret, func(r rune) bool { return r <= ' ' || r == 0x7f }):
				return nil, fmt.Errorf("token %d (%s): the secret contains spaces or control characters", n, name)
			case seenName[name]:
				return nil, fmt.Errorf("token %d: name %q appears twice", n, name)
			case seenSecret[secret]:
				return nil, fmt.Errorf("token %d (%s): the same secret appears twice", n, name)
			}
			seenName[name], seenSecret[secret] = true, true
			t.entries = append(t.entries, tokenEntry{principal: name, digest: sha256.Sum256([]byte(secret))})
		}
	}
	if len(t.entries) == 0 {
		return nil, errors.New("no tokens: give NAME:SECRET entries separated by commas or new lines")
	}
	return t, nil
}

// LoadTokenFile reads a token list (see ParseTokens) from a file: one entry
// per line, '#' comments allowed.
func LoadTokenFile(path string) (*Tokens, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read token file: %w", err)
	}
	t, err := ParseTokens(string(b))
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return t, nil
}

// Principals returns the principals in the list, in order.
func (t *Tokens) Principals() []string {
	out := make([]string, len(t.entries))
	for i, e := range t.entries {
		out[i] = e.principal
	}
	return out
}

// Authenticate finds the bearer token among the list. Comparison is of
// SHA-256 digests in constant time, over every entry, so timing tells
// nothing about which prefix matched.
func (t *Tokens) Authenticate(r *http.Request) (string, error) {
	token := BearerToken(r)
	if token == "" {
		return "", fmt.Errorf("%w: no bearer token", ErrUnauthenticated)
	}
	digest := sha256.Sum256([]byte(token))
	found := ""
	for _, e := range t.entries {
		if subtle.ConstantTimeCompare(digest[:], e.digest[:]) == 1 {
			found = e.principal
		}
	}
	if found == "" {
		return "", fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	return found, nil
}
