package mockserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Bedrock's batch inference, on the same batch engine as OpenAI's Batch
// API (batch.go): the control-plane calls of the bedrock client, with the
// job's files in S3 (Config.Objects: the emulator's S3, say).
//
//	POST /model-invocation-job                 CreateModelInvocationJob: reads the input file
//	GET  /model-invocation-job/{arn}           GetModelInvocationJob: writes the output once it ends
//	POST /model-invocation-job/{arn}/stop      StopModelInvocationJob: the records done are kept
//	GET  /model-invocation-jobs                ListModelInvocationJobs (?nameContains, ?maxResults, ?nextToken)
//
// A record's modelInput is an Anthropic Messages body (Claude's); columns
// come as a forced tool, answered as its tool_use. Output lines are
// {"recordId", "modelInput", "modelOutput"} or {..., "error": {"errorCode",
// "errorMessage"}}, written to OUTPUT_URI/JOB_ID/INPUT_FILE.out with a
// manifest.json.out beside; records a stopped or expired job did not run
// have no line. A job takes 100 to 50,000 records.
const (
	minBedrockRecords = 100
	maxBedrockRecords = 50_000
	bedrockJobARN     = "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/"
)

// Objects reads and writes the S3 objects of Bedrock batch jobs.
type Objects interface {
	GetObject(ctx context.Context, bucket, key string) ([]byte, error)
	PutObject(ctx context.Context, bucket, key string, data []byte) error
}

// bedrockJob is what a Bedrock job adds to its batch.
type bedrockJob struct {
	name, token, model, role string
	inputURI, outputURI      string
	written                  bool
	writeErr                 error
}

// serveBedrockJobs routes the Bedrock control-plane paths; false when path
// is not one.
func (s *Server) serveBedrockJobs(w http.ResponseWriter, r *http.Request) bool {
	p := r.URL.EscapedPath()
	switch {
	case p == "/model-invocation-job" && r.Method == http.MethodPost:
		s.createBedrockJob(w, r)
	case p == "/model-invocation-jobs" && r.Method == http.MethodGet:
		s.listBedrockJobs(w, r)
	case strings.HasPrefix(p, "/model-invocation-job/"):
		rest := strings.TrimPrefix(p, "/model-invocation-job/")
		id, action, _ := strings.Cut(rest, "/")
		arn, err := url.PathUnescape(id)
		if err != nil || (action != "" && action != "stop") {
			bedrockError(w, http.StatusNotFound, "ResourceNotFoundException", "no such path: "+p)
			return true
		}
		s.bedrockJobAction(w, arn, action == "stop" && r.Method == http.MethodPost)
	default:
		return false
	}
	return true
}

// bedrockError answers as the restJson1 protocol words an error.
func bedrockError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("X-Amzn-ErrorType", code)
	writeJSON(w, status, map[string]string{"message": msg})
}

// parseS3URI splits s3://bucket/key.
func parseS3URI(uri string) (bucket, key string, ok bool) {
	rest, found := strings.CutPrefix(uri, "s3://")
	if !found {
		return "", "", false
	}
	bucket, key, _ = strings.Cut(rest, "/")
	return bucket, key, bucket != ""
}

