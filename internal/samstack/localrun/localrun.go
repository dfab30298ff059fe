// Package localrun runs the batchgen stack on a local AWS emulator (moto,
// not LocalStack) with the Lambda handlers in-process, doing by hand what
// AWS does between the functions and moto does not:
//
//   - S3 notifications: moto invokes no Lambda when an object lands under
//     incoming/, so Watch polls the folder and hands each new object to the
//     splitter handler as an S3 ObjectCreated event.
//   - The SQS event source mapping: Pump receives up to 10 messages per
//     generator instance, hands them to the generator handler as one SQS
//     event and deletes the messages not reported in BatchItemFailures, as
//     the handler settled them (pipeline.Generator.Settle decides; the
//     handler has already changed the visibility of those it keeps).
//   - Step Functions calling the exporter: moto runs Lambda code only in
//     Docker, so a Task state on moto cannot reach a Go handler. Exports has
//     moto's own engine run the provisioned definition with the exporter's
//     Task turned into a callback that it answers in-process (see Exports),
//     then starts the named execution of the provisioned machine through
//     stepfn.Starter as well.
//   - The EventBridge schedule: SweepEvery calls the sweeper handler on a
//     ticker.
//
// The end-to-end test of internal/lambdafn and cmd/batchgen-localaws both
// drive the stack through this package.
package localrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/batchgen/batchgen/internal/awswire"
	"github.com/batchgen/batchgen/internal/blob/s3blob"
	"github.com/batchgen/batchgen/internal/lambdafn/exporterfn"
	"github.com/batchgen/batchgen/internal/lambdafn/generatorfn"
	"github.com/batchgen/batchgen/internal/lambdafn/splitterfn"
	"github.com/batchgen/batchgen/internal/lambdafn/sweeperfn"
	"github.com/batchgen/batchgen/internal/logging/lambdalog"
	"github.com/batchgen/batchgen/internal/metrics"
	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/samstack"
	"github.com/batchgen/batchgen/internal/stepfn"
	"github.com/batchgen/batchgen/internal/store"
)

// LambdaTimeout is the generator's Timeout in template.yaml: each
// invocation's context gets this deadline, as in Lambda.
const LambdaTimeout = 300 * time.Second

// exporterID is the exporter function's logical ID in template.yaml.
const exporterID = "ExporterFunction"

// Config says which provisioned stack to drive and how.
type Config struct {
	// AWS is the emulator's configuration (samstack.Config).
	AWS aws.Config
	// Resources is the stack provisioned from template.yaml.
	Resources *samstack.Resources
	// Env is the functions' configuration, as awswire.LoadEnv reads it
	// over Resources.Env().
	Env awswire.Env
	// Generators is how many generator instances the event source mapping
	// feeds, each with its own pipeline.Generator like a Lambda
	// environment. Defaults to 2.
	Generators int
	// Log receives the handlers' JSON logs at LogLevel. Defaults to
	// discarding them.
	Log      io.Writer
	LogLevel slog.Level
	// Metrics receives the handlers' EMF metric lines. Defaults to
	// discarding them.
	Metrics io.Writer
	// TempDir receives the splitter's downloads. Defaults to os.TempDir().
	TempDir string
	// IntervalScale multiplies the export definition's retry intervals
	// (rounded, at least ASL's 1 s) for the local run. 0 means 1.
	IntervalScale float64
	// Customize, when non-nil, adjusts a function's Deps before its handler
	// is built. function is "splitter", "generator-N", "exporter",
	// "sweeper", "statemachine" (the configuration the export
	// definition's own service calls, made by moto's engine, are recorded
	// through), "starter" or "store".
	Customize func(function string, d *awswire.Deps)
}

// Stack is a provisioned stack with the handlers wired on it. Its exported
// fields may be adjusted after New and before the first Pump.
type Stack struct {
	Resources *samstack.Resources
	Env       awswire.Env

	S3    *s3.Client
	SQS   *sqs.Client
	SFN   *sfn.Client
	Store store.Store

	Splitter   *splitterfn.Handler
	Generators []*generatorfn.Handler
	// InvocationTimeout is each generator invocation's deadline. Zero
	// means LambdaTimeout; a test shortens it to run invocations into
	// their deadline.
	InvocationTimeout time.Duration
	Sweeper           *sweeperfn.Handler
	Exports           *Exports

	region      string
	sweeperDeps *awswire.Deps
	// maxReceive is the highest ApproximateReceiveCount delivered.
	maxReceive atomic.Int64
	// seq numbers the S3 events, standing in for S3's sequencer.
	seq atomic.Int64
}

