package anthropicllm

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/batchgen/batchgen/internal/llm"
)

// Message Batches: llm.BatchProvider. Each request is the message
// Generate would send, under the caller's id as its custom_id; each result
// (succeeded, errored, canceled or expired) is classed as the online
// call's would be.

// Limits of one Anthropic batch: a caller splits larger work into several.
const (
	MaxBatchRequests = 100_000
	MaxBatchBytes    = 256 << 20
)

var _ llm.BatchProvider = (*Provider)(nil)

// BatchLimits implements llm.BatchProvider.
func (p *Provider) BatchLimits() llm.BatchLimits {
	return llm.BatchLimits{Lines: MaxBatchRequests, Bytes: MaxBatchBytes}
}

// SubmitBatch sends lines as one Message Batch. Message Batches keep no
// metadata, so key is not sent: FindBatch finds a batch by its size and
// time instead.
func (p *Provider) SubmitBatch(ctx context.Context, _ string, lines []llm.BatchLine) (string, error) {
	if len(lines) == 0 || len(lines) > MaxBatchRequests {
		return "", fmt.Errorf("anthropic batch of %d lines: a batch takes 1 to %d", len(lines), MaxBatchRequests)
	}
	reqs := make([]anthropic.MessageBatchNewParamsRequest, len(lines))
	seen := make(map[string]bool, len(lines))
	size := 0
	for i, l := range lines {
		if l.ID == "" || seen[l.ID] {
			return "", fmt.Errorf("anthropic batch: line id %q is empty or used twice", l.ID)
		}
		seen[l.ID] = true
		params, _, err := p.params(l.Req)
		if err != nil {
			return "", fmt.Errorf("anthropic batch: line %s: %w", l.ID, err)
		}
		// A batch request takes the Messages request's fields under its
		// own type: carried over through their JSON.
		raw, err := json.Marshal(params)
		if err != nil {
			return "", fmt.Errorf("anthropic batch: line %s: encode: %w", l.ID, err)
		}
		if size += len(raw); size > MaxBatchBytes {
			return "", fmt.Errorf("anthropic batch: the requests pass %d bytes at line %s; split the lines", MaxBatchBytes, l.ID)
		}
		reqs[i] = anthropic.MessageBatchNewParamsRequest{CustomID: l.ID}
		if err := json.Unmarshal(raw, &reqs[i].Params); err != nil {
			return "", fmt.Errorf("anthropic batch: line %s: %w", l.ID, err)
		}
	}
	b, err := p.batches.New(ctx, anthropic.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		return "", fmt.Errorf("anthropic batch: create it: %w", p.classify(ctx, ctx, err, nil))
	}
	return b.ID, nil
}

// FindBatch looks for the batch q describes among those created within
// llm.FindWindow of q.Since: Message Batches keep no metadata to find it
// by its key, so it is the batch of q.Lines requests, not taken, created
// nearest after q.Since. Two batches of the same size sent in the same
// minutes and both lost could be told apart only by their results (the
// lines' ids), which come when they end: each is taken by one of them, and
// a line found in neither is sent again once its batch ends.
func (p *Provider) FindBatch(ctx context.Context, q llm.BatchQuery) (string, error) {
	from, to := q.Since.Add(-time.Minute), q.Since.Add(llm.FindWindow)
	var best anthropic.MessageBatch
	it := p.batches.ListAutoPaging(ctx, anthropic.MessageBatchListParams{Limit: anthropic.Int(100)})
	for it.Next() {
		b := it.Current()
		if b.CreatedAt.Before(from.Add(-time.Minute)) {
			break // newest first: the rest are older still
		}
		c := b.RequestCounts
		total := int(c.Processing + c.Succeeded + c.Errored + c.Canceled + c.Expired)
		if total != q.Lines || q.Taken[b.ID] || b.CreatedAt.Before(from) || b.CreatedAt.After(to) {
			continue
		}
		// Newest first: of batches created at the same instant, the
		// last seen is the first created.
		if best.ID == "" || !b.CreatedAt.After(best.CreatedAt) {
			best = b
		}
	}
	if err := it.Err(); err != nil {
		return "", fmt.Errorf("anthropic batches: list them: %w", p.classify(ctx, ctx, err, nil))
	}
	return best.ID, nil
}

