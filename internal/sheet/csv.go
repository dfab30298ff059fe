package sheet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/encoding"
	"golang.org/x/text/transform"
)

// openCSV settles the text encoding (a byte-order mark, else opts.Encoding, else detection by plausibility: see
// detectEncoding), wraps the file in a decoding reader, settles the dialect (a leading "sep=" line, else the
// delimiter sniffed from the first lines) and returns a source of records. head holds the first bytes of the file.
// The source owns f.
func (r *Reader) openCSV(f *os.File, head []byte, tsv bool, forced string) (rowSource, error) {
	name, enc, skip, err := r.csvEncoding(f, head, forced)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(skip, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read %q: %w", r.file, err)
	}
	r.encoding = name
	var text io.Reader = f
	if enc != nil {
		text = transform.NewReader(f, enc.NewDecoder())
	}
	br := bufio.NewReaderSize(transform.NewReader(text, loneCRToLF{}), 64<<10)
	lx := &csvLexer{br: br}
	comma, sepLine, err := sniffDialect(br, tsv)
	if err != nil {
		return nil, r.fileErr(err.Error())
	}
	lx.comma = comma
	r.delimiter = string(comma)
	if sepLine {
		lx.line = 1
	}
	// A forced legacy encoding is not checked up front: bytes it cannot decode arrive as U+FFFD, caught per cell.
	checkFFFD := forced != "" && name != EncodingUTF8 && !strings.HasPrefix(name, "utf-16")
	return &csvSource{f: f, lx: lx, encoding: name, checkFFFD: checkFFFD}, nil
}

// csvEncoding returns the encoding's name, its decoder (nil for UTF-8, which needs none) and how many bytes of
// byte-order mark to skip.
func (r *Reader) csvEncoding(f *os.File, head []byte, forced string) (string, encoding.Encoding, int64, error) {
	var bom string
	var bomLen int64
	switch {
	case bytes.HasPrefix(head, []byte{0xEF, 0xBB, 0xBF}):
		bom, bomLen = EncodingUTF8, 3
	case bytes.HasPrefix(head, []byte{0xFF, 0xFE}):
		bom = EncodingUTF16LE
	case bytes.HasPrefix(head, []byte{0xFE, 0xFF}):
		bom = EncodingUTF16BE
	}
	if forced != "" {
		name, enc, err := lookupEncoding(forced)
		if err != nil {
			return "", nil, 0, r.fileErr(err.Error())
		}
		switch {
		case name == EncodingUTF8:
			enc = nil
			if bom != EncodingUTF8 {
				bomLen = 0
			}
			if err := r.checkUTF8(f, bomLen, "asked for"); err != nil {
				return "", nil, 0, err
			}
			return name, nil, bomLen, nil
		case name == bom: // UTF-16 with its own mark: the decoder drops the mark
			return name, utf16Decoder(name == EncodingUTF16BE), 0, nil
		}
		return name, enc, 0, nil
	}
	switch bom {
	case EncodingUTF16LE, EncodingUTF16BE:
		return bom, utf16Decoder(bom == EncodingUTF16BE), 0, nil
	case EncodingUTF8:
		if err := r.checkUTF8(f, 3, "despite its UTF-8 byte-order mark"); err != nil {
			return "", nil, 0, err
		}
		return EncodingUTF8, nil, 3, nil
	}
	name, enc, err := r.detectEncoding(f)
	return name, enc, 0, err
}

// checkUTF8 rejects a file that must be UTF-8 (a byte-order mark says so, or the caller asked for it) but is not.
func (r *Reader) checkUTF8(f *os.File, from int64, why string) error {
	bad, err := firstInvalidUTF8(f, from)
	if err != nil {
		return fmt.Errorf("read %q: %w", r.file, err)
	}
	if bad < 0 {
		return nil
	}
	b, err := byteAt(f, bad)
	if err != nil {
		return fmt.Errorf("read %q: %w", r.file, err)
	}
	return r.fileErr(fmt.Sprintf("not UTF-8 text (%s): invalid byte 0x%02X at offset %d", why, b, bad))
}

