// Package logging builds batchgen's slog loggers and carries the attributes
// of the work in hand (task_id, batch_no, row, attempt, provider, the Lambda
// request id) in the context, so every line logged on a task's path names
// them without each call site repeating them.
//
// Three shapes, one per runtime:
//   - lambdalog.New: JSON in CloudWatch's JSON log format (timestamp, level,
//     message, requestId from the invocation's lambdacontext); a package of
//     its own so the core never links aws-lambda-go.
//   - NewJSON: JSON lines for `batchgen serve` (a log shipper's input).
//   - NewText: key=value text for the CLI, whose human output is the
//     progress display, not the log.
//
// Log through the *Context methods (InfoContext, WarnContext, ...) with the
// context that With returned; the handler adds the context's attributes.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
)

// Attribute keys shared by every runtime, so a query for one task, batch or
// request works on any log.
const (
	TaskID    = "task_id"
	BatchNo   = "batch_no"
	Row       = "row"
	Attempt   = "attempt"
	Provider  = "provider"
	RequestID = "requestId" // CloudWatch's JSON log format names it so
)

type ctxKey struct{}

// With returns a context whose log lines carry args (slog key-value pairs
// or slog.Attr values) after those ctx already carries. A key given again
// replaces the earlier value, so a row's context can refine a batch's.
func With(ctx context.Context, args ...any) context.Context {
	if len(args) == 0 {
		return ctx
	}
	add := argsToAttrs(args)
	prev := Attrs(ctx)
	attrs := make([]slog.Attr, 0, len(prev)+len(add))
	for _, a := range prev {
		if !slices.ContainsFunc(add, func(b slog.Attr) bool { return b.Key == a.Key }) {
			attrs = append(attrs, a)
		}
	}
	attrs = append(attrs, add...)
	return context.WithValue(ctx, ctxKey{}, attrs)
}

// Without returns a context whose log lines no longer carry keys: for work
// started on another's path (an export started by a batch's last row)
// that must not name the batch.
func Without(ctx context.Context, keys ...string) context.Context {
	prev := Attrs(ctx)
	kept := make([]slog.Attr, 0, len(prev))
	for _, a := range prev {
		if !slices.Contains(keys, a.Key) {
			kept = append(kept, a)
		}
	}
	if len(kept) == len(prev) {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, kept)
}

// Attrs returns the attributes ctx carries (see With).
func Attrs(ctx context.Context) []slog.Attr {
	if ctx == nil {
		return nil
	}
	attrs, _ := ctx.Value(ctxKey{}).([]slog.Attr)
	return attrs
}

// argsToAttrs turns slog-style arguments into attributes the way
// slog.Logger.With does (a lone key becomes "!BADKEY").
func argsToAttrs(args []any) []slog.Attr {
	r := slog.Record{}
	r.Add(args...)
	attrs := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, a)
		return true
	})
	return attrs
}

// Extractor returns attributes a runtime keeps in the context under its own
// key (the Lambda request id, say).
type Extractor func(context.Context) []slog.Attr

// Handler adds the context's attributes (With, then each Extractor's) to
// every record before passing it to the wrapped handler.
type Handler struct {
	inner   slog.Handler
	extract []Extractor
	// named are the keys given through WithAttrs: a context attribute of
	// the same key is not repeated.
	named []string
}

// NewHandler wraps inner, adding what extract finds in the context too.
func NewHandler(inner slog.Handler, extract ...Extractor) *Handler {
	return &Handler{inner: inner, extract: extract}
}

// Enabled reports whether the wrapped handler takes level.
func (h *Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

// Handle adds ctx's attributes to r and passes it on.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	var own []string
	if r.NumAttrs() > 0 {
		r.Attrs(func(a slog.Attr) bool {
			own = append(own, a.Key)
			return true
		})
	}
	for _, a := range Attrs(ctx) {
		if !slices.Contains(own, a.Key) && !slices.Contains(h.named, a.Key) {
			r.AddAttrs(a)
		}
	}
	for _, x := range h.extract {
		r.AddAttrs(x(ctx)...)
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs returns a Handler whose records carry attrs.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	named := slices.Clone(h.named)
	for _, a := range attrs {
		named = append(named, a.Key)
	}
	return &Handler{inner: h.inner.WithAttrs(attrs), extract: h.extract, named: named}
}

// WithGroup returns a Handler whose later attributes are in group name.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{inner: h.inner.WithGroup(name), extract: h.extract, named: h.named}
}

// NewJSON returns the logger of a long-running server (`batchgen serve`):
// one JSON object per line with slog's usual keys (time, level, msg).
func NewJSON(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(NewHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})))
}

// NewText returns the logger of the CLI: key=value lines.
func NewText(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(NewHandler(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})))
}

// ParseLevel reads a level name (debug, info, warn or error, any case).
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.TrimSpace(s))); err != nil {
		return 0, fmt.Errorf("log level %q: use debug, info, warn or error", s)
	}
	return l, nil
}

// Discard returns l, or a logger that drops everything when l is nil.
func Discard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
