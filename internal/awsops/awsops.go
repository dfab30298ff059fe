// Package awsops records the AWS operations a set of SDK clients performs,
// through aws-sdk-go-v2 middleware: which operations (as
// "dynamodb:TransactWriteItems", "sqs:SendMessageBatch", ...), how many of
// each, and which IAM actions they need.
//
// It serves two kinds of tests: counting AWS calls per unit of work (the
// write budget, the benchmark), and checking that template.yaml grants each
// function the actions its clients use and nothing more. A Recorder is
// attached to an aws.Config, so every client built from that configuration
// reports to it:
//
//	rec := awsops.New()
//	cfg = rec.Attach(cfg)                 // or cfg.APIOptions = append(cfg.APIOptions, rec.Middleware)
//	client := dynamodb.NewFromConfig(cfg)
//	...
//	rec.Counts() // map[dynamodb:GetItem:3 dynamodb:TransactWriteItems:1]
//
// A Set keeps one Recorder per function, for stacks that wire several.
package awsops

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Recorder counts the operations of the clients it is attached to. It is
// safe for concurrent use; the zero value is not ready, use New.
type Recorder struct {
	mu        sync.Mutex
	calls     map[string]int
	presigned map[string]int
	actions   map[string]struct{}
}

// New returns an empty Recorder.
func New() *Recorder {
	return &Recorder{calls: map[string]int{}, presigned: map[string]int{}, actions: map[string]struct{}{}}
}

// Attach returns a copy of cfg whose clients report to r. The copy has its
// own APIOptions slice, so configurations attached to different recorders
// never share one.
func (r *Recorder) Attach(cfg aws.Config) aws.Config {
	cfg.APIOptions = append(slices.Clone(cfg.APIOptions), r.Middleware)
	return cfg
}

// Middleware adds r's recording step to an operation's stack; it has the
// signature of aws.Config.APIOptions and of a client's Options.APIOptions.
func (r *Recorder) Middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("awsops.Recorder",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			out, md, err := next.HandleInitialize(ctx, in)
			_, presign := out.Result.(*v4.PresignedHTTPRequest)
			serviceID := middleware.GetServiceID(ctx)
			r.record(serviceID, middleware.GetOperationName(ctx), in.Parameters, presign)
			if serviceID == "S3" && isNotFound(err) {
				// S3 tells a caller that a key does not exist (404) only
				// when the caller may list the bucket; without
				// s3:ListBucket the same read is refused with 403
				// AccessDenied, which code reading "missing" as "none"
				// takes for a failure. An emulator answers 404 either
				// way, so a 404 seen here means the role needs the grant.
				r.mu.Lock()
				r.actions["s3:ListBucket"] = struct{}{}
				r.mu.Unlock()
			}
			return out, md, err
		}), middleware.Before)
}

// record counts one operation, successful or not: a failed call was still
// sent (and authorised or refused by IAM).
func (r *Recorder) record(serviceID, operation string, params any, presign bool) {
	op := Name(serviceID, operation)
	actions := IAMActions(serviceID, operation, params)
	r.mu.Lock()
	defer r.mu.Unlock()
	if presign {
		r.presigned[op]++
	} else {
		r.calls[op]++
	}
	for _, a := range actions {
		r.actions[a] = struct{}{}
	}
}

// isNotFound reports whether err is a service's HTTP 404 answer.
func isNotFound(err error) bool {
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound
}

// Counts returns how many times each operation was called, keyed by Name.
// Presigned requests are not calls (the SDK signs them locally; the holder
// of the URL sends them) and are not counted here; see Presigned.
func (r *Recorder) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.calls)
}

// Presigned returns how many requests of each operation were presigned.
func (r *Recorder) Presigned() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.presigned)
}

// Total returns the number of AWS calls made, presigned requests excluded.
func (r *Recorder) Total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

// Ops returns the operations called or presigned, sorted.
func (r *Recorder) Ops() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := slices.Collect(maps.Keys(r.calls))
	for op := range r.presigned {
		if _, ok := r.calls[op]; !ok {
			ops = append(ops, op)
		}
	}
	slices.Sort(ops)
	return ops
}

