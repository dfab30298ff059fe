package mockserver

import (
	"net/http"
	"strconv"
	"time"
)

// dialect is a wire protocol the mock speaks: OpenAI's chat completions or
// Anthropic's Messages. The quota, the faults, the answers and the counts
// are the server's; a dialect reads a request into the server's terms and
// words the answer in its own. The server's terms are OpenAI's: errors are
// apiErrors with OpenAI's types and codes, finish reasons are "stop",
// "length" and "content_filter".
type dialect interface {
	// authorized reports whether r carries the API key.
	authorized(r *http.Request, key string) bool
	// parse reads and validates a request body; on failure it returns the
	// error to answer with and its status.
	parse(s *Server, body []byte) (chatRequest, *apiError, int)
	// writeError answers with e, given in the server's terms.
	writeError(w http.ResponseWriter, status int, e apiError)
	// limitHeaders states the quotas in force on every answer.
	limitHeaders(h http.Header, now time.Time, limits []limitWindow)
	// retryHeaders say how long a rate-limited client should wait;
	// precise asks for the dialect's finer hints beside Retry-After.
	retryHeaders(h http.Header, wait time.Duration, precise bool)
	// answer writes a successful call's answer.
	answer(w http.ResponseWriter, id int64, now time.Time, req chatRequest, text, finish string)
}

// openAI is the chat completions dialect: a bearer token, OpenAI's error
// object and x-ratelimit-* headers.
type openAI struct{}

func (openAI) authorized(r *http.Request, key string) bool {
	return r.Header.Get("Authorization") == "Bearer "+key
}

func (openAI) writeError(w http.ResponseWriter, status int, e apiError) { writeError(w, status, e) }

// limitHeaders sets x-ratelimit-{limit,remaining,reset}-{requests,tokens},
// reset as a Go-style duration ("6.5s"), as OpenAI sends it.
func (openAI) limitHeaders(h http.Header, _ time.Time, limits []limitWindow) {
	for _, l := range limits {
		h.Set("X-Ratelimit-Limit-"+l.kind, strconv.Itoa(l.limit))
		h.Set("X-Ratelimit-Remaining-"+l.kind, strconv.Itoa(l.remaining))
		h.Set("X-Ratelimit-Reset-"+l.kind, l.reset.String())
	}
}

// retryHeaders sets Retry-After in whole seconds and, precisely,
// retry-after-ms.
func (openAI) retryHeaders(h http.Header, wait time.Duration, precise bool) {
	h.Set("Retry-After", strconv.Itoa(retrySeconds(wait)))
	if precise {
		h.Set("Retry-After-Ms", strconv.FormatInt(max(wait.Milliseconds(), 1), 10))
	}
}

func (openAI) answer(w http.ResponseWriter, id int64, now time.Time, req chatRequest, text, finish string) {
	writeJSON(w, http.StatusOK, newCompletion(id, now, req, text, finish))
}

// retrySeconds is wait rounded up to a whole second, at least 1.
func retrySeconds(wait time.Duration) int {
	return max(int((wait+time.Second-1)/time.Second), 1)
}
