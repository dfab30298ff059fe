package jwtauth_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/api/jwtauth"
)

var now = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// issuer is an OIDC issuer for tests: an RSA key published as a JSON Web
// Key Set at /.well-known/jwks.json of a real HTTP server.
type issuer struct {
	url string
	key *rsa.PrivateKey
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	jwks, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256",
		"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
	}}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/jwks.json" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(jwks)
	}))
	t.Cleanup(srv.Close)
	return &issuer{url: srv.URL, key: key}
}

func (is *issuer) sign(t *testing.T, key *rsa.PrivateKey, method jwt.SigningMethod, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	tok.Header["kid"] = "k1"
	var signKey any = key
	if method == jwt.SigningMethodNone {
		signKey = jwt.UnsafeAllowNoneSignatureType
	}
	s, err := tok.SignedString(signKey)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestVerifier checks every part of a token the handler relies on when no
// API Gateway authorizer stands in front of it: signature against the
// issuer's key set, issuer, audience (or Cognito's client_id), expiry and
// the subject, which becomes the principal.
func TestVerifier(t *testing.T) {
	t.Parallel()
	is := newIssuer(t)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jwtauth.New(t.Context(), jwtauth.Config{Issuer: is.url, Audience: "client-1", Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	good := func() jwt.MapClaims {
		return jwt.MapClaims{"iss": is.url, "aud": "client-1", "sub": "user-7", "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
	}
	with := func(k string, val any) jwt.MapClaims {
		c := good()
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	cognito := with("aud", nil)
	cognito["client_id"] = "client-1"
	tests := []struct {
		name      string
		token     string
		principal string
	}{
		{"valid", is.sign(t, is.key, jwt.SigningMethodRS256, good()), "user-7"},
		{"Cognito access token (client_id)", is.sign(t, is.key, jwt.SigningMethodRS256, cognito), "user-7"},
		{"signed by another key", is.sign(t, other, jwt.SigningMethodRS256, good()), ""},
		{"unsigned (alg none)", is.sign(t, nil, jwt.SigningMethodNone, good()), ""},
		{"another issuer", is.sign(t, is.key, jwt.SigningMethodRS256, with("iss", "https://evil.test")), ""},
		{"another audience", is.sign(t, is.key, jwt.SigningMethodRS256, with("aud", "client-2")), ""},
		{"expired", is.sign(t, is.key, jwt.SigningMethodRS256, with("exp", now.Add(-time.Hour).Unix())), ""},
		{"no expiry", is.sign(t, is.key, jwt.SigningMethodRS256, with("exp", nil)), ""},
		{"not yet valid", is.sign(t, is.key, jwt.SigningMethodRS256, with("nbf", now.Add(time.Hour).Unix())), ""},
		{"no subject", is.sign(t, is.key, jwt.SigningMethodRS256, with("sub", nil)), ""},
		{"garbage", "not.a.jwt", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/api/tasks/x/events", nil)
			r.Header.Set("Authorization", "Bearer "+tc.token)
			got, err := v.Authenticate(r)
			if got != tc.principal {
				t.Errorf("principal = %q (%v), want %q", got, err, tc.principal)
			}
			if tc.principal == "" && !errors.Is(err, api.ErrUnauthenticated) {
				t.Errorf("error = %v, want ErrUnauthenticated (401)", err)
			}
		})
	}

	// Behind api.RequireAuth a bad token is the API's JSON 401.
	h := api.RequireAuth(v, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := api.PrincipalFrom(r.Context())
		_, _ = w.Write([]byte(p))
	}))
	for token, want := range map[string]int{is.sign(t, is.key, jwt.SigningMethodRS256, good()): 200, "nope": 401} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		h.ServeHTTP(rec, r)
		if rec.Code != want || (want == 200 && rec.Body.String() != "user-7") {
			t.Errorf("RequireAuth = %d %q, want %d", rec.Code, rec.Body, want)
		}
	}
}

// TestDiscoversTheKeySet: an issuer that publishes its keys elsewhere than /.well-known/jwks.json (Okta, Entra
// ID, Keycloak) is read through its OpenID discovery document; a document that names another issuer, or an
// issuer whose document fails, is a configuration error, not a guess that refuses every token.
func TestDiscoversTheKeySet(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	jwks, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256", "n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
	}}})
	var docIssuer string
	docStatus := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/oauth2/default/.well-known/openid-configuration":
			if docStatus != http.StatusOK {
				w.WriteHeader(docStatus)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"issuer": docIssuer, "jwks_uri": "http://" + r.Host + "/oauth2/default/v1/keys"})
		case "/oauth2/default/v1/keys":
			_, _ = w.Write(jwks)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	iss := srv.URL + "/oauth2/default"
	docIssuer = iss
	v, err := jwtauth.New(t.Context(), jwtauth.Config{Issuer: iss, Audience: "api", Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims{"iss": iss, "aud": "api", "sub": "okta-user", "exp": now.Add(time.Hour).Unix()})
	tok.Header["kid"] = "k1"
	raw, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+raw)
	if p, err := v.Authenticate(r); p != "okta-user" {
		t.Errorf("a token of an issuer with discovery: %q, %v", p, err)
	}

	docIssuer = "https://someone-else.example"
	if _, err := jwtauth.New(t.Context(), jwtauth.Config{Issuer: iss, Audience: "api"}); err == nil || !strings.Contains(err.Error(), `names issuer "https://someone-else.example"`) {
		t.Errorf("a document naming another issuer: %v", err)
	}
	docStatus = http.StatusInternalServerError
	if _, err := jwtauth.New(t.Context(), jwtauth.Config{Issuer: iss, Audience: "api"}); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("a failing document: %v", err)
	}
}
