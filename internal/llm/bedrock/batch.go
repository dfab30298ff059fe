package bedrockllm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/bedrock"
	btypes "github.com/aws/aws-sdk-go-v2/service/bedrock/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/batchgen/batchgen/internal/blob"
	"github.com/batchgen/batchgen/internal/llm"
)

// Batch inference (CreateModelInvocationJob): llm.BatchProvider for
// Bedrock. A batch is a JSONL file of records in the job bucket, each
// {"recordId", "modelInput"} with modelInput the model's own InvokeModel
// body; Bedrock's service role reads it and writes the answers beside it
// ({"recordId", "modelInput", "modelOutput"} or {"recordId", "modelInput",
// "error"}), in no particular order.
//
// Record ids are the record's number in the file (R0000000001): the
// caller's line ids are kept in an ids file beside the input, written
// before the job is created, so that answers map back to lines whatever
// Bedrock allows in a record id and whichever process reads them.
//
// The request body differs by model family; Anthropic's Claude models
// (Messages API bodies, columns through a forced tool) are the ones known
// here: BatchFormat tells, and a route of another model runs online.

// Limits of one Bedrock batch inference job (the default quotas of most
// models): at least MinBatchRecords records, at most MaxBatchRecords, and
// an input file of at most MaxBatchBytes.
const (
	MinBatchRecords = 100
	MaxBatchRecords = 50_000
	MaxBatchBytes   = 1 << 30
)

// Control is the part of *bedrock.Client the batch provider uses.
type Control interface {
	CreateModelInvocationJob(ctx context.Context, in *bedrock.CreateModelInvocationJobInput, optFns ...func(*bedrock.Options)) (*bedrock.CreateModelInvocationJobOutput, error)
	GetModelInvocationJob(ctx context.Context, in *bedrock.GetModelInvocationJobInput, optFns ...func(*bedrock.Options)) (*bedrock.GetModelInvocationJobOutput, error)
	StopModelInvocationJob(ctx context.Context, in *bedrock.StopModelInvocationJobInput, optFns ...func(*bedrock.Options)) (*bedrock.StopModelInvocationJobOutput, error)
	ListModelInvocationJobs(ctx context.Context, in *bedrock.ListModelInvocationJobsInput, optFns ...func(*bedrock.Options)) (*bedrock.ListModelInvocationJobsOutput, error)
}

var _ Control = (*bedrock.Client)(nil)

// BatchConfig configures a Batch.
type BatchConfig struct {
	// Model is the model id or inference profile the jobs run.
	Model string
	// Bucket holds the jobs' files, under Prefix ("provider-batches/").
	Bucket, Prefix string
	// RoleARN is the service role Bedrock assumes to read the input and
	// write the output.
	RoleARN string
	// Region and BaseURL, for NewControl, as Config's.
	Region, BaseURL string
}

// Batch runs Bedrock batch inference jobs: an llm.BatchProvider.
type Batch struct {
	cfg     BatchConfig
	control Control
	// objects is the bucket's store.
	objects blob.Store
}

var _ llm.BatchProvider = (*Batch)(nil)

// NewControl builds the bedrock control-plane client for cfg, SDK retries
// off (the lane owns them).
func NewControl(awsCfg aws.Config, cfg BatchConfig) *bedrock.Client {
	return bedrock.NewFromConfig(clientConfig(awsCfg, cfg.Region, cfg.BaseURL))
}

// BatchFormat reports whether Bedrock batch bodies of model are known
// here, and why not: only Anthropic's Claude models are.
func BatchFormat(model string) error {
	if strings.Contains(model, "anthropic.claude") {
		return nil
	}
	return fmt.Errorf("bedrock batch inference: the request body of model %q is not known here (Anthropic Claude models are)", model)
}

// NewBatch returns the batch provider of cfg: jobs through control, files
// through objects (the store of cfg.Bucket).
func NewBatch(control Control, objects blob.Store, cfg BatchConfig) (*Batch, error) {
	switch {
	case control == nil || objects == nil:
		return nil, errors.New("bedrock batch: nil control client or object store")
	case cfg.Bucket == "" || cfg.RoleARN == "":
		return nil, errors.New("bedrock batch: a bucket for the jobs' files and the service role Bedrock assumes are both needed")
	}
	if err := BatchFormat(cfg.Model); err != nil {
		return nil, err
	}
	cfg.Prefix = strings.TrimPrefix(cfg.Prefix, "/")
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	return &Batch{cfg: cfg, control: control, objects: objects}, nil
}

// BatchLimits implements llm.BatchProvider.
func (b *Batch) BatchLimits() llm.BatchLimits {
	return llm.BatchLimits{Lines: MaxBatchRecords, Bytes: MaxBatchBytes, MinLines: MinBatchRecords}
}

