package apifn

import (
	"fmt"
	"net/http"

	"github.com/batchgen/batchgen/internal/api"
	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/pricing"
	"github.com/batchgen/batchgen/internal/queue/sqsqueue"
	"github.com/batchgen/batchgen/internal/stepfn"
	"github.com/batchgen/batchgen/internal/web"
)

// InlineUploadBytes is the largest sheet the web page sends inside a
// request to the api function (web.Config.MaxInlineBytes). Lambda takes at
// most a 6 MB request payload (API Gateway's own 10 MB never comes into
// play), and API Gateway hands a binary body over base64-encoded, a third
// larger: 6 MiB of payload carries 4.5 MiB of sheet; 4 MiB leaves room for
// the event's headers and the form's other fields (a template may be 32
// KiB). Larger sheets go straight to S3 through a presigned upload URL.
const InlineUploadBytes = 4 << 20

// New builds the api function's handler.
func New(d *awswire.Deps) (*Handler, error) {
	if err := d.Env.Require("TABLE_NAME", "BUCKET_NAME"); err != nil {
		return nil, err
	}
	// The spec's provider and model come from the providers config, as
	// the generator's routes do; a bad one fails the cold start.
	spec, err := d.Env.DefaultSpec()
	if err != nil {
		return nil, err
	}
	// A task's cost prices each provider's tokens at the providers file's
	// price for its entry, as batchgen status and tasks --providers do.
	providers, err := d.Env.Providers()
	if err != nil {
		return nil, err
	}
	blobs := s3blob.FromConfig(d.AWS, d.Env.BucketName, s3blob.Options{})
	st := d.Store(blobs)
	queue := sqsqueue.FromConfig(d.AWS, d.Env.QueueURL, sqsqueue.Options{DLQURL: d.Env.DLQURL, Clock: d.Clock})
	auth := GatewayAuth{}
	exports := d.Exports(stepfn.FromConfig(d.AWS, d.Env.StateMachineARN))
	limits := api.Limits{
		Models: d.Env.AllowedModels, ModelFixed: providers.FixedModels(), MaxTokens: d.Env.MaxTokensLimit, MaxBatchSize: d.Env.MaxBatchSize,
		MaxActiveTasks: d.Env.MaxActiveTasks, MaxRowsPerDay: d.Env.MaxRowsPerDay,
		MaxFileBytes: d.Env.MaxInputBytes, MaxRows: d.Env.MaxRows,
		// Economy and auto tasks park between looks at their provider
		// batches (the generator's EconomyConfig.Park).
		BatchModes: true,
		// The generators hold a task to its cap across the fleet
		// (pipeline.GeneratorConfig.Allowances, the task's ledger in the
		// table).
		CostCaps: true,
		// A held task's sample goes to the generators by the queue, as
		// any batch (pipeline.SampleMessages); the start sends the rest.
		Quotes: true,
	}
	handler := api.New(api.Config{
		Store: st, Blobs: blobs, Presigner: blobs, Auth: auth, Clock: d.Clock, Logger: d.Logger,
		DefaultSpec: spec, Exports: exports,
		TempDir: d.TempDir,
		Limits:  limits,
		Retrier: pipeline.Retrier{Store: st, Queue: queue},
		Starter: pipeline.Starter{Store: st, Queue: queue, Exports: exports},
		// The quote's time at the quotas the providers config states (the
		// fleet's limiters learn theirs in the generators).
		QuotePace: func() api.QuotePace {
			return api.QuotePace{RequestsPerSecond: float64(providers.RPM()) / 60, Concurrency: providers.Concurrency()}
		},
		EventsURL: d.Env.EventsURL,
		// What an economy task waits for, from its journal in the table.
		WaitingOn: pipeline.JournalWaitingOn(st),
		Prices:    pricing.Default().FromProviders(providers),
	})
	// The page reads sheets with the API's limits and admits to POST
	// /ui/inspect whom the API admits; no /metrics on Lambda (EMF instead).
	page := web.Config{
		Limits:         limits,
		Authenticate:   web.Authenticate(auth),
		TempDir:        d.TempDir,
		Logger:         d.Logger,
		MaxInlineBytes: InlineUploadBytes,
	}
	return &Handler{Handler: web.Site(handler, nil, page), Logger: d.Logger}, nil
}

// GatewayAuth names the principal of a request served through Handler from
// what API Gateway's authorizer verified: the JWT's subject, or for IAM
// authorization the caller's ARN. API Gateway has already refused requests
// without valid credentials; one that reaches the handler without an
// identity (a route left without an authorizer) is refused here too.
type GatewayAuth struct{}

var _ api.Authenticator = GatewayAuth{}

// Authenticate returns the authorizer's principal.
func (GatewayAuth) Authenticate(r *http.Request) (string, error) {
	rc, ok := APIGatewayRequestContext(r.Context())
	if !ok || rc.Authorizer == nil {
		return "", fmt.Errorf("%w: no API Gateway authorizer context", api.ErrUnauthenticated)
	}
	if jwt := rc.Authorizer.JWT; jwt != nil {
		if sub := jwt.Claims["sub"]; sub != "" {
			return sub, nil
		}
	}
	if iam := rc.Authorizer.IAM; iam != nil && iam.UserARN != "" {
		return iam.UserARN, nil
	}
	return "", fmt.Errorf("%w: the authorizer context names no subject", api.ErrUnauthenticated)
}
