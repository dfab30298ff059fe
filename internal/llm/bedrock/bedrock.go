// Package bedrockllm is the llm.Provider for Amazon Bedrock, through the
// Converse API of aws-sdk-go-v2's bedrockruntime client. It is
// IAM-authenticated: the client signs with whatever the default credential
// chain finds (the Lambda role on AWS, a profile or SSO session locally),
// so there is no key to configure or leak.
//
// The SDK's own retries are off for every call: the pipeline owns retries,
// because it must account for them against the quota and the row's attempt
// budget. What this adapter adds is the translation of every failure into
// an *llm.Error whose class tells the pipeline whether to retry the row,
// fail it, or stop the job.
package bedrockllm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/document"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/batchgen/batchgen/internal/llm"
)

// Converser is the part of *bedrockruntime.Client the provider uses.
type Converser interface {
	Converse(ctx context.Context, in *bedrockruntime.ConverseInput, optFns ...func(*bedrockruntime.Options)) (*bedrockruntime.ConverseOutput, error)
}

var _ Converser = (*bedrockruntime.Client)(nil)

// Config configures a Provider.
type Config struct {
	// Model is the model id ("amazon.nova-lite-v1:0"), a cross-region
	// inference profile id ("us.amazon.nova-lite-v1:0") or either's ARN
	// (an application inference profile, a provisioned model). Used when a
	// Request names none; one of the two is required.
	Model string
	// Region is the AWS region of the Bedrock endpoint, for NewClient.
	// Empty keeps the AWS configuration's (AWS_REGION).
	Region string
	// BaseURL, when set, replaces the regional endpoint, for NewClient (a
	// VPC endpoint, or a test double of the wire protocol).
	BaseURL string
	// Timeout bounds each call; 0 leaves only the caller's ctx. A call that
	// runs out of it fails with ClassTimeout.
	Timeout time.Duration
}

// Provider calls Bedrock's Converse API. It is safe for concurrent use.
type Provider struct {
	cfg    Config
	client Converser
}

var _ llm.Provider = (*Provider)(nil)

// NewClient builds the bedrockruntime client for cfg from an AWS
// configuration (credentials, region, HTTP client): cfg.Region and
// cfg.BaseURL override the configuration's region and endpoint.
func NewClient(awsCfg aws.Config, cfg Config) *bedrockruntime.Client {
	return bedrockruntime.NewFromConfig(clientConfig(awsCfg, cfg.Region, cfg.BaseURL))
}

// clientConfig is awsCfg as both Bedrock clients take it: region and
// endpoint overridden when set, and SDK retries off, because the lane
// retries and paces every call itself (SDK retries would hide 429s from the
// limiter and multiply the attempts).
func clientConfig(awsCfg aws.Config, region, baseURL string) aws.Config {
	if region != "" {
		awsCfg.Region = region
	}
	if baseURL != "" {
		awsCfg.BaseEndpoint = aws.String(baseURL)
	}
	awsCfg.Retryer = func() aws.Retryer { return aws.NopRetryer{} }
	return awsCfg
}

// New returns a Provider that calls client.
func New(client Converser, cfg Config) (*Provider, error) {
	if client == nil {
		return nil, errors.New("bedrock provider: nil client")
	}
	return &Provider{cfg: cfg, client: client}, nil
}

// noRetries turns the SDK's retries off for one call, whoever built the
// client.
func noRetries(o *bedrockruntime.Options) { o.Retryer = aws.NopRetryer{} }