// New wires the handlers the way functions/* wire them, on cfg.Resources.
// Every export start (the splitter's for an empty task, the generators',
// the sweeper's) goes to the Exports stand-in.
func New(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.Resources == nil {
		return nil, errors.New("localrun: no resources")
	}
	logs, metricsOut := cfg.Log, cfg.Metrics
	if logs == nil {
		logs = io.Discard
	}
	if metricsOut == nil {
		metricsOut = io.Discard
	}
	deps := func(function string) *awswire.Deps {
		d := awswire.NewDeps(cfg.Env, cfg.AWS, function)
		d.Logger = lambdalog.New(logs, cfg.LogLevel).With("function", function)
		d.Metrics = metrics.New(metricsOut, nil, map[string]string{"function": function})
		if cfg.Customize != nil {
			cfg.Customize(function, d)
		}
		return d
	}
	region := cfg.AWS.Region
	if region == "" {
		region = samstack.Region
	}
	s := &Stack{
		Resources: cfg.Resources,
		Env:       cfg.Env,
		S3:        s3.NewFromConfig(cfg.AWS, func(o *s3.Options) { o.UsePathStyle = true }),
		SQS:       sqs.NewFromConfig(cfg.AWS),
		SFN:       sfn.NewFromConfig(cfg.AWS),
		Store:     deps("store").Store(s3blob.FromConfig(cfg.AWS, cfg.Env.BucketName, s3blob.Options{})),
		region:    region,
	}

	exporter, err := exporterfn.New(deps("exporter"))
	if err != nil {
		return nil, fmt.Errorf("localrun: exporter: %w", err)
	}
	exporterARN := cfg.Resources.FunctionARNs[exporterID]
	if exporterARN == "" {
		return nil, fmt.Errorf("localrun: provision recorded no ARN for %s: %v", exporterID, cfg.Resources.FunctionARNs)
	}
	// The engine's own service calls (the Catch path's UpdateItem) are
	// attributed to the state machine's configuration.
	s.Exports, err = newExports(ctx, s, cfg.Resources, exporterARN, handler(exporter.Handle), cfg.IntervalScale,
		stepfn.FromConfig(deps("starter").AWS, cfg.Env.StateMachineARN), deps("statemachine").AWS)
	if err != nil {
		return nil, fmt.Errorf("localrun: %w", err)
	}

	// Every export start (the splitter's for an empty task, the
	// generators', the sweeper's) goes to the Exports stand-in, which
	// starts the emulator's execution through the function's own starter.
	viaStandIn := func(d *awswire.Deps) *awswire.Deps {
		d.ExportStarter = s.Exports.Via(stepfn.FromConfig(d.AWS, d.Env.StateMachineARN))
		return d
	}
	sd := viaStandIn(deps("splitter"))
	sd.TempDir = cfg.TempDir
	if s.Splitter, err = splitterfn.New(sd); err != nil {
		return nil, fmt.Errorf("localrun: splitter: %w", err)
	}

	n := cfg.Generators
	if n <= 0 {
		n = 2
	}
	for i := range n {
		g, err := generatorfn.New(ctx, viaStandIn(deps(fmt.Sprintf("generator-%d", i+1))))
		if err != nil {
			return nil, fmt.Errorf("localrun: generator: %w", err)
		}
		s.Generators = append(s.Generators, g)
	}

	s.sweeperDeps = viaStandIn(deps("sweeper"))
	if s.Sweeper, err = sweeperfn.New(s.sweeperDeps); err != nil {
		return nil, fmt.Errorf("localrun: sweeper: %w", err)
	}
	return s, nil
}

// TuneSweeper rebuilds the sweeper handler with its configuration adjusted
// by tune (tests: no waiting, fewer claims).
func (s *Stack) TuneSweeper(tune func(*pipeline.SweeperConfig)) error {
	s.sweeperDeps.TuneSweeper = tune
	h, err := sweeperfn.New(s.sweeperDeps)
	if err != nil {
		return fmt.Errorf("localrun: sweeper: %w", err)
	}
	s.Sweeper = h
	return nil
}