// The files of the job sent under key.
func (b *Batch) inputKey(key string) string  { return b.cfg.Prefix + key + "/input.jsonl" }
func (b *Batch) idsKey(key string) string    { return b.cfg.Prefix + key + "/ids.json" }
func (b *Batch) outputDir(key string) string { return b.cfg.Prefix + key + "/output/" }
func (b *Batch) uri(k string) string         { return "s3://" + b.cfg.Bucket + "/" + k }

// recordID is the id of the n-th record (from 0) of a job's file.
func recordID(n int) string { return fmt.Sprintf("R%010d", n+1) }

// SubmitBatch writes lines as the job's input and ids files, then creates
// the job, named key and with key as its idempotency token: a create sent
// twice makes one job.
func (b *Batch) SubmitBatch(ctx context.Context, key string, lines []llm.BatchLine) (string, error) {
	if len(lines) < MinBatchRecords || len(lines) > MaxBatchRecords {
		return "", &llm.Error{Class: llm.ClassBadRequest, Message: fmt.Sprintf("bedrock batch of %d lines: a job takes %d to %d records", len(lines), MinBatchRecords, MaxBatchRecords)}
	}
	var file bytes.Buffer
	ids := make([]string, len(lines))
	seen := make(map[string]bool, len(lines))
	for i, l := range lines {
		if l.ID == "" || seen[l.ID] {
			return "", fmt.Errorf("bedrock batch: line id %q is empty or used twice", l.ID)
		}
		seen[l.ID], ids[i] = true, l.ID
		body, err := claudeBody(l.Req)
		if err != nil {
			return "", fmt.Errorf("bedrock batch: line %s: %w", l.ID, err)
		}
		rec, _ := json.Marshal(struct {
			RecordID   string          `json:"recordId"`
			ModelInput json.RawMessage `json:"modelInput"`
		}{recordID(i), body})
		file.Write(append(rec, '\n'))
		if file.Len() > MaxBatchBytes {
			return "", fmt.Errorf("bedrock batch: the input passes %d bytes at line %s; split the lines", MaxBatchBytes, l.ID)
		}
	}
	idsJSON, _ := json.Marshal(ids)
	if err := b.objects.Put(ctx, b.idsKey(key), bytes.NewReader(idsJSON)); err != nil {
		return "", &llm.Error{Class: llm.ClassServer, Message: "bedrock batch: write the ids file: " + err.Error(), Err: err}
	}
	if err := b.objects.Put(ctx, b.inputKey(key), &file); err != nil {
		return "", &llm.Error{Class: llm.ClassServer, Message: "bedrock batch: write the input file: " + err.Error(), Err: err}
	}
	out, err := b.control.CreateModelInvocationJob(ctx, &bedrock.CreateModelInvocationJobInput{
		JobName: aws.String(key), ClientRequestToken: aws.String(key),
		ModelId: aws.String(b.cfg.Model), RoleArn: aws.String(b.cfg.RoleARN),
		InputDataConfig: &btypes.ModelInvocationJobInputDataConfigMemberS3InputDataConfig{Value: btypes.ModelInvocationJobS3InputDataConfig{
			S3Uri: aws.String(b.uri(b.inputKey(key))), S3InputFormat: btypes.S3InputFormatJsonl,
		}},
		OutputDataConfig: &btypes.ModelInvocationJobOutputDataConfigMemberS3OutputDataConfig{Value: btypes.ModelInvocationJobS3OutputDataConfig{
			S3Uri: aws.String(b.uri(b.outputDir(key))),
		}},
	})
	if err != nil {
		return "", fmt.Errorf("bedrock batch: create the job: %w", classifyControl(ctx, err))
	}
	return aws.ToString(out.JobArn), nil
}

// FindBatch looks for the job named q.Key (a job's name is unique in the
// account and region) submitted within llm.FindWindow of q.Since.
func (b *Batch) FindBatch(ctx context.Context, q llm.BatchQuery) (string, error) {
	in := &bedrock.ListModelInvocationJobsInput{NameContains: aws.String(q.Key), MaxResults: aws.Int32(100)}
	for {
		out, err := b.control.ListModelInvocationJobs(ctx, in)
		if err != nil {
			return "", fmt.Errorf("bedrock batch: list the jobs: %w", classifyControl(ctx, err))
		}
		for _, j := range out.InvocationJobSummaries {
			at := aws.ToTime(j.SubmitTime)
			if aws.ToString(j.JobName) == q.Key && !q.Taken[aws.ToString(j.JobArn)] &&
				!at.Before(q.Since.Add(-llm.FindWindow)) && !at.After(q.Since.Add(llm.FindWindow)) {
				return aws.ToString(j.JobArn), nil
			}
		}
		if out.NextToken == nil {
			return "", nil
		}
		in.NextToken = out.NextToken
	}
}

