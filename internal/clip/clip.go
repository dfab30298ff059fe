// Package clip shortens text for messages: a value quoted in an error, a
// provider's message kept in a result sheet, a line of a status report.
// Every place that quotes something unbounded cuts it the same way, by
// characters (runes), never inside a UTF-8 sequence.
package clip

// Runes returns s when it has at most n runes, and otherwise its first n
// runes followed by "…", so that a reader sees it was cut. Invalid UTF-8
// counts one rune a byte and is kept as it is.
func Runes(s string, n int) string {
	count := 0
	for i := range s {
		if count == n {
			return s[:i] + "…"
		}
		count++
	}
	return s
}
