package eventsfn

import (
	"context"
	"errors"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/api/jwtauth"
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
)

// New builds the events function's handler. It refuses to start without
// JWT_ISSUER and JWT_AUDIENCE: the Function URL has no authorizer, so
// without them anyone could follow any task. ctx bounds the background
// refresh of the issuer's key set (the process's life in main).
func New(ctx context.Context, d *awswire.Deps, auth api.Authenticator) (*Handler, error) {
	if err := d.Env.Require("TABLE_NAME", "BUCKET_NAME"); err != nil {
		return nil, err
	}
	if auth == nil {
		if d.Env.JWTIssuer == "" || d.Env.JWTAudience == "" {
			return nil, errors.New("environment: JWT_ISSUER and JWT_AUDIENCE must be set: the Function URL has no authorizer, the handler checks the token itself")
		}
		v, err := jwtauth.New(ctx, jwtauth.Config{Issuer: d.Env.JWTIssuer, Audience: d.Env.JWTAudience})
		if err != nil {
			return nil, err
		}
		auth = v
	}
	// The stream's task views carry the cost the api function shows: each
	// provider's tokens at the providers file's price for its entry.
	providers, err := d.Env.Providers()
	if err != nil {
		return nil, err
	}
	blobs := s3blob.FromConfig(d.AWS, d.Env.BucketName, s3blob.Options{})
	st := d.Store(blobs)
	return &Handler{
		Handler: api.NewEvents(api.Config{
			Auth: auth, Store: st, Blobs: blobs, Presigner: blobs, Clock: d.Clock, Logger: d.Logger,
			Prices: pricing.Default().FromProviders(providers),
			// Each instance serves one stream: the principal's count is kept
			// in the table, across the instances.
			StreamGate: st, Limits: api.Limits{MaxStreams: d.Env.MaxStreams},
			// What an economy task waits for, from its journal in the table.
			WaitingOn: pipeline.JournalWaitingOn(st),
		}),
		Logger: d.Logger,
	}, nil
}
