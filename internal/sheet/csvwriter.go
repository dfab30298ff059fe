package sheet

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// CSVWriter streams a CSV result: the input's own fields as they were read, then the cells a result adds.
//
// The file is UTF-8 with a byte-order mark: without one Excel reads a CSV in the machine's legacy code page, and
// 价格 or é come out garbled. Records end in CRLF (RFC 4180, and what Excel writes); a field is quoted only when it
// holds the delimiter, a quote or a line break, as Excel does, and a line break inside a field is kept as it is
// (encoding/csv's Writer, in CRLF mode, rewrites every LF in a field as CRLF, which would change the input's
// fields, so the few lines of quoting are written here).
//
// An added text cell is never a formula, as in a workbook (see Text): Excel opens a CSV field that starts with =,
// +, -, @, a tab or a carriage return as a formula, so such text is written with a leading apostrophe, the
// convention for "this is text" (OWASP's advice against CSV injection). The input's fields are never changed: they
// are the user's, and were a formula in their file already. A CSVWriter is not safe for concurrent use.
type CSVWriter struct {
	bw    *bufio.Writer
	comma string
	// special are the characters that make a field quoted.
	special string
}

// NewCSVWriter starts a CSV result on w with the given one-character delimiter ("" is a comma).
func NewCSVWriter(w io.Writer, delimiter string) (*CSVWriter, error) {
	if delimiter == "" {
		delimiter = ","
	}
	if r, n := utf8.DecodeRuneInString(delimiter); n != len(delimiter) || r == '"' || r == '\r' || r == '\n' || r == utf8.RuneError {
		return nil, fmt.Errorf("new CSV result: delimiter %q is not one character a CSV file can use", delimiter)
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	if _, err := bw.WriteString("\uFEFF"); err != nil {
		return nil, fmt.Errorf("new CSV result: %w", err)
	}
	return &CSVWriter{bw: bw, comma: delimiter, special: delimiter + "\"\r\n"}, nil
}

// WriteRow writes one record: the input fields as given, then the added cells (see CSVWriter for how text that
// looks like a formula is written).
func (c *CSVWriter) WriteRow(input []string, added []Value) error {
	for i, f := range input {
		c.field(i, f)
	}
	for i, v := range added {
		s := v.String()
		if v.kind == textValue && strings.ContainsAny(s[:1], "=+-@\t\r") {
			s = "'" + s
		}
		c.field(len(input)+i, s)
	}
	if _, err := c.bw.WriteString("\r\n"); err != nil {
		return fmt.Errorf("write CSV record: %w", err)
	}
	return nil
}

// field writes the i-th field of a record, quoted when it must be. Errors stay in the bufio.Writer, which returns
// them from every later call and from Flush.
func (c *CSVWriter) field(i int, s string) {
	if i > 0 {
		c.bw.WriteString(c.comma)
	}
	if !strings.ContainsAny(s, c.special) {
		c.bw.WriteString(s)
		return
	}
	c.bw.WriteByte('"')
	c.bw.WriteString(strings.ReplaceAll(s, `"`, `""`))
	c.bw.WriteByte('"')
}

// Flush writes out what is buffered; call it after the last row.
func (c *CSVWriter) Flush() error {
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("write CSV result: %w", err)
	}
	return nil
}