func (s *Server) createBedrockJob(w http.ResponseWriter, r *http.Request) {
	var req struct {
		JobName            string `json:"jobName"`
		ClientRequestToken string `json:"clientRequestToken"`
		ModelID            string `json:"modelId"`
		RoleArn            string `json:"roleArn"`
		InputDataConfig    struct {
			S3InputDataConfig struct {
				S3URI string `json:"s3Uri"`
			} `json:"s3InputDataConfig"`
		} `json:"inputDataConfig"`
		OutputDataConfig struct {
			S3OutputDataConfig struct {
				S3URI string `json:"s3Uri"`
			} `json:"s3OutputDataConfig"`
		} `json:"outputDataConfig"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		bedrockError(w, http.StatusBadRequest, "ValidationException", "body: "+err.Error())
		return
	}
	in, out := req.InputDataConfig.S3InputDataConfig.S3URI, req.OutputDataConfig.S3OutputDataConfig.S3URI
	inBucket, inKey, okIn := parseS3URI(in)
	_, _, okOut := parseS3URI(out)
	switch {
	case req.JobName == "" || req.ModelID == "" || req.RoleArn == "":
		bedrockError(w, http.StatusBadRequest, "ValidationException", "jobName, modelId and roleArn are required")
		return
	case !okIn || !okOut:
		bedrockError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("input %q and output %q must be s3:// URIs", in, out))
		return
	case s.cfg.Objects == nil:
		bedrockError(w, http.StatusInternalServerError, "InternalServerException", "the mock has no S3 to read the input from (Config.Objects)")
		return
	}
	s.batch.mu.Lock()
	for _, b := range s.batch.batches {
		if j := b.bedrock; j != nil && j.name == req.JobName {
			s.batch.mu.Unlock()
			if j.token == req.ClientRequestToken && req.ClientRequestToken != "" {
				// The same request again: the job it made.
				writeJSON(w, http.StatusOK, map[string]string{"jobArn": bedrockJobARN + b.id})
				return
			}
			bedrockError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("a job named %s exists", req.JobName))
			return
		}
	}
	s.batch.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	data, err := s.cfg.Objects.GetObject(ctx, inBucket, inKey)
	if err != nil {
		bedrockError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("read the input %s: %v", in, err))
		return
	}
	var lines []batchLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var rec struct {
			RecordID   string          `json:"recordId"`
			ModelInput json.RawMessage `json:"modelInput"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil || rec.RecordID == "" || len(rec.ModelInput) == 0 {
			bedrockError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("input line %d: want {\"recordId\", \"modelInput\"}", n))
			return
		}
		lines = append(lines, batchLine{customID: rec.RecordID, body: rec.ModelInput})
	}
	if n := len(lines); n < minBedrockRecords || n > maxBedrockRecords {
		bedrockError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("the input has %d records; a job takes %d to %d", n, minBedrockRecords, maxBedrockRecords))
		return
	}
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	if s.overJobsLocked() {
		bedrockError(w, http.StatusBadRequest, "ServiceQuotaExceededException", fmt.Sprintf("You have exceeded the number of in-progress batch inference jobs (%d) for this model.", s.cfg.BatchJobsLimit))
		return
	}
	b := s.newBatchLocked("job", bedrockBatch{}, lines)
	b.bedrock = &bedrockJob{name: req.JobName, token: req.ClientRequestToken, model: req.ModelID, role: req.RoleArn, inputURI: in, outputURI: out}
	if s.answerLost(w) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"jobArn": bedrockJobARN + b.id})
}

