package openaillm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/batchgen/batchgen/internal/llm"
)

// The Batch API (Files and Batches): llm.BatchProvider. Each line is the
// chat completion Generate would send (structured outputs, JSON mode once
// learnt), under the caller's id as its custom_id; the answers are read
// from the output file and the error file, classed as online answers are.

// Limits of one OpenAI batch: a caller splits larger work into several.
const (
	MaxBatchLines = 50_000
	MaxBatchBytes = 200 << 20
)

var _ llm.BatchProvider = (*Provider)(nil)

// BatchLimits implements llm.BatchProvider.
func (p *Provider) BatchLimits() llm.BatchLimits {
	return llm.BatchLimits{Lines: MaxBatchLines, Bytes: MaxBatchBytes}
}

// KeyMetadata is the metadata field of a batch that holds the caller's
// key of it (llm.BatchProvider.SubmitBatch), by which FindBatch finds it.
const KeyMetadata = "batchgen_key"

// SubmitBatch uploads lines as a JSONL file and starts a batch over it,
// with the 24-hour completion window OpenAI sells, key in its metadata.
func (p *Provider) SubmitBatch(ctx context.Context, key string, lines []llm.BatchLine) (string, error) {
	if len(lines) == 0 || len(lines) > MaxBatchLines {
		return "", fmt.Errorf("openai batch of %d lines: a batch takes 1 to %d", len(lines), MaxBatchLines)
	}
	var file bytes.Buffer
	seen := make(map[string]bool, len(lines))
	for _, l := range lines {
		if l.ID == "" || seen[l.ID] {
			return "", fmt.Errorf("openai batch: line id %q is empty or used twice", l.ID)
		}
		seen[l.ID] = true
		params, _, err := p.params(l.Req)
		if err != nil {
			return "", fmt.Errorf("openai batch: line %s: %w", l.ID, err)
		}
		body, err := json.Marshal(params)
		if err != nil {
			return "", fmt.Errorf("openai batch: line %s: encode: %w", l.ID, err)
		}
		line, _ := json.Marshal(struct {
			CustomID string          `json:"custom_id"`
			Method   string          `json:"method"`
			URL      string          `json:"url"`
			Body     json.RawMessage `json:"body"`
		}{l.ID, http.MethodPost, "/v1/chat/completions", body})
		file.Write(append(line, '\n'))
		if file.Len() > MaxBatchBytes {
			return "", fmt.Errorf("openai batch: the file passes %d bytes at line %s; split the lines", MaxBatchBytes, l.ID)
		}
	}
	f, err := p.files.New(ctx, openai.FileNewParams{File: openai.File(&file, "batchgen.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if err != nil {
		return "", fmt.Errorf("openai batch: upload the file: %w", p.classify(ctx, ctx, err, nil))
	}
	b, err := p.batches.New(ctx, openai.BatchNewParams{
		InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h,
		Metadata: shared.Metadata{KeyMetadata: key},
	})
	if err != nil {
		return "", fmt.Errorf("openai batch: create it: %w", p.classify(ctx, ctx, err, nil))
	}
	return b.ID, nil
}

// FindBatch looks for the batch whose metadata holds q.Key among those
// created since q.Since (newest first, so the list is read no further
// back than that).
func (p *Provider) FindBatch(ctx context.Context, q llm.BatchQuery) (string, error) {
	oldest := q.Since.Add(-llm.FindWindow).Unix()
	it := p.batches.ListAutoPaging(ctx, openai.BatchListParams{Limit: openai.Int(100)})
	for it.Next() {
		b := it.Current()
		if b.CreatedAt < oldest {
			break
		}
		if b.Metadata[KeyMetadata] == q.Key && !q.Taken[b.ID] {
			return b.ID, nil
		}
	}
	if err := it.Err(); err != nil {
		return "", fmt.Errorf("openai batches: list them: %w", p.classify(ctx, ctx, err, nil))
	}
	return "", nil
}

// BatchStatus reports batch id.
func (p *Provider) BatchStatus(ctx context.Context, id string) (llm.BatchStatus, error) {
	b, err := p.batches.Get(ctx, id)
	if err != nil {
		return llm.BatchStatus{}, fmt.Errorf("openai batch %s: %w", id, p.classify(ctx, ctx, err, nil))
	}
	return batchStatus(b), nil
}

func batchStatus(b *openai.Batch) llm.BatchStatus {
	st := llm.BatchStatus{ID: b.ID, Total: int(b.RequestCounts.Total), Completed: int(b.RequestCounts.Completed), Failed: int(b.RequestCounts.Failed)}
	switch b.Status {
	case openai.BatchStatusCompleted:
		st.State = llm.BatchDone
	case openai.BatchStatusFailed:
		st.State = llm.BatchFailed
		for _, e := range b.Errors.Data {
			st.Error += fmt.Sprintf("line %d: %s (%s); ", e.Line, e.Message, e.Code)
			if e.Code == "token_limit_exceeded" || e.Code == "rate_limit_exceeded" {
				// The organization's enqueued-token limit: the batch was
				// refused whole, before any line ran.
				st.ErrorClass = llm.ClassRateLimited
			}
		}
	case openai.BatchStatusExpired:
		st.State = llm.BatchExpired
	case openai.BatchStatusCancelled:
		st.State = llm.BatchCancelled
	default: // validating, in progress, finalizing, cancelling
		st.State = llm.BatchRunning
	}
	return st
}

// CancelBatch asks OpenAI to stop batch id.
func (p *Provider) CancelBatch(ctx context.Context, id string) error {
	if _, err := p.batches.Cancel(ctx, id); err != nil {
		return fmt.Errorf("openai batch %s: cancel: %w", id, p.classify(ctx, ctx, err, nil))
	}
	return nil
}

// BatchResults reads the output and error files of a final batch. A line
// in neither (a batch that failed as a whole) has no result: the caller
// sends it again.
func (p *Provider) BatchResults(ctx context.Context, id string) ([]llm.BatchResult, error) {
	b, err := p.batches.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("openai batch %s: %w", id, p.classify(ctx, ctx, err, nil))
	}
	if st := batchStatus(b); !st.State.Final() {
		return nil, fmt.Errorf("openai batch %s is still running (%d of %d lines done)", id, st.Completed+st.Failed, st.Total)
	}
	var out []llm.BatchResult
	for _, fileID := range []string{b.OutputFileID, b.ErrorFileID} {
		if fileID == "" {
			continue
		}
		results, err := p.readResults(ctx, fileID)
		if err != nil {
			return nil, fmt.Errorf("openai batch %s: %w", id, err)
		}
		out = append(out, results...)
	}
	return out, nil
}

// batchResultLine is one line of an output or error file.
type batchResultLine struct {
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// readResults reads the results of one output or error file.
func (p *Provider) readResults(ctx context.Context, fileID string) ([]llm.BatchResult, error) {
	resp, err := p.files.Content(ctx, fileID)
	if err != nil {
		return nil, fmt.Errorf("read file %s: %w", fileID, p.classify(ctx, ctx, err, nil))
	}
	defer resp.Body.Close()
	var out []llm.BatchResult
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var l batchResultLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.CustomID == "" {
			return nil, fmt.Errorf("file %s line %d: not a batch result: %v", fileID, n, err)
		}
		out = append(out, p.batchResult(l))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read file %s: %w", fileID, err)
	}
	return out, nil
}

// batchResult classes one line's outcome as the online call's would be.
func (p *Provider) batchResult(l batchResultLine) llm.BatchResult {
	r := llm.BatchResult{ID: l.CustomID}
	switch {
	case l.Response != nil && l.Response.StatusCode == http.StatusOK:
		var cc openai.ChatCompletion
		if err := json.Unmarshal(l.Response.Body, &cc); err != nil {
			r.Err = &llm.Error{Class: llm.ClassServer, StatusCode: http.StatusOK, Message: "the answer could not be read: " + err.Error()}
			return r
		}
		resp, err := p.response(&cc)
		if err != nil {
			r.Err = llm.Classify(err)
			return r
		}
		r.Response = resp
	case l.Response != nil:
		var body struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(l.Response.Body, &body) // a body without an error object still has its status
		r.Err = p.fromStatus(l.Response.StatusCode, body.Error.Code, body.Error.Type, body.Error.Message, nil)
	case l.Error != nil && (l.Error.Code == "batch_expired" || l.Error.Code == "batch_cancelled"):
		r.Err = &llm.Error{Class: llm.ClassBatchUnfinished, Message: p.cfg.Clean(l.Error.Message + " (" + l.Error.Code + ")")}
	case l.Error != nil:
		r.Err = &llm.Error{Class: llm.ClassServer, Message: p.cfg.Clean(l.Error.Message + " (" + l.Error.Code + ")")}
	default:
		r.Err = &llm.Error{Class: llm.ClassServer, Message: "a batch result line with neither an answer nor an error"}
	}
	return r
}