// Via returns the stand-in for one function: the export runs as with
// StartExport, but the execution on the emulator is started through real,
// the function's own starter (built from its own AWS configuration), so
// the call is made, and recorded, as that function's. A nil real falls
// back to the stack's starter.
func (a *Exports) Via(real pipeline.ExportStarter) pipeline.ExportStarter {
	if real == nil {
		real = a.real
	}
	return exportsVia{a: a, real: real}
}

type exportsVia struct {
	a    *Exports
	real pipeline.ExportStarter
}

func (v exportsVia) StartExport(ctx context.Context, taskID string, generation int) error {
	return v.a.start(ctx, taskID, generation, v.real)
}

// IncomingKey is the drop-folder key for a file name.
func IncomingKey(name string) string { return pipeline.IncomingPrefix + name }

// Upload puts body under incoming/name and returns the S3 event S3 would
// send for it. Nothing is split until the event reaches the splitter (Watch
// or Splitter.Handle).
func (s *Stack) Upload(ctx context.Context, name string, body []byte) (events.S3Event, error) {
	return Upload(ctx, s.S3, s.Resources.BucketName, s.region, name, body)
}

// Upload puts body under incoming/name in bucket and returns the S3 event
// S3 would send for it.
func Upload(ctx context.Context, client *s3.Client, bucket, region, name string, body []byte) (events.S3Event, error) {
	key := IncomingKey(name)
	out, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body)})
	if err != nil {
		return events.S3Event{}, fmt.Errorf("upload s3://%s/%s: %w", bucket, key, err)
	}
	return ObjectCreated(region, bucket, Object{Key: key, Size: int64(len(body)), ETag: aws.ToString(out.ETag), VersionID: aws.ToString(out.VersionId)}, 0), nil
}

// Object is what an S3 event says about the object.
type Object struct {
	Key       string
	Size      int64
	ETag      string // quoted or not
	VersionID string
}

// ObjectCreated builds the ObjectCreated:Put event S3 sends to the
// splitter for obj, as in the Lambda event payload: the key URL-encoded
// with '+' for a space and '/' kept, the ETag unquoted. seq stands in for the
// sequencer.
func ObjectCreated(region, bucket string, obj Object, seq int64) events.S3Event {
	return events.S3Event{Records: []events.S3EventRecord{{
		EventVersion: "2.1",
		EventSource:  "aws:s3",
		AWSRegion:    region,
		EventTime:    time.Now().UTC(),
		EventName:    "ObjectCreated:Put",
		S3: events.S3Entity{
			SchemaVersion:   "1.0",
			ConfigurationID: "batchgen-localaws",
			Bucket:          events.S3Bucket{Name: bucket, Arn: "arn:aws:s3:::" + bucket},
			Object: events.S3Object{
				Key:           strings.ReplaceAll(url.QueryEscape(obj.Key), "%2F", "/"),
				URLDecodedKey: obj.Key,
				Size:          obj.Size,
				ETag:          strings.Trim(obj.ETag, `"`),
				VersionID:     obj.VersionID,
				Sequencer:     fmt.Sprintf("%018X", seq),
			},
		},
	}}}
}

// TaskID is the id the splitter derives for the drop-folder object in ev
// under the deployment's spec: the key and version (or ETag).
func TaskID(ev events.S3Event, spec store.TaskSpec) (string, error) {
	if len(ev.Records) == 0 {
		return "", errors.New("task id: the event has no records")
	}
	obj := ev.Records[0].S3.Object
	key, err := url.QueryUnescape(obj.Key)
	if err != nil {
		return "", fmt.Errorf("task id: key %q: %w", obj.Key, err)
	}
	return pipeline.DropTaskID(key, splitterfn.ObjectVersion(obj), spec), nil
}

// TaskID is the id the splitter derives for the object in ev.
func (s *Stack) TaskID(ev events.S3Event) (string, error) {
	spec, err := s.Env.DropSpec()
	if err != nil {
		return "", fmt.Errorf("task id: %w", err)
	}
	return TaskID(ev, spec)
}

// Split is one object Watch handed to the splitter.
type Split struct {
	Key    string
	TaskID string
	// Err is the splitter's error: the event will be handed over again on
	// the next poll, as Lambda retries an asynchronous invocation.
	Err error
}

