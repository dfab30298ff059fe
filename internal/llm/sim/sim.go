// Package sim is an in-process model provider: deterministic text, simulated
// latency, no network and no key. It is the embedded default when no provider
// is configured, so a fresh checkout can run a whole job end to end, and it
// lets pipeline tests count exactly how many calls reached "the model".
package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/batchgen/batchgen/internal/clip"
	"github.com/batchgen/batchgen/internal/clock"
	"github.com/batchgen/batchgen/internal/llm"
	"github.com/batchgen/batchgen/internal/schema"
)

// quoteRunes is how much of the prompt the generated sentence quotes: enough
// to recognise the row in a result sheet, short enough to stay one line.
const quoteRunes = 40

// Config configures a Provider.
type Config struct {
	// Latency is the simulated duration of every call. 0 answers at once.
	Latency time.Duration
	// Jitter spreads latency over [Latency-Jitter, Latency+Jitter] (clamped
	// at 0). The offset is derived from the request hash, so the same
	// request always takes the same time and runs stay reproducible.
	Jitter time.Duration
	// Clock waits out the latency. Defaults to clock.Real; tests pass a
	// clock.Fake to make calls return only when the clock is advanced.
	Clock clock.Clock
	// Fault, when set, is consulted before every call (after it is counted);
	// a non-nil result is returned as the call's error. It lets tests script
	// provider failures (e.g. a *llm.Error of ClassRateLimited for the first
	// call of a prompt) without a fake provider of their own. call is the
	// 1-based number of this call across the Provider's lifetime.
	Fault func(req llm.Request, call int64) error
	// BatchDelay is how long a batch takes (batch.go); 0 means
	// DefaultBatchDelay.
	BatchDelay time.Duration
}

// Provider is the simulator. It is safe for concurrent use.
type Provider struct {
	cfg        Config
	calls      atomic.Int64
	batches    batches
	batchLines atomic.Int64
}

var _ llm.Provider = (*Provider)(nil)

// New returns a simulator. Negative durations are treated as 0.
func New(cfg Config) *Provider {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	cfg.Latency = max(cfg.Latency, 0)
	cfg.Jitter = max(cfg.Jitter, 0)
	return &Provider{cfg: cfg}
}

// Calls returns how many times Generate has been called, including calls that
// failed or were cancelled. Tests use it to prove a row was not sent twice.
func (p *Provider) Calls() int64 { return p.calls.Load() }

// Generate returns a deterministic completion for req after the configured
// latency. A ctx that expires first yields a ClassTimeout *llm.Error; a
// cancelled ctx yields an error wrapping context.Canceled.
func (p *Provider) Generate(ctx context.Context, req llm.Request) (llm.Response, error) {
	n := p.calls.Add(1)
	if err := ctx.Err(); err != nil {
		return llm.Response{}, ctxError(err)
	}
	if p.cfg.Fault != nil {
		if err := p.cfg.Fault(req, n); err != nil {
			return llm.Response{}, err
		}
	}
	sum := requestHash(req)
	if d := p.latency(sum); d > 0 {
		select {
		case <-p.cfg.Clock.After(d):
		case <-ctx.Done():
			return llm.Response{}, ctxError(ctx.Err())
		}
	}
	text := Text(req)
	return llm.Response{
		Text: text,
		Usage: llm.Usage{
			InputTokens:  inputTokens(req),
			OutputTokens: llm.EstimateTokens(text),
		},
	}, nil
}

// inputTokens estimates what a real provider would bill as the request's
// input: the system prompt, the prompt, the shape asked for and every
// earlier exchange of a re-ask.
func inputTokens(req llm.Request) int {
	n := llm.EstimateTokens(req.System) + llm.EstimateTokens(req.Prompt)
	if sch := req.ResponseSchema(); sch != nil {
		n += llm.EstimateTokens(string(sch))
	}
	for _, c := range req.Corrections {
		n += llm.EstimateTokens(c.Answer) + llm.EstimateTokens(c.FollowUp)
	}
	return n
}

// latency is Latency shifted by a hash-derived offset in [-Jitter, +Jitter].
func (p *Provider) latency(sum uint64) time.Duration {
	d := p.cfg.Latency
	if j := p.cfg.Jitter; j > 0 {
		span := uint64(2*j) + 1
		d += time.Duration(sum>>8%span) - j
	}
	return max(d, 0)
}

