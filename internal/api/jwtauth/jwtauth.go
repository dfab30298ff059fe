// Package jwtauth verifies JSON Web Tokens in the handler itself, for the
// paths that have no API Gateway authorizer in front of them (the Lambda
// Function URL that streams task events). It is its own package so that
// only what serves those paths links the JOSE libraries.
package jwtauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"

	"github.com/batchgen/batchgen/internal/api"
)

// Config configures Verifier.
type Config struct {
	// Issuer is the required "iss" claim, the OIDC issuer URL (e.g.
	// https://cognito-idp.<region>.amazonaws.com/<pool id>). Required.
	Issuer string
	// Audience is a required "aud" claim value (the app client id).
	// Required. Cognito access tokens carry the client id in "client_id"
	// instead of "aud"; it is accepted there too, as API Gateway's JWT
	// authorizer does.
	Audience string
	// JWKSURL serves the issuer's signing keys. Defaults to the jwks_uri
	// of the issuer's OpenID discovery document
	// (Issuer + "/.well-known/openid-configuration": Okta, Entra ID and
	// Keycloak publish their keys elsewhere than Cognito and Auth0), or,
	// for an issuer without one, Issuer + "/.well-known/jwks.json".
	JWKSURL string
	// HTTPClient fetches the key set. Defaults to a client with a 10 s
	// timeout.
	HTTPClient *http.Client
	// Leeway tolerates clock skew on exp, nbf and iat. Defaults to 30 s.
	Leeway time.Duration
	// Now returns the current time for expiry checks. Defaults to
	// time.Now.
	Now func() time.Time
}

// Verifier authenticates "Authorization: Bearer <JWT>" in the handler
// itself: signature against the issuer's JSON Web Key Set (fetched and
// refreshed by github.com/MicahParks/keyfunc, new key ids looked up on
// demand), issuer, audience, expiry and not-before. The principal is the
// token's subject. It serves the Lambda Function URL path, which has no API
// Gateway authorizer in front of it, so the same tokens that API Gateway
// accepts are accepted there and nothing else.
type Verifier struct {
	cfg    Config
	keys   keyfunc.Keyfunc
	parser *jwt.Parser
}

// New starts fetching the key set (in the background until ctx
// ends) and returns the verifier. It fails on a bad configuration only; an
// unreachable key set makes requests fail with 401 until it is reachable.
func New(ctx context.Context, cfg Config) (*Verifier, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("jwt verifier: Issuer and Audience are required")
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.JWKSURL == "" {
		u, err := discoverJWKS(ctx, cfg.HTTPClient, cfg.Issuer)
		if err != nil {
			return nil, fmt.Errorf("jwt verifier: %w", err)
		}
		cfg.JWKSURL = u
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	keys, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{Client: cfg.HTTPClient})
	if err != nil {
		return nil, fmt.Errorf("jwt verifier: key set %s: %w", cfg.JWKSURL, err)
	}
	return &Verifier{
		cfg:  cfg,
		keys: keys,
		parser: jwt.NewParser(
			// Asymmetric algorithms only: an "alg": "none" or HS256 token
			// signed with the public key is refused before any key lookup.
			jwt.WithValidMethods([]string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}),
			jwt.WithIssuer(cfg.Issuer),
			jwt.WithExpirationRequired(),
			jwt.WithLeeway(cfg.Leeway),
			jwt.WithTimeFunc(cfg.Now),
		),
	}, nil
}

// discoverJWKS reads the issuer's key set URL from its OpenID discovery
// document, which must name the same issuer (OpenID Connect Discovery
// 1.0, section 4.3). An issuer without a document (404) is taken to
// publish its keys at /.well-known/jwks.json. Any other failure is an
// error: the verifier cannot know where the keys are, and guessing would
// refuse every token until the next start.
func discoverJWKS(ctx context.Context, client *http.Client, issuer string) (string, error) {
	base := strings.TrimSuffix(issuer, "/")
	doc := base + "/.well-known/openid-configuration"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, doc, nil)
	if err != nil {
		return "", fmt.Errorf("issuer %q: %w", issuer, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("discovery document %s: %w", doc, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return base + "/.well-known/jwks.json", nil
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("discovery document %s: %s", doc, resp.Status)
	}
	var d struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&d); err != nil {
		return "", fmt.Errorf("discovery document %s: %w", doc, err)
	}
	if strings.TrimSuffix(d.Issuer, "/") != base {
		return "", fmt.Errorf("discovery document %s names issuer %q, not %q", doc, d.Issuer, issuer)
	}
	u, err := url.Parse(d.JWKSURI)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return "", fmt.Errorf("discovery document %s: jwks_uri %q is not an http(s) URL", doc, d.JWKSURI)
	}
	return d.JWKSURI, nil
}

// claims are the registered claims plus Cognito's client_id.
type claims struct {
	jwt.RegisteredClaims
	ClientID string `json:"client_id,omitempty"`
}

// Authenticate verifies the bearer JWT and returns its subject.
func (v *Verifier) Authenticate(r *http.Request) (string, error) {
	raw := api.BearerToken(r)
	if raw == "" {
		return "", fmt.Errorf("%w: no bearer token", api.ErrUnauthenticated)
	}
	var c claims
	if _, err := v.parser.ParseWithClaims(raw, &c, v.keys.KeyfuncCtx(r.Context())); err != nil {
		return "", fmt.Errorf("%w: %w", api.ErrUnauthenticated, err)
	}
	audOK := c.ClientID == v.cfg.Audience
	for _, a := range c.Audience {
		audOK = audOK || a == v.cfg.Audience
	}
	if !audOK {
		return "", fmt.Errorf("%w: token is not for audience %s", api.ErrUnauthenticated, v.cfg.Audience)
	}
	if c.Subject == "" || len(c.Subject) > 255 || strings.ContainsFunc(c.Subject, unicode.IsControl) {
		return "", fmt.Errorf("%w: token has no usable subject", api.ErrUnauthenticated)
	}
	return c.Subject, nil
}

var _ api.Authenticator = (*Verifier)(nil)
