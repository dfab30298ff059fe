package llm

import (
	"net/url"
	"strings"

	"github.com/batchgen/batchgen/internal/clip"
)

// MaxMessageRunes bounds a provider's message kept in an Error: a proxy's
// HTML error page does not belong in a result sheet.
const MaxMessageRunes = 500

// CleanMessage makes a provider's message fit for a result sheet: key (an
// API key, when not empty) replaced, spaces trimmed, at most
// MaxMessageRunes runes.
func CleanMessage(msg, key string) string {
	return clip.Runes(strings.TrimSpace(Redact(msg, key)), MaxMessageRunes)
}

// Redact replaces key in s; an empty key leaves s as it is.
func Redact(s, key string) string {
	if key == "" {
		return s
	}
	return strings.ReplaceAll(s, key, "[redacted]")
}

// RedactURL drops a URL's query and user info, where credentials live, for
// messages and logs.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if i := strings.IndexAny(raw, "?@"); i >= 0 {
			return raw[:i] + "…"
		}
		return raw
	}
	u.RawQuery, u.User = "", nil
	return u.String()
}

// HideKey returns err with key replaced in its text (a transport error
// quotes the URL, which may carry a key as a query parameter), keeping the
// chain for errors.Is and errors.As.
func HideKey(err error, key string) error {
	if err == nil || key == "" {
		return err
	}
	return &keyHidden{err: err, key: key}
}

type keyHidden struct {
	err error
	key string
}

func (k *keyHidden) Error() string { return Redact(k.err.Error(), k.key) }
func (k *keyHidden) Unwrap() error { return k.err }