func ctxError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &llm.Error{Class: llm.ClassTimeout, Message: "simulated model call timed out", Err: err}
	}
	return fmt.Errorf("simulated model call: %w", err)
}

// openers, middles and closers are combined by hash so that outputs differ
// across rows and read like short marketing copy in a result sheet.
var (
	openers = []string{"Meet", "Discover", "Say hello to", "Introducing", "Fall for", "Upgrade to"}
	middles = []string{
		"crafted for everyday delight",
		"where quality meets value",
		"made to stand out",
		"the pick your day deserves",
		"simple, smart and ready to go",
		"loved at first try",
	}
	closers = []string{"Order today.", "Try it now.", "You'll wonder how you lived without it.", "Treat yourself.", "See the difference."}
)

// Text is the completion the simulator gives for req: 【sim】 followed by a
// sentence chosen by a hash of everything that could change a real model's
// output (model, system prompt, prompt, temperature, top_p, max tokens) and
// quoting the first 40 runes of the prompt. Exported so tests can compute the
// expected output without calling Generate.
//
// A request with Columns gets a JSON object of their shape instead
// (structured): every column filled with a value of its type drawn from the
// same hash, its text columns quoting the prompt as the sentence does, so a
// test can tell whose answer it is.
//
// A packed call (Pack) gets each item's own answer, the one Text gives the
// item's prompt asked alone, under its id: packing changes how rows are
// sent, not what they are answered.
func Text(req llm.Request) string {
	if len(req.Pack) > 0 {
		answers := make([]string, len(req.Pack))
		for i, it := range req.Pack {
			one := req
			// The pack's completion cap is the rows' caps added up.
			one.Pack, one.Prompt, one.MaxTokens = nil, it.Prompt, req.MaxTokens/len(req.Pack)
			answers[i] = Text(one)
		}
		return schema.PackedText(req.Pack, answers, len(req.Columns) > 0)
	}
	sum := requestHash(req)
	if len(req.Columns) > 0 {
		return structured(req, sum)
	}
	pick := func(list []string, shift uint) string { return list[(sum>>shift)%uint64(len(list))] }
	return fmt.Sprintf("【sim】%s “%s”, %s. %s",
		pick(openers, 0), quote(req.Prompt), pick(middles, 16), pick(closers, 32))
}

// structured is the simulator's answer to a request with Columns: a JSON
// object with a valid value for every column, in order, each column drawn
// from its own bits of the request's hash, its text quoting the prompt.
func structured(req llm.Request, sum uint64) string {
	return req.Columns.SampleAnswer(
		func(i int) uint64 { return mix(sum + uint64(i)*0x9e3779b97f4a7c15) },
		func(c schema.Column) string { return fmt.Sprintf("【sim】%s “%s”", c.Name, quote(req.Prompt)) })
}

// quote returns the first quoteRunes runes of s with whitespace runs
// collapsed to one space, so multi-line prompts stay on one line; "…" marks a
// cut.
func quote(s string) string {
	return clip.Runes(strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " "), quoteRunes)
}

// requestHash hashes every field of req with length prefixes, so that field
// boundaries cannot be shifted to produce a collision ("ab"+"c" vs "a"+"bc").
func requestHash(req llm.Request) uint64 {
	h := fnv.New64a()
	var buf [8]byte
	writeString := func(s string) {
		binary.LittleEndian.PutUint64(buf[:], uint64(len(s)))
		h.Write(buf[:])
		h.Write([]byte(s))
	}
	writeFloat := func(f *float64) {
		if f == nil {
			h.Write([]byte{0})
			return
		}
		h.Write([]byte{1})
		binary.LittleEndian.PutUint64(buf[:], math.Float64bits(*f))
		h.Write(buf[:])
	}
	writeString(req.Model)
	writeString(req.System)
	writeString(req.Prompt)
	if len(req.Columns) > 0 {
		writeString(string(req.Columns.JSONSchema()))
	}
	writeFloat(req.Temperature)
	writeFloat(req.TopP)
	binary.LittleEndian.PutUint64(buf[:], uint64(req.MaxTokens))
	h.Write(buf[:])
	return mix(h.Sum64())
}

// mix is the splitmix64 finaliser: FNV's high bits are weak for short
// inputs, and the word choices above read different bit ranges.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