// BatchStatus reports job id (its ARN).
func (b *Batch) BatchStatus(ctx context.Context, id string) (llm.BatchStatus, error) {
	j, err := b.control.GetModelInvocationJob(ctx, &bedrock.GetModelInvocationJobInput{JobIdentifier: aws.String(id)})
	if err != nil {
		return llm.BatchStatus{}, fmt.Errorf("bedrock batch %s: %w", id, classifyControl(ctx, err))
	}
	st := llm.BatchStatus{ID: id, Total: int(aws.ToInt64(j.TotalRecordCount)), Completed: int(aws.ToInt64(j.SuccessRecordCount)), Failed: int(aws.ToInt64(j.ErrorRecordCount))}
	switch j.Status {
	case btypes.ModelInvocationJobStatusCompleted, btypes.ModelInvocationJobStatusPartiallyCompleted:
		st.State = llm.BatchDone
	case btypes.ModelInvocationJobStatusFailed:
		st.State, st.Error = llm.BatchFailed, aws.ToString(j.Message)
	case btypes.ModelInvocationJobStatusStopped:
		st.State = llm.BatchCancelled
	case btypes.ModelInvocationJobStatusExpired:
		st.State = llm.BatchExpired
	default: // submitted, validating, scheduled, in progress, stopping
		st.State = llm.BatchRunning
	}
	return st, nil
}

// CancelBatch stops job id; the records it finished keep their answers.
func (b *Batch) CancelBatch(ctx context.Context, id string) error {
	if _, err := b.control.StopModelInvocationJob(ctx, &bedrock.StopModelInvocationJobInput{JobIdentifier: aws.String(id)}); err != nil {
		return fmt.Errorf("bedrock batch %s: stop: %w", id, classifyControl(ctx, err))
	}
	return nil
}

// BatchResults reads the output of a final job: the records it answered
// or failed. A record it has no line for (a stopped or expired job's, or
// every record of a failed one) has no result: the caller sends it again.
func (b *Batch) BatchResults(ctx context.Context, id string) ([]llm.BatchResult, error) {
	j, err := b.control.GetModelInvocationJob(ctx, &bedrock.GetModelInvocationJobInput{JobIdentifier: aws.String(id)})
	if err != nil {
		return nil, fmt.Errorf("bedrock batch %s: %w", id, classifyControl(ctx, err))
	}
	key := aws.ToString(j.JobName)
	idsData, err := b.read(ctx, b.idsKey(key))
	if err != nil {
		return nil, fmt.Errorf("bedrock batch %s: %w", id, err)
	}
	var ids []string
	if err := json.Unmarshal(idsData, &ids); err != nil {
		return nil, fmt.Errorf("bedrock batch %s: the ids file: %w", id, err)
	}
	// Bedrock writes OUTPUT_URI/JOB_ID/INPUT_FILE.out, the job id being
	// the last part of its ARN.
	outKey := b.outputDir(key) + path.Base(id) + "/" + path.Base(b.inputKey(key)) + ".out"
	data, err := b.read(ctx, outKey)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, nil // a job failed whole wrote none
	}
	if err != nil {
		return nil, fmt.Errorf("bedrock batch %s: %w", id, err)
	}
	var out []llm.BatchResult
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var rec outputRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("bedrock batch %s: output line %d: %w", id, n, err)
		}
		var i int
		if _, err := fmt.Sscanf(rec.RecordID, "R%d", &i); err != nil || i < 1 || i > len(ids) {
			return nil, fmt.Errorf("bedrock batch %s: output line %d: record id %q is none of the job's", id, n, rec.RecordID)
		}
		out = append(out, rec.result(ids[i-1]))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bedrock batch %s: read the output: %w", id, err)
	}
	return out, nil
}

// read returns the object at key.
func (b *Batch) read(ctx context.Context, key string) ([]byte, error) {
	r, err := b.objects.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	return data, nil
}

// outputRecord is one line of a job's output.
type outputRecord struct {
	RecordID    string          `json:"recordId"`
	ModelOutput json.RawMessage `json:"modelOutput"`
	Error       *struct {
		ErrorCode    int    `json:"errorCode"`
		ErrorMessage string `json:"errorMessage"`
	} `json:"error"`
}

// result is the record's outcome for line id, classed as the online
// call's would be.
func (rec outputRecord) result(id string) llm.BatchResult {
	r := llm.BatchResult{ID: id}
	if e := rec.Error; e != nil {
		msg := llm.CleanMessage(e.ErrorMessage, "")
		lower := strings.ToLower(msg)
		class := llm.ClassOfStatus(e.ErrorCode)
		switch {
		case e.ErrorCode == 0:
			class = llm.ClassServer
		case strings.Contains(lower, "content filter") || strings.Contains(lower, "filtered") || strings.Contains(lower, "guardrail"):
			class = llm.ClassContentFilter
		case strings.Contains(lower, "too long") || strings.Contains(lower, "context window"):
			class = llm.ClassPromptTooLong
		}
		r.Err = &llm.Error{Class: class, StatusCode: e.ErrorCode, Message: fmt.Sprintf("%s (record %s, error %d)", msg, rec.RecordID, e.ErrorCode)}
		return r
	}
	resp, err := claudeResponse(rec.ModelOutput)
	if err != nil {
		r.Err = llm.Classify(err)
		return r
	}
	r.Response = resp
	return r
}