// loneCRToLF turns a carriage return that is not followed by a line feed into a line feed. encoding/csv ends
// records only at LF (dropping the CR of a CRLF), so a file with classic Mac line endings (CR alone, still written
// by "CSV (Macintosh)" exports) read as a single row with the following lines glued into its cells. Excel ends a
// row at a lone CR too, so this reads such files the way Excel shows them; inside a quoted field the CR becomes the
// same in-cell line break as LF. CRLF passes through untouched. It works on the decoded UTF-8 text, where a 0x0D
// byte is always a CR.
type loneCRToLF struct{ transform.NopResetter }

// Transform implements transform.Transformer.
func (loneCRToLF) Transform(dst, src []byte, atEOF bool) (nDst, nSrc int, err error) {
	for nSrc < len(src) {
		i := bytes.IndexByte(src[nSrc:], '\r')
		if i < 0 {
			i = len(src) - nSrc
		}
		n := copy(dst[nDst:], src[nSrc:nSrc+i])
		nDst += n
		nSrc += n
		if n < i {
			return nDst, nSrc, transform.ErrShortDst
		}
		if nSrc == len(src) {
			break
		}
		if nDst == len(dst) {
			return nDst, nSrc, transform.ErrShortDst
		}
		if nSrc+1 == len(src) && !atEOF {
			return nDst, nSrc, transform.ErrShortSrc // is the CR the first half of a CRLF?
		}
		c := byte('\n')
		if nSrc+1 < len(src) && src[nSrc+1] == '\n' {
			c = '\r'
		}
		dst[nDst] = c
		nDst++
		nSrc++
	}
	return nDst, nSrc, nil
}

// sniffPeek is how much decoded text the dialect sniffer looks at.
const sniffPeek = 64 << 10

// delimiters are the field separators the sniffer considers, in order of preference on a tie: a tab is almost
// never inside text, a semicolon rarely, a comma often ("Dupont, Jean").
var delimiters = []byte{'\t', ';', ','}

// sniffDialect settles the field delimiter. A first line "sep=X" (Excel's own convention, written by many
// exporters) names it and is consumed, so it is neither the header nor a row, as in Excel. Otherwise the first
// records are parsed with each candidate delimiter, quotes respected: the one that splits the header into the
// most consistent number of fields over the following records wins; a file no delimiter splits is one column.
func sniffDialect(br *bufio.Reader, tsv bool) (comma byte, sepLine bool, err error) {
	peek, _ := br.Peek(sniffPeek) // a short peek (small file, or a read error the lexer will report) is fine
	if len(peek) >= 4 && strings.EqualFold(string(peek[:4]), "sep=") {
		line, consumed := peek, len(peek)
		if i := bytes.IndexByte(peek, '\n'); i >= 0 {
			line, consumed = peek[:i], i+1
		}
		sep := bytes.TrimSuffix(line[4:], []byte{'\r'})
		r, size := utf8.DecodeRune(sep)
		switch {
		case len(sep) == 1 && r != '"' && r != ' ':
			if _, err := br.Discard(consumed); err != nil {
				return 0, false, err
			}
			return byte(r), true, nil
		case len(sep) > 0 && size == len(sep):
			return 0, false, fmt.Errorf("line 1 (%q) names a delimiter batchgen does not support; use one ASCII character such as sep=; or sep=,", string(line))
		}
		// "sep=" with nothing usable after it is ordinary text.
	}
	if tsv {
		return '\t', false, nil
	}
	atEOF := len(peek) < sniffPeek
	best, bestScore, bestFields := byte(','), -1.0, 1
	for _, d := range delimiters {
		score, fields := delimiterScore(peek, d, atEOF)
		if fields < 2 {
			continue
		}
		if score > bestScore || (score == bestScore && fields > bestFields) {
			best, bestScore, bestFields = d, score, fields
		}
	}
	return best, false, nil
}

