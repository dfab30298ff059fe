package sheet

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/batchgen/batchgen/internal/clip"
)

// ErrUnsupportedFormat is the cause (errors.Is) of an InputError for content
// that is not a spreadsheet read here, judged from its bytes, whatever its
// name says: an HTTP API answers it with 415.
var ErrUnsupportedFormat = errors.New("unsupported file format")

// ErrFileTooLarge is the cause (errors.Is) of an InputError for a file over
// Limits.MaxFileBytes: an HTTP API answers it with 413.
var ErrFileTooLarge = errors.New("file too large")

// InputError is a rejected input: the file itself is wrong (format, encoding, limits, header, a cell), so retrying
// cannot help and the message is meant for the person who uploaded it. Its message names the file, and where
// relevant the sheet, the row (1-based sheet row), the column (letter and header text) and the limit broken, e.g.
//
//	skus.xlsx: sheet "商品" row 5 column C ("价格"): cell has 40000 characters; Excel's limit is 32767
type InputError struct {
	// File is the display name of the input (Options.DisplayName).
	File string
	// Sheet is the worksheet name; empty for CSV/TSV and for problems with the file as a whole.
	Sheet string
	// Row is the 1-based row number in the sheet or CSV file as Excel would show it; 0 when no row is involved.
	Row int
	// Column is the column letter ("C"); empty when no single column is involved.
	Column string
	// Header is the header text of Column, when the column has one.
	Header string
	// Reason says what is wrong and, for limits, what the limit is.
	Reason string

	// cause is a typed detail callers may inspect with errors.As (e.g. *AmbiguousEncodingError); nil for most.
	cause error
	// whole marks a problem with the file as a whole found while reading rows (damage the XML check found
	// beside the reader): it names no sheet or row, as when Open finds it.
	whole bool
}

// Unwrap returns the typed detail of the rejection, if any.
func (e *InputError) Unwrap() error { return e.cause }

// Error renders the location parts that are set, then the reason. A header is quoted up to 50 characters.
func (e *InputError) Error() string {
	var loc []string
	if e.Sheet != "" {
		loc = append(loc, "sheet "+strconv.Quote(e.Sheet))
	}
	if e.Row > 0 {
		loc = append(loc, "row "+strconv.Itoa(e.Row))
	}
	if e.Column != "" {
		col := "column " + e.Column
		if e.Header != "" {
			col += " (" + strconv.Quote(shorten(e.Header)) + ")"
		}
		loc = append(loc, col)
	}
	var b strings.Builder
	b.WriteString(e.File)
	b.WriteString(": ")
	if len(loc) > 0 {
		b.WriteString(strings.Join(loc, " "))
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// maxQuotedChars bounds how much of a header a message quotes: headers may be thousands of characters long, and a
// message is read by a person (and stored with the task).
const maxQuotedChars = 50

// shorten cuts s to maxQuotedChars characters, marking the cut with "…".
func shorten(s string) string { return clip.Runes(s, maxQuotedChars) }

// ColumnName returns the spreadsheet column letters for a 1-based column number (1 -> "A", 27 -> "AA"). It also
// works past Excel's last column (XFD) so that messages about over-wide CSV rows can still name the column; n < 1
// gives "".
func ColumnName(n int) string {
	var buf [16]byte
	i := len(buf)
	for n > 0 && i > 0 {
		n--
		i--
		buf[i] = byte('A' + n%26)
		n /= 26
	}
	return string(buf[i:])
}

// columnIndex is the inverse of ColumnName: the 0-based index of a column's letters, or -1 for "" or anything
// that is not column letters.
func columnIndex(name string) int {
	if name == "" || len(name) > 7 {
		return -1
	}
	n := 0
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 'A' || c > 'Z' {
			return -1
		}
		n = n*26 + int(c-'A') + 1
	}
	return n - 1
}

// formatBytes renders a byte count the way people read file sizes: "512 bytes", "64 KiB", "1.5 MiB".
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + string("KMGTPE"[exp]) + "iB"
}