// Watch polls incoming/ every interval until ctx ends and hands each
// object it has not handed over yet (by key and ETag) to the splitter as an
// S3 event, reporting each to report (which may be nil). Objects present
// at the start count as new: the splitter skips those whose task exists.
// An object the splitter moved to processed/ is forgotten once it is no
// longer listed, so the same content dropped again is handed over again.
// It returns nil when ctx ends, or the error of a listing that failed.
func (s *Stack) Watch(ctx context.Context, interval time.Duration, report func(Split)) error {
	seen := map[string]bool{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if err := s.watchOnce(ctx, seen, report); err != nil && ctx.Err() == nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (s *Stack) watchOnce(ctx context.Context, seen map[string]bool, report func(Split)) error {
	bucket := s.Resources.BucketName
	// The splitter moves what it took to processed/: an id no longer
	// listed is forgotten, so the same content dropped again under the same
	// name is handed over again, as S3 notifies every upload.
	listed := map[string]bool{}
	pages := s3.NewListObjectsV2Paginator(s.S3, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(pipeline.IncomingPrefix)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list s3://%s/%s: %w", bucket, pipeline.IncomingPrefix, err)
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			id := key + "@" + aws.ToString(o.ETag)
			listed[id] = true
			// The notification passes every key under the prefix; keys that are not sheets would reach the
			// splitter only to be ignored, so they are not handed over (nor reported) at all.
			if seen[id] || !pipeline.IsInputKey(key) {
				continue
			}
			// HeadObject for the version, which the listing lacks and the
			// splitter derives the task id from on a versioned bucket.
			head, err := s.S3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
			if err != nil {
				if ctx.Err() == nil && report != nil {
					report(Split{Key: key, Err: fmt.Errorf("head s3://%s/%s: %w", bucket, key, err)})
				}
				continue
			}
			ev := ObjectCreated(s.region, bucket, Object{
				Key: key, Size: aws.ToInt64(head.ContentLength), ETag: aws.ToString(head.ETag), VersionID: aws.ToString(head.VersionId),
			}, s.seq.Add(1))
			split := Split{Key: key}
			split.TaskID, split.Err = s.TaskID(ev)
			if split.Err == nil {
				split.Err = s.Splitter.Handle(ctx, ev)
			}
			if ctx.Err() != nil {
				return nil
			}
			if split.Err == nil {
				seen[id] = true
			}
			if report != nil {
				report(split)
			}
		}
	}
	for id := range seen {
		if !listed[id] {
			delete(seen, id)
		}
	}
	return nil
}

// Pump is the SQS event source mapping: each generator instance polls the
// queue, hands up to 10 messages to its handler as one event, and deletes
// the messages not reported as batch item failures. An instance stops when
// until (if non-nil) reports true before a poll; Pump returns when every
// instance stopped or ctx ended.
//
// A generator that returns an error (which on Lambda retries the whole
// event) goes to onErr; the messages come back after their visibility
// timeout. With onErr nil, or when onErr returns an error, Pump stops every
// instance and returns it.
func (s *Stack) Pump(ctx context.Context, until func(context.Context) bool, onErr func(error) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed error
	)
	for _, g := range s.Generators {
		wg.Go(func() {
			for ctx.Err() == nil {
				if until != nil && until(ctx) {
					return
				}
				err := s.PollOnce(ctx, g)
				if err == nil || ctx.Err() != nil {
					continue
				}
				if onErr != nil {
					err = onErr(err)
				}
				if err != nil {
					mu.Lock()
					if failed == nil {
						failed = fmt.Errorf("event source mapping: %w", err)
					}
					mu.Unlock()
					cancel()
					return
				}
				// Lambda retries a failed event only after its visibility
				// timeout; poll again a little later rather than at once.
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		})
	}
	wg.Wait()
	return failed
}

// PollOnce receives up to 10 messages (waiting up to a second), hands them
// to g as one SQS event under an invocation deadline of InvocationTimeout and
// deletes those not reported as failures. An error of the handler itself
// is returned, the messages left to their visibility timeout; a failed
// delete is not an error (the message is redelivered and acknowledged).
func (s *Stack) PollOnce(ctx context.Context, g *generatorfn.Handler) error {
	queueURL := s.Resources.QueueURL
	out, err := s.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(queueURL),
		MaxNumberOfMessages:         10,
		WaitTimeSeconds:             1,
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
	})
	if err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	if len(out.Messages) == 0 {
		return nil
	}
	ev, err := s.sqsEvent(out.Messages)
	if err != nil {
		return err
	}
	timeout := s.InvocationTimeout
	if timeout <= 0 {
		timeout = LambdaTimeout
	}
	ictx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := g.Handle(ictx, ev)
	if err != nil {
		return fmt.Errorf("generator returned an error: %w", err)
	}
	failed := map[string]bool{}
	for _, f := range resp.BatchItemFailures {
		failed[f.ItemIdentifier] = true
	}
	for _, r := range ev.Records {
		if failed[r.MessageId] {
			continue
		}
		// Like the real mapping, a failed delete is not the handler's
		// error: the message comes back after its visibility timeout and
		// the generator acknowledges it then (pipeline.SettleDelete).
		_, _ = s.SQS.DeleteMessage(ictx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: aws.String(r.ReceiptHandle)})
	}
	return nil
}