// Generate sends req as one Converse call (an optional system prompt and
// one user message) and returns the answer's text. Failures are *llm.Error,
// except a cancelled ctx, which is returned wrapped as is.
func (p *Provider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	model := req.Model
	if model == "" {
		model = p.cfg.Model
	}
	if model == "" {
		return llm.Response{}, &llm.Error{Class: llm.ClassBadRequest, Message: "no model configured for the Bedrock provider"}
	}
	in := &bedrockruntime.ConverseInput{
		ModelId: aws.String(model),
		Messages: []types.Message{{
			Role:    types.ConversationRoleUser,
			Content: []types.ContentBlock{&types.ContentBlockMemberText{Value: req.Prompt}},
		}},
	}
	for _, c := range req.Corrections {
		in.Messages = append(in.Messages,
			types.Message{Role: types.ConversationRoleAssistant, Content: []types.ContentBlock{&types.ContentBlockMemberText{Value: c.Answer}}},
			types.Message{Role: types.ConversationRoleUser, Content: []types.ContentBlock{&types.ContentBlockMemberText{Value: c.FollowUp}}})
	}
	if req.ResponseSchema() != nil {
		tools, err := answerTool(req)
		if err != nil {
			return llm.Response{}, err
		}
		in.ToolConfig = tools
	}
	if req.System != "" {
		in.System = []types.SystemContentBlock{&types.SystemContentBlockMemberText{Value: req.System}}
	}
	var inf types.InferenceConfiguration
	if req.Temperature != nil {
		inf.Temperature = aws.Float32(float32(*req.Temperature))
	}
	if req.TopP != nil {
		inf.TopP = aws.Float32(float32(*req.TopP))
	}
	if req.MaxTokens > 0 {
		inf.MaxTokens = aws.Int32(int32(min(req.MaxTokens, 1<<31-1)))
	}
	if inf.Temperature != nil || inf.TopP != nil || inf.MaxTokens != nil {
		in.InferenceConfig = &inf
	}

	callCtx := ctx
	if p.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	out, err := p.client.Converse(callCtx, in, noRetries)
	if err != nil {
		return llm.Response{}, p.classify(ctx, callCtx, err)
	}
	return response(out)
}

// response reads the answer: its text blocks joined, or a content-filter
// error when a guardrail or the model's filter stopped it.
func response(out *bedrockruntime.ConverseOutput) (llm.Response, error) {
	if out == nil {
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "Converse answered nothing"}
	}
	switch out.StopReason {
	case types.StopReasonGuardrailIntervened, types.StopReasonContentFiltered:
		return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: http.StatusOK,
			Message: fmt.Sprintf("answer stopped by Bedrock (%s)", out.StopReason)}
	case types.StopReasonModelContextWindowExceeded:
		return llm.Response{}, &llm.Error{Class: llm.ClassPromptTooLong, StatusCode: http.StatusOK,
			Message: "the prompt and answer exceed the model's context window (model_context_window_exceeded)"}
	}
	msg, ok := out.Output.(*types.ConverseOutputMemberMessage)
	if !ok {
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "Converse answered no message"}
	}
	var text strings.Builder
	for _, block := range msg.Value.Content {
		switch b := block.(type) {
		case *types.ContentBlockMemberText:
			text.WriteString(b.Value)
		case *types.ContentBlockMemberToolUse:
			if aws.ToString(b.Value.Name) != answerToolName || b.Value.Input == nil {
				continue
			}
			// The forced tool's input is the answer: its JSON is what the
			// pipeline checks, whatever text came beside it.
			in, err := b.Value.Input.MarshalSmithyDocument()
			if err != nil {
				return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "the answer tool's input: " + err.Error()}
			}
			return llm.Response{Text: string(in), Usage: usage(out.Usage)}, nil
		}
	}
	return llm.Response{Text: text.String(), Usage: usage(out.Usage)}, nil
}

// answerToolName names the tool a request with columns forces the model to
// call: its input schema is the columns, and its input the answer.
const answerToolName = "answer"

// answerTool is the tool configuration of a request with columns: one tool
// whose input schema is the columns' JSON Schema, and a tool choice that
// forces it, which is how Converse is held to a shape.
func answerTool(req llm.Request) (*types.ToolConfiguration, error) {
	var sch map[string]any
	if err := json.Unmarshal(req.ResponseSchema(), &sch); err != nil {
		return nil, &llm.Error{Class: llm.ClassBadRequest, Message: "the columns' schema: " + err.Error()}
	}
	return &types.ToolConfiguration{
		Tools: []types.Tool{&types.ToolMemberToolSpec{Value: types.ToolSpecification{
			Name:        aws.String(answerToolName),
			Description: aws.String("Records the answer: one property per output column."),
			InputSchema: &types.ToolInputSchemaMemberJson{Value: document.NewLazyDocument(sch)},
		}}},
		ToolChoice: &types.ToolChoiceMemberTool{Value: types.SpecificToolChoice{Name: aws.String(answerToolName)}},
	}, nil
}

// usage maps Bedrock's token counts to llm.Usage. Bedrock counts prompt
// tokens read from and written to its prompt cache apart from inputTokens;
// llm.Usage's InputTokens include them, and CachedInputTokens are the reads
// (the writes are priced as input).
func usage(u *types.TokenUsage) llm.Usage {
	if u == nil {
		return llm.Usage{}
	}
	n := func(p *int32) int {
		if p == nil {
			return 0
		}
		return int(*p)
	}
	read := n(u.CacheReadInputTokens)
	return llm.Usage{
		InputTokens:       n(u.InputTokens) + read + n(u.CacheWriteInputTokens),
		OutputTokens:      n(u.OutputTokens),
		CachedInputTokens: read,
	}
}