// BatchStatus reports batch id.
func (p *Provider) BatchStatus(ctx context.Context, id string) (llm.BatchStatus, error) {
	b, err := p.batches.Get(ctx, id, anthropic.MessageBatchGetParams{})
	if err != nil {
		return llm.BatchStatus{}, fmt.Errorf("anthropic batch %s: %w", id, p.classify(ctx, ctx, err, nil))
	}
	c := b.RequestCounts
	st := llm.BatchStatus{ID: b.ID, Completed: int(c.Succeeded), Failed: int(c.Errored + c.Canceled + c.Expired),
		Total: int(c.Processing + c.Succeeded + c.Errored + c.Canceled + c.Expired)}
	switch {
	case b.ProcessingStatus != anthropic.MessageBatchProcessingStatusEnded:
		st.State = llm.BatchRunning
	case c.Canceled > 0:
		st.State = llm.BatchCancelled
	case c.Expired > 0:
		st.State = llm.BatchExpired
	default:
		st.State = llm.BatchDone
	}
	return st, nil
}

// CancelBatch asks Anthropic to stop batch id.
func (p *Provider) CancelBatch(ctx context.Context, id string) error {
	if _, err := p.batches.Cancel(ctx, id, anthropic.MessageBatchCancelParams{}); err != nil {
		return fmt.Errorf("anthropic batch %s: cancel: %w", id, p.classify(ctx, ctx, err, nil))
	}
	return nil
}

// BatchResults reads the results of an ended batch.
func (p *Provider) BatchResults(ctx context.Context, id string) ([]llm.BatchResult, error) {
	stream := p.batches.ResultsStreaming(ctx, id, anthropic.MessageBatchResultsParams{})
	defer stream.Close()
	var out []llm.BatchResult
	for stream.Next() {
		out = append(out, p.batchResult(stream.Current()))
	}
	if err := stream.Err(); err != nil {
		return nil, fmt.Errorf("anthropic batch %s: results: %w", id, p.classify(ctx, ctx, err, nil))
	}
	return out, nil
}

// batchResult classes one result as the online call's would be.
func (p *Provider) batchResult(r anthropic.MessageBatchIndividualResponse) llm.BatchResult {
	out := llm.BatchResult{ID: r.CustomID}
	switch r.Result.Type {
	case "succeeded":
		msg := r.Result.Message
		resp, err := p.response(&msg)
		if err != nil {
			out.Err = llm.Classify(err)
			return out
		}
		out.Response = resp
	case "errored":
		e := r.Result.Error.Error
		out.Err = p.fromStatus(statusOfType(e.Type), e.Type, e.Message, nil)
	case "canceled", "expired":
		out.Err = &llm.Error{Class: llm.ClassBatchUnfinished, Message: "the batch " + r.Result.Type + " before this request ran"}
	default:
		out.Err = &llm.Error{Class: llm.ClassServer, Message: fmt.Sprintf("a batch result of type %q", r.Result.Type)}
	}
	return out
}

// statusOfType is the HTTP status Anthropic answers an error type with
// online: a batch's errored result carries the type alone.
func statusOfType(typ string) int {
	switch typ {
	case "invalid_request_error":
		return http.StatusBadRequest
	case "authentication_error":
		return http.StatusUnauthorized
	case "billing_error":
		return http.StatusPaymentRequired
	case "permission_error":
		return http.StatusForbidden
	case "not_found_error":
		return http.StatusNotFound
	case "request_too_large":
		return http.StatusRequestEntityTooLarge
	case "rate_limit_error":
		return http.StatusTooManyRequests
	case "overloaded_error":
		return 529
	case "timeout_error":
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