// sqsEvent builds the event the mapping delivers for msgs, noting the
// highest receive count.
func (s *Stack) sqsEvent(msgs []sqstypes.Message) (events.SQSEvent, error) {
	var ev events.SQSEvent
	for _, m := range msgs {
		r := events.SQSMessage{
			MessageId:         aws.ToString(m.MessageId),
			ReceiptHandle:     aws.ToString(m.ReceiptHandle),
			Body:              aws.ToString(m.Body),
			Md5OfBody:         aws.ToString(m.MD5OfBody),
			Attributes:        map[string]string{},
			MessageAttributes: map[string]events.SQSMessageAttribute{},
			EventSourceARN:    s.Resources.QueueARN,
			EventSource:       "aws:sqs",
			AWSRegion:         s.region,
		}
		for k, v := range m.Attributes {
			r.Attributes[k] = v
		}
		n, err := strconv.Atoi(r.Attributes["ApproximateReceiveCount"])
		if err != nil {
			return events.SQSEvent{}, fmt.Errorf("message %s: ApproximateReceiveCount %q", r.MessageId, r.Attributes["ApproximateReceiveCount"])
		}
		for cur := s.maxReceive.Load(); int64(n) > cur && !s.maxReceive.CompareAndSwap(cur, int64(n)); cur = s.maxReceive.Load() {
		}
		ev.Records = append(ev.Records, r)
	}
	return ev, nil
}

// MaxReceiveCount is the highest ApproximateReceiveCount delivered so far:
// above 1 once a message came back.
func (s *Stack) MaxReceiveCount() int64 { return s.maxReceive.Load() }

// SweepEvery runs the sweeper handler every interval until ctx ends, as
// the template's schedule does, reporting a failed pass to onErr (which
// may be nil); the next tick sweeps again.
func (s *Stack) SweepEvery(ctx context.Context, interval time.Duration, onErr func(error)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if _, err := s.Sweeper.Handle(ctx, events.EventBridgeEvent{Source: "aws.events", DetailType: "Scheduled Event"}); err != nil && ctx.Err() == nil && onErr != nil {
			onErr(err)
		}
	}
}

// TaskFinal reports whether taskID exists and is final; errors count as
// not yet.
func (s *Stack) TaskFinal(ctx context.Context, taskID string) bool {
	t, err := s.Store.GetTask(ctx, taskID)
	return err == nil && t.State.Final()
}

// Download copies s3://bucket/key to the file at path.
func (s *Stack) Download(ctx context.Context, key, path string) error {
	return Download(ctx, s.S3, s.Resources.BucketName, key, path)
}

// Download copies s3://bucket/key to the file at path, through a
// temporary file beside it so a failed download leaves no partial file.
func Download(ctx context.Context, client *s3.Client, bucket, key, path string) error {
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return fmt.Errorf("download s3://%s/%s: %w", bucket, key, err)
	}
	defer out.Body.Close()
	f, err := os.CreateTemp(filepath.Dir(path), ".download-*")
	if err != nil {
		return fmt.Errorf("download s3://%s/%s: %w", bucket, key, err)
	}
	_, err = io.Copy(f, out.Body)
	if err == nil {
		err = f.Chmod(0o644) // CreateTemp's 0600 is for the partial file only
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("download s3://%s/%s to %s: %w", bucket, key, path, err)
	}
	return nil
}