// sniffRecords bounds how many records the sniffer parses.
const sniffRecords = 50

// delimiterScore parses the sample with delimiter d and returns the header's field count and the share of the
// following non-blank records with that many fields (1 when there are none). An incomplete last record (the
// sample was cut) and everything after a quoting error are left out.
func delimiterScore(sample []byte, d byte, atEOF bool) (float64, int) {
	lx := &csvLexer{br: bufio.NewReaderSize(bytes.NewReader(sample), 4096), comma: d}
	header, same, data := 0, 0, 0
	var counts []int
	for len(counts) <= sniffRecords {
		_, rec, err := lx.read()
		if err != nil {
			break
		}
		if IsBlank(rec) {
			continue
		}
		n := len(rec)
		for n > 1 && rec[n-1] == "" {
			n-- // "a;b;;" and "1;2;;": trailing empty cells do not count
		}
		counts = append(counts, n)
	}
	if !atEOF && len(counts) > 1 {
		counts = counts[:len(counts)-1]
	}
	if len(counts) == 0 {
		return 0, 0
	}
	header = counts[0]
	for _, n := range counts[1:] {
		data++
		if n == header {
			same++
		}
	}
	if data == 0 {
		return 1, header
	}
	return float64(same) / float64(data), header
}

// csvLexer splits decoded text (LF line ends, see loneCRToLF; a CR before an LF is dropped) into records the way
// Excel opens a CSV file:
//   - a field that starts with a quote is quoted: it runs to the next lone quote, "" inside it is one quote, and
//     delimiters and line breaks inside it are text;
//   - a quote anywhere else is text: TV 40" screen reads as written (encoding/csv rejects it; its LazyQuotes mode
//     accepts it but also lets an unclosed quote swallow the rest of the file without a word, so it cannot be
//     used);
//   - every line is a row, an empty line a blank row, a multi-line quoted field one row.
//
// Two things Excel would show are rejected instead, because they mean the file is damaged and reading on would
// change the data silently: text after the closing quote of a quoted field ("x"y: Excel shows xy, dropping the
// quotes the writer probably meant to double), and a quoted field never closed (Excel puts the rest of the file
// into that one cell).
type csvLexer struct {
	br    *bufio.Reader
	comma byte
	line  int // physical lines consumed so far
	row   int // records returned so far: Excel's row number of the last one

	pending []byte // a line longer than the bufio buffer, being assembled
	buf     []byte // the current record's field bytes
	ends    []int  // end offset of each field in buf
	rec     []string
}

// csvError is a malformed record: where it is, and what is wrong.
type csvError struct {
	line, field int
	reason      string
}

func (e *csvError) Error() string {
	return fmt.Sprintf("line %d field %d: %s", e.line, e.field+1, e.reason)
}

// readLine returns the next physical line with its line feed (none at the end of the file), CRLF folded to LF, or
// io.EOF. The slice is valid until the next call.
func (l *csvLexer) readLine() ([]byte, error) {
	line, err := l.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		l.pending = append(l.pending[:0], line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			line, err = l.br.ReadSlice('\n')
			l.pending = append(l.pending, line...)
		}
		line = l.pending
	}
	if len(line) > 0 && errors.Is(err, io.EOF) {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	l.line++
	if n := len(line); n >= 2 && line[n-2] == '\r' && line[n-1] == '\n' {
		line[n-2] = '\n'
		line = line[:n-1]
	}
	return line, nil
}