// claudeBody is req as an Anthropic Messages body of Bedrock's InvokeModel:
// columns through a forced tool whose input schema they are, as Converse
// is held to them online.
func claudeBody(req llm.Request) (json.RawMessage, error) {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body := map[string]any{
		"anthropic_version": "bedrock-2023-05-31",
		"max_tokens":        cmpOr(req.MaxTokens, 4096),
	}
	msgs := []message{{"user", req.Prompt}}
	for _, c := range req.Corrections {
		msgs = append(msgs, message{"assistant", c.Answer}, message{"user", c.FollowUp})
	}
	body["messages"] = msgs
	if req.System != "" {
		body["system"] = req.System
	}
	if req.Temperature != nil {
		body["temperature"] = *req.Temperature
	}
	if req.TopP != nil {
		body["top_p"] = *req.TopP
	}
	if s := req.ResponseSchema(); s != nil {
		body["tools"] = []map[string]any{{
			"name": answerToolName, "description": "Records the answer: one property per output column.", "input_schema": json.RawMessage(s),
		}}
		body["tool_choice"] = map[string]any{"type": "tool", "name": answerToolName}
	}
	out, err := json.Marshal(body)
	if err != nil {
		return nil, &llm.Error{Class: llm.ClassBadRequest, Message: "encode the request: " + err.Error()}
	}
	return out, nil
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// claudeResponse reads an Anthropic Messages answer: the forced tool's
// input when there is one, else its text blocks joined.
func claudeResponse(raw json.RawMessage) (llm.Response, error) {
	var m struct {
		Content []struct {
			Type  string          `json:"type"`
			Text  string          `json:"text"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		} `json:"content"`
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			CacheRead    int `json:"cache_read_input_tokens"`
			CacheWrite   int `json:"cache_creation_input_tokens"`
		} `json:"usage"`
	}
	if len(raw) == 0 {
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "a record with neither an answer nor an error"}
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return llm.Response{}, &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "the answer could not be read: " + err.Error()}
	}
	if m.StopReason == "refusal" {
		return llm.Response{}, &llm.Error{Class: llm.ClassContentFilter, StatusCode: http.StatusOK, Message: "the model refused to answer (stop_reason refusal)"}
	}
	u := llm.Usage{InputTokens: m.Usage.InputTokens + m.Usage.CacheRead + m.Usage.CacheWrite, OutputTokens: m.Usage.OutputTokens, CachedInputTokens: m.Usage.CacheRead}
	var text strings.Builder
	for _, c := range m.Content {
		switch {
		case c.Type == "tool_use" && c.Name == answerToolName && len(c.Input) > 0:
			return llm.Response{Text: string(c.Input), Usage: u}, nil
		case c.Type == "text":
			text.WriteString(c.Text)
		}
	}
	return llm.Response{Text: text.String(), Usage: u}, nil
}

// classifyControl turns a failed control-plane call into an *llm.Error: a
// quota (too many jobs in flight, a creation rate) is rate limited, as
// Converse's throttling is.
func classifyControl(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	status := 0
	var respErr *smithyhttp.ResponseError
	if errors.As(err, &respErr) {
		status = respErr.HTTPStatusCode()
	}
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		if llm.IsConnectionError(err) {
			return &llm.Error{Class: llm.ClassConnection, Message: err.Error(), Err: err}
		}
		return fromStatus(status, "", err)
	}
	e := &llm.Error{StatusCode: status, Message: llm.CleanMessage(apiErr.ErrorMessage(), "") + " (" + apiErr.ErrorCode() + ")", Err: err}
	switch apiErr.ErrorCode() {
	case "ThrottlingException", "ServiceQuotaExceededException", "TooManyTagsException":
		e.Class = llm.ClassRateLimited
	case "ValidationException", "ResourceNotFoundException", "ConflictException":
		e.Class = llm.ClassBadRequest
	case "AccessDeniedException", "UnrecognizedClientException", "ExpiredTokenException", "InvalidSignatureException":
		e.Class = llm.ClassAuth
	case "InternalServerException", "ServiceUnavailableException":
		e.Class = llm.ClassServer
	default:
		e.Class = llm.ClassOfStatus(status)
	}
	if e.RetryAfter == 0 && e.Class == llm.ClassRateLimited {
		e.RetryAfter = 30 * time.Second
	}
	return e
}