// bedrockJobAction answers GetModelInvocationJob, stopping the job first
// for stop.
func (s *Server) bedrockJobAction(w http.ResponseWriter, arn string, stop bool) {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	b, ok := s.batch.batches[strings.TrimPrefix(arn, bedrockJobARN)]
	if !ok || b.bedrock == nil {
		bedrockError(w, http.StatusNotFound, "ResourceNotFoundException", "no job "+arn)
		return
	}
	s.advanceLocked(b)
	if stop {
		if !final(b.status) {
			b.cancelling, b.status = true, "cancelling"
		}
		writeJSON(w, http.StatusOK, map[string]any{})
		return
	}
	s.writeBedrockOutput(b)
	if err := b.bedrock.writeErr; err != nil {
		bedrockError(w, http.StatusInternalServerError, "InternalServerException", "write the output: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, bedrockJobObject(b))
}

// writeBedrockOutput writes a final job's output and manifest, once.
func (s *Server) writeBedrockOutput(b *mockBatch) {
	j := b.bedrock
	if !final(b.status) || j.written {
		return
	}
	bucket, prefix, _ := parseS3URI(j.outputURI)
	_, inKey, _ := parseS3URI(j.inputURI)
	dir := strings.TrimSuffix(prefix, "/") + "/" + b.id + "/"
	var out bytes.Buffer
	for _, r := range b.results {
		if r.line != nil {
			out.Write(append(r.line, '\n'))
		}
	}
	manifest, _ := json.Marshal(map[string]int{"totalRecordCount": len(b.lines), "processedRecordCount": b.answered + b.errored,
		"successRecordCount": b.answered, "errorRecordCount": b.errored})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j.writeErr = errors.Join(
		s.cfg.Objects.PutObject(ctx, bucket, dir+path.Base(inKey)+".out", out.Bytes()),
		s.cfg.Objects.PutObject(ctx, bucket, dir+"manifest.json.out", manifest))
	j.written = j.writeErr == nil
}

// bedrockStatus is b's status as Bedrock words it.
func bedrockStatus(b *mockBatch) string {
	switch {
	case b.status == "completed" && b.errored > 0:
		return "PartiallyCompleted"
	case b.status == "completed":
		return "Completed"
	case b.status == "cancelled":
		return "Stopped"
	case b.status == "expired":
		return "Expired"
	case b.status == "failed":
		return "Failed"
	case b.cancelling:
		return "Stopping"
	case b.status == "validating":
		return "Validating"
	}
	return "InProgress"
}

// bedrockJobObject is b as GetModelInvocationJob shows it.
func bedrockJobObject(b *mockBatch) map[string]any {
	j := b.bedrock
	o := map[string]any{
		"jobArn": bedrockJobARN + b.id, "jobName": j.name, "modelId": j.model, "roleArn": j.role, "clientRequestToken": j.token,
		"status": bedrockStatus(b), "submitTime": b.createdAt.UTC().Format(time.RFC3339Nano), "lastModifiedTime": b.createdAt.UTC().Format(time.RFC3339Nano),
		"inputDataConfig":      map[string]any{"s3InputDataConfig": map[string]string{"s3Uri": j.inputURI, "s3InputFormat": "JSONL"}},
		"outputDataConfig":     map[string]any{"s3OutputDataConfig": map[string]string{"s3Uri": j.outputURI}},
		"totalRecordCount":     len(b.lines),
		"processedRecordCount": b.answered + b.errored, "successRecordCount": b.answered, "errorRecordCount": b.errored,
	}
	if final(b.status) {
		o["endTime"] = b.finishedAt.UTC().Format(time.RFC3339Nano)
		o["lastModifiedTime"] = o["endTime"]
	}
	return o
}

// listBedrockJobs answers ListModelInvocationJobs, newest first.
func (s *Server) listBedrockJobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	max, err := strconv.Atoi(cmpOrString(q.Get("maxResults"), "100"))
	if err != nil || max < 1 || max > 1000 {
		bedrockError(w, http.StatusBadRequest, "ValidationException", "maxResults must be 1 to 1000")
		return
	}
	after := q.Get("nextToken")
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	var all []*mockBatch
	for _, b := range s.batch.batches {
		if b.bedrock != nil && strings.Contains(b.bedrock.name, q.Get("nameContains")) && (after == "" || b.id < after) {
			all = append(all, b)
		}
	}
	slices.SortFunc(all, func(a, b *mockBatch) int { return strings.Compare(b.id, a.id) })
	res := map[string]any{}
	if len(all) > max {
		all = all[:max]
		res["nextToken"] = all[max-1].id
	}
	sums := make([]map[string]any, len(all))
	for i, b := range all {
		s.advanceLocked(b)
		sums[i] = bedrockJobObject(b)
	}
	res["invocationJobSummaries"] = sums
	writeJSON(w, http.StatusOK, res)
}

// bedrockBatch is the format of Bedrock's batch records: an Anthropic
// Messages body per record, with columns as a forced tool.
type bedrockBatch struct{}

func (bedrockBatch) parse(s *Server, body json.RawMessage) (chatRequest, *apiError, int) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return badRequest("", "modelInput: invalid JSON: %v", err)
	}
	if string(m["anthropic_version"]) != `"bedrock-2023-05-31"` {
		return badRequest("anthropic_version", "anthropic_version: want bedrock-2023-05-31")
	}
	var tools []struct {
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	var choice struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	_ = json.Unmarshal(m["tools"], &tools)
	_ = json.Unmarshal(m["tool_choice"], &choice)
	delete(m, "tools")
	delete(m, "tool_choice")
	delete(m, "anthropic_version")
	m["model"] = json.RawMessage(`"bedrock-batch"`)
	plain, _ := json.Marshal(m)
	req, aerr, status := anthropic{}.parse(s, plain)
	if aerr != nil {
		return req, aerr, status
	}
	for _, t := range tools {
		if choice.Type == "tool" && t.Name == choice.Name {
			cols, packed, err := answerShape(t.InputSchema)
			if err != nil {
				return badRequest("tools", "tools: input_schema: %v", err)
			}
			req.columns, req.packed, req.jsonObject = cols, packed, false
		}
	}
	return req, nil, 0
}

func (bedrockBatch) line(b *mockBatch, i int, key string, v any) []byte {
	line, _ := json.Marshal(map[string]any{"recordId": b.lines[i].customID, "modelInput": b.lines[i].body, key: v})
	return line
}

func (f bedrockBatch) answer(b *mockBatch, i int, id int64, _ time.Time, req chatRequest, text, finish string) []byte {
	content := []map[string]any{{"type": "text", "text": text}}
	stop := "end_turn"
	if finish == "content_filter" {
		stop = "refusal"
	}
	if req.columns != nil || req.packed {
		content = []map[string]any{{"type": "tool_use", "id": fmt.Sprintf("toolu_mock%d", id), "name": "answer", "input": json.RawMessage(text)}}
		stop = "tool_use"
	}
	return f.line(b, i, "modelOutput", map[string]any{
		"id": fmt.Sprintf("msg_bdrk_mock%d", id), "type": "message", "role": "assistant", "content": content, "stop_reason": stop,
		"usage": map[string]int{"input_tokens": req.inTokens, "output_tokens": estimateTokens(text)},
	})
}

func (f bedrockBatch) failure(b *mockBatch, i int, status int, e apiError) []byte {
	return f.line(b, i, "error", map[string]any{"errorCode": status, "errorMessage": e.Message})
}

// unfinished: a record a stopped or expired job did not run has no line.
func (bedrockBatch) unfinished(*mockBatch, int, string) []byte { return nil }