// classify turns a failed call into an *llm.Error. ctx is the caller's,
// callCtx the one with this call's timeout.
func (p *Provider) classify(ctx, callCtx context.Context, err error) error {
	status := 0
	var respErr *smithyhttp.ResponseError
	if errors.As(err, &respErr) {
		status = respErr.HTTPStatusCode()
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return fromAPIError(apiErr, status, err)
	}
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("bedrock converse: %w", ctx.Err())
	case errors.Is(callCtx.Err(), context.DeadlineExceeded):
		msg := "model call timed out"
		if ctx.Err() == nil && p.cfg.Timeout > 0 {
			msg = fmt.Sprintf("model call timed out after %v", p.cfg.Timeout)
		}
		return &llm.Error{Class: llm.ClassTimeout, Message: msg, Err: callCtx.Err()}
	case status >= 400:
		return fromStatus(status, "", err)
	}
	if llm.IsConnectionError(err) {
		return &llm.Error{Class: llm.ClassConnection, Message: err.Error(), Err: err}
	}
	e := llm.Classify(fmt.Errorf("bedrock converse: %w", err))
	if e.StatusCode == 0 {
		e.StatusCode = status
	}
	return e
}

// fromAPIError classifies an error answer by its exception type, the one
// field Bedrock documents per failure.
func fromAPIError(apiErr smithy.APIError, status int, err error) *llm.Error {
	code := apiErr.ErrorCode()
	msg := llm.CleanMessage(apiErr.ErrorMessage(), "")
	if msg == "" {
		msg = strings.TrimSpace(fmt.Sprintf("%d %s", status, http.StatusText(status)))
	}
	if code != "" && !strings.Contains(msg, code) {
		msg += " (" + code + ")"
	}
	e := &llm.Error{StatusCode: status, Message: msg, Err: err}
	lower := strings.ToLower(apiErr.ErrorMessage())
	var (
		throttling   *types.ThrottlingException
		quota        *types.ServiceQuotaExceededException
		notReady     *types.ModelNotReadyException
		validation   *types.ValidationException
		denied       *types.AccessDeniedException
		notFound     *types.ResourceNotFoundException
		unavailable  *types.ServiceUnavailableException
		modelTimeout *types.ModelTimeoutException
		internal     *types.InternalServerException
		modelErr     *types.ModelErrorException
	)
	switch {
	case errors.As(err, &throttling), errors.As(err, &quota), errors.As(err, &notReady):
		// Too many requests or tokens for the account's quota, or a model
		// still being loaded: wait and try again.
		e.Class = llm.ClassRateLimited
	case errors.As(err, &validation):
		e.Class = llm.ClassBadRequest
		if strings.Contains(lower, "too long") || strings.Contains(lower, "too many tokens") ||
			strings.Contains(lower, "context window") || strings.Contains(lower, "max_tokens") && strings.Contains(lower, "exceed") {
			e.Class = llm.ClassPromptTooLong
		}
	case errors.As(err, &denied):
		// The role may not invoke the model, or the model's access was
		// never granted: no call can succeed until an operator acts.
		e.Class = llm.ClassAuth
	case errors.As(err, &notFound):
		e.Class = llm.ClassBadRequest
	case errors.As(err, &modelTimeout):
		e.Class = llm.ClassTimeout
	case errors.As(err, &unavailable), errors.As(err, &internal), errors.As(err, &modelErr):
		e.Class = llm.ClassServer
	case code == "UnrecognizedClientException" || code == "InvalidSignatureException" ||
		code == "ExpiredTokenException" || code == "MissingAuthenticationTokenException":
		// Credentials the service does not accept.
		e.Class = llm.ClassAuth
	default:
		return fromStatus(status, msg, err)
	}
	return e
}

// fromStatus classifies an error answer that carries no known exception
// type by its HTTP status.
func fromStatus(status int, msg string, err error) *llm.Error {
	if msg == "" {
		msg = strings.TrimSpace(fmt.Sprintf("%d %s", status, http.StatusText(status)))
	}
	return &llm.Error{Class: llm.ClassOfStatus(status), StatusCode: status, Message: msg, Err: err}
}