// Actions returns the IAM actions the recorded operations need, sorted:
// presigned requests included, since they are sent with the signer's
// permissions.
func (r *Recorder) Actions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.actions))
}

// Reset forgets everything recorded, for counting one phase of a test.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.calls)
	clear(r.presigned)
	clear(r.actions)
}

// Set keeps one Recorder per name (a function, a client set). It is safe for
// concurrent use; the zero value is ready.
type Set struct {
	mu sync.Mutex
	m  map[string]*Recorder
}

// For returns name's Recorder, creating it on first use.
func (s *Set) For(name string) *Recorder {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*Recorder{}
	}
	r, ok := s.m[name]
	if !ok {
		r = New()
		s.m[name] = r
	}
	return r
}

// Names returns the names with a Recorder, sorted.
func (s *Set) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.m))
}

// Total returns the calls made across every Recorder in the set.
func (s *Set) Total() int {
	s.mu.Lock()
	recs := slices.Collect(maps.Values(s.m))
	s.mu.Unlock()
	n := 0
	for _, r := range recs {
		n += r.Total()
	}
	return n
}

// Name is an operation's name as the Recorder reports it: the service's IAM
// prefix, a colon and the API operation, e.g. "dynamodb:TransactWriteItems",
// "states:StartExecution". serviceID is the SDK's service ID ("DynamoDB",
// "SFN").
func Name(serviceID, operation string) string {
	return servicePrefix(serviceID) + ":" + operation
}

// servicePrefix maps an SDK service ID to its IAM service prefix.
func servicePrefix(serviceID string) string {
	switch serviceID {
	case "SFN":
		return "states"
	default:
		return strings.ToLower(strings.ReplaceAll(serviceID, " ", ""))
	}
}

// IAMActions returns the IAM actions an operation needs. Most operations
// need the action of their own name; the exceptions are encoded here:
//
//   - DynamoDB transactions are authorised per item: TransactWriteItems
//     needs PutItem, UpdateItem, DeleteItem or ConditionCheckItem for each
//     kind of item it holds, TransactGetItems needs GetItem. params is the
//     operation's input, inspected for that.
//   - SQS batch operations need their single-message action.
//   - S3 operations map onto S3's coarser actions (HeadObject needs
//     GetObject, ListObjectsV2 needs ListBucket, multipart uploads need
//     PutObject).
func IAMActions(serviceID, operation string, params any) []string {
	prefix := servicePrefix(serviceID)
	action := func(names ...string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = prefix + ":" + n
		}
		return out
	}
	switch prefix {
	case "dynamodb":
		switch in := params.(type) {
		case *dynamodb.TransactWriteItemsInput:
			var names []string
			for _, it := range in.TransactItems {
				switch {
				case it.Put != nil:
					names = append(names, "PutItem")
				case it.Update != nil:
					names = append(names, "UpdateItem")
				case it.Delete != nil:
					names = append(names, "DeleteItem")
				case it.ConditionCheck != nil:
					names = append(names, "ConditionCheckItem")
				}
			}
			slices.Sort(names)
			return action(slices.Compact(names)...)
		case *dynamodb.TransactGetItemsInput:
			return action("GetItem")
		}
	case "sqs":
		if base, ok := strings.CutSuffix(operation, "Batch"); ok {
			return action(base)
		}
	case "s3":
		switch operation {
		case "HeadObject":
			return action("GetObject")
		case "ListObjectsV2", "ListObjects", "HeadBucket":
			return action("ListBucket")
		case "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload":
			return action("PutObject")
		case "UploadPartCopy", "CopyObject":
			return action("GetObject", "PutObject")
		case "DeleteObjects":
			return action("DeleteObject")
		case "ListMultipartUploads":
			return action("ListBucketMultipartUploads")
		case "ListParts":
			return action("ListMultipartUploadParts")
		}
	}
	return action(operation)
}