// read returns the next record and its row, io.EOF after the last, a *csvError for a malformed record, or a read
// error. The record is reused by the next call.
func (l *csvLexer) read() (int, []string, error) {
	line, err := l.readLine()
	if err != nil {
		return 0, nil, err
	}
	l.row++
	l.buf, l.ends = l.buf[:0], l.ends[:0]
	pos := 0
	for field := 0; ; field++ {
		if pos < len(line) && line[pos] == '"' {
			startLine := l.line
			pos++
			for {
				i := bytes.IndexByte(line[pos:], '"')
				if i < 0 {
					// The field goes on past the end of this line.
					l.buf = append(l.buf, line[pos:]...)
					if line, err = l.readLine(); err != nil {
						if errors.Is(err, io.EOF) {
							return 0, nil, &csvError{line: startLine, field: field,
								reason: "the quoted field that starts here is never closed (a quote is missing; Excel would put the rest of the file into this cell)"}
						}
						return 0, nil, err
					}
					pos = 0
					continue
				}
				l.buf = append(l.buf, line[pos:pos+i]...)
				pos += i + 1
				if pos < len(line) && line[pos] == '"' {
					l.buf = append(l.buf, '"')
					pos++
					continue
				}
				// The closing quote: spaces may follow it (Excel keeps them), then the field must end.
				j := pos
				for j < len(line) && (line[j] == ' ' || line[j] == '\t') && line[j] != l.comma {
					j++
				}
				if j < len(line) && line[j] != l.comma && line[j] != '\n' {
					return 0, nil, &csvError{line: l.line, field: field,
						reason: fmt.Sprintf("text follows the closing quote of a quoted field (%s); to put a quote inside a quoted field, double it (\"\")", excerpt(line, j))}
				}
				l.buf = append(l.buf, line[pos:j]...)
				pos = j
				break
			}
		} else {
			i := bytes.IndexByte(line[pos:], l.comma)
			if i < 0 {
				i = len(line) - pos
				if i > 0 && line[len(line)-1] == '\n' {
					i--
				}
			}
			l.buf = append(l.buf, line[pos:pos+i]...)
			pos += i
		}
		l.ends = append(l.ends, len(l.buf))
		if pos < len(line) && line[pos] == l.comma {
			pos++
			continue
		}
		break
	}
	// One string for the whole record, sliced per field, as encoding/csv does.
	s := string(l.buf)
	l.rec = l.rec[:0]
	prev := 0
	for _, e := range l.ends {
		l.rec = append(l.rec, s[prev:e])
		prev = e
	}
	return l.row, l.rec, nil
}

// excerpt quotes up to 20 bytes of line from i (whole UTF-8 characters), for messages.
func excerpt(line []byte, i int) string {
	rest := bytes.TrimSuffix(line[i:], []byte{'\n'})
	if len(rest) > 20 {
		cut := 20
		for cut > 0 && !utf8.RuneStart(rest[cut]) {
			cut--
		}
		return strconv.Quote(string(rest[:cut])+"…") + " after the quote"
	}
	return strconv.Quote(string(rest)) + " after the quote"
}

// csvSource yields CSV records with Excel's row numbers.
type csvSource struct {
	f         *os.File
	lx        *csvLexer
	encoding  string
	checkFFFD bool // the encoding was forced: undecodable bytes arrive as U+FFFD and must be rejected
}

func (s *csvSource) next() (int, []string, error) {
	row, rec, err := s.lx.read()
	if errors.Is(err, io.EOF) {
		return 0, nil, io.EOF
	}
	var ce *csvError
	if errors.As(err, &ce) {
		return 0, nil, &InputError{Row: s.lx.row, Column: ColumnName(ce.field + 1),
			Reason: fmt.Sprintf("invalid CSV at line %d: %s", ce.line, ce.reason)}
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read CSV: %w", err)
	}
	if s.checkFFFD {
		for i, c := range rec {
			if strings.ContainsRune(c, utf8.RuneError) {
				return 0, nil, &InputError{Row: row, Column: ColumnName(i + 1),
					Reason: fmt.Sprintf("cell has bytes that are not %s text (the encoding asked for); check the encoding", s.encoding)}
			}
		}
	}
	return row, rec, nil
}

func (s *csvSource) close() error { return s.f.Close() }

// scanChunk is the read size of the encoding passes; they never hold more than one chunk.
const scanChunk = 256 << 10

// byteAt reads the single byte at off, for error messages.
func byteAt(f *os.File, off int64) (byte, error) {
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		return 0, err
	}
	return b[0], nil
}
