package sheet

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/unicode"
	"golang.org/x/text/transform"
)

// openCSV settles the text encoding (BOM, else UTF-8, else GB18030) with streaming passes over the file, then wraps
// it in a decoding reader and encoding/csv. head holds the first bytes of the file. The source owns f.
func (r *Reader) openCSV(f *os.File, head []byte, tsv bool) (rowSource, error) {
	var text io.Reader
	switch {
	case bytes.HasPrefix(head, []byte{0xFF, 0xFE}):
		text = transform.NewReader(f, unicode.UTF16(unicode.LittleEndian, unicode.ExpectBOM).NewDecoder())
	case bytes.HasPrefix(head, []byte{0xFE, 0xFF}):
		text = transform.NewReader(f, unicode.UTF16(unicode.BigEndian, unicode.ExpectBOM).NewDecoder())
	case bytes.HasPrefix(head, []byte{0xEF, 0xBB, 0xBF}):
		bad, err := firstInvalidUTF8(f, 3)
		if err != nil {
			return nil, fmt.Errorf("read %q: %w", r.file, err)
		}
		if bad >= 0 {
			b, err := byteAt(f, bad)
			if err != nil {
				return nil, fmt.Errorf("read %q: %w", r.file, err)
			}
			return nil, r.fileErr(fmt.Sprintf("not UTF-8 text (despite its UTF-8 byte-order mark): invalid byte 0x%02X at offset %d", b, bad))
		}
		if _, err := f.Seek(3, io.SeekStart); err != nil {
			return nil, fmt.Errorf("read %q: %w", r.file, err)
		}
		text = f
	default:
		badUTF8, err := firstInvalidUTF8(f, 0)
		if err != nil {
			return nil, fmt.Errorf("read %q: %w", r.file, err)
		}
		if badUTF8 < 0 {
			text = f
			break
		}
		badGB, err := firstInvalidGB18030(f)
		if err != nil {
			return nil, fmt.Errorf("read %q: %w", r.file, err)
		}
		if badGB >= 0 {
			// Report the position that got further: it belongs to the encoding the file most likely is.
			bad := max(badUTF8, badGB)
			b, err := byteAt(f, bad)
			if err != nil {
				return nil, fmt.Errorf("read %q: %w", r.file, err)
			}
			return nil, r.fileErr(fmt.Sprintf("not UTF-8 or GB18030 text: invalid byte 0x%02X at offset %d", b, bad))
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("read %q: %w", r.file, err)
		}
		text = transform.NewReader(f, simplifiedchinese.GB18030.NewDecoder())
	}

	br := bufio.NewReaderSize(transform.NewReader(text, loneCRToLF{}), 64<<10)
	comma := ','
	if tsv || headerLooksTabbed(br) {
		comma = '\t'
	}
	cr := csv.NewReader(br)
	cr.Comma = comma
	cr.FieldsPerRecord = -1
	cr.LazyQuotes = false
	cr.ReuseRecord = true
	return &csvSource{f: f, cr: cr}, nil
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

// headerLooksTabbed peeks at the first non-empty line: tabs and no commas means Excel's "Unicode text" or a TSV
// saved with a .csv name.
func headerLooksTabbed(br *bufio.Reader) bool {
	peek, _ := br.Peek(64 << 10) // a short peek (small file, or a read error that csv will report) is fine
	for len(peek) > 0 {
		line := peek
		if i := bytes.IndexByte(peek, '\n'); i >= 0 {
			line, peek = peek[:i], peek[i+1:]
		} else {
			peek = nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		return bytes.IndexByte(line, '\t') >= 0 && bytes.IndexByte(line, ',') < 0
	}
	return false
}

// csvSource yields CSV records with Excel's row numbers. encoding/csv skips empty lines and lets quoted fields
// span lines, so the row number is rebuilt from the line each record starts on: empty lines skipped since the
// previous record become blank rows, while a multi-line record stays one row.
type csvSource struct {
	f       *os.File
	cr      *csv.Reader
	row     int // Excel row of the last record returned
	lastEnd int // physical line the last record ended on
}

func (s *csvSource) next() (int, []string, error) {
	rec, err := s.cr.Read()
	if errors.Is(err, io.EOF) {
		return 0, nil, io.EOF
	}
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		row := s.row + max(pe.StartLine-s.lastEnd, 1)
		return 0, nil, &InputError{Row: row, Reason: fmt.Sprintf("invalid CSV at line %d: %v", pe.Line, pe.Err)}
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read CSV: %w", err)
	}
	start, _ := s.cr.FieldPos(0)
	lastStart, _ := s.cr.FieldPos(len(rec) - 1)
	s.row += max(start-s.lastEnd, 1)
	s.lastEnd = lastStart + strings.Count(rec[len(rec)-1], "\n")
	return s.row, rec, nil
}

func (s *csvSource) close() error { return s.f.Close() }

// scanChunk is the read size of the encoding passes; they never hold more than one chunk.
const scanChunk = 256 << 10

// firstInvalidUTF8 streams f from offset from and returns the offset of the first byte that is not valid UTF-8,
// or -1 when all of it is valid.
func firstInvalidUTF8(f *os.File, from int64) (int64, error) {
	buf := make([]byte, scanChunk+utf8.UTFMax)
	off := from // file offset of buf[0]
	carry := 0
	for {
		n, err := f.ReadAt(buf[carry:carry+scanChunk], off+int64(carry))
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		end := carry + n
		atEOF := err != nil
		data := buf[:end]
		// Hold back an incomplete rune at the end of the chunk for the next round.
		cut := end
		if !atEOF {
			for i := end - 1; i >= 0 && i >= end-utf8.UTFMax; i-- {
				if utf8.RuneStart(data[i]) {
					if !utf8.FullRune(data[i:end]) {
						cut = i
					}
					break
				}
			}
		}
		if !utf8.Valid(data[:cut]) {
			for i := 0; i < cut; {
				c, size := utf8.DecodeRune(data[i:cut])
				if c == utf8.RuneError && size <= 1 {
					return off + int64(i), nil
				}
				i += size
			}
		}
		if atEOF {
			return -1, nil
		}
		carry = copy(buf, data[cut:end])
		off += int64(cut)
	}
}

// firstInvalidGB18030 streams f and returns the offset of the first byte sequence the GB18030 decoder would turn
// into U+FFFD, or -1 when the whole file decodes cleanly. It follows golang.org/x/text's decoder byte for byte.
func firstInvalidGB18030(f *os.File) (int64, error) {
	buf := make([]byte, scanChunk+4)
	var off int64
	carry := 0
	for {
		n, err := f.ReadAt(buf[carry:carry+scanChunk], off+int64(carry))
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		end := carry + n
		atEOF := err != nil
		i := 0
		for i < end {
			c0 := buf[i]
			if c0 < 0x80 || c0 == 0x80 { // ASCII; 0x80 is the euro sign in code page 936
				i++
				continue
			}
			if c0 == 0xFF {
				return off + int64(i), nil
			}
			if i+1 >= end {
				if atEOF {
					return off + int64(i), nil
				}
				break
			}
			c1 := buf[i+1]
			switch {
			case (0x40 <= c1 && c1 < 0x7F) || (0x80 <= c1 && c1 < 0xFF):
				if !gbTwoByteValid(c0, c1) {
					return off + int64(i), nil
				}
				i += 2
				continue
			case 0x30 <= c1 && c1 < 0x40:
				if i+3 >= end {
					if atEOF {
						return off + int64(i), nil
					}
					break
				}
				c2, c3 := buf[i+2], buf[i+3]
				if c2 < 0x81 || c2 == 0xFF || c3 < 0x30 || c3 >= 0x3A {
					return off + int64(i), nil
				}
				v := ((int(c0-0x81)*10+int(c1-0x30))*126+int(c2-0x81))*10 + int(c3-0x30)
				if v >= 39420 && (v < 189000 || v >= 189000+0x100000) {
					return off + int64(i), nil
				}
				i += 4
				continue
			default:
				return off + int64(i), nil
			}
			break // incomplete four-byte sequence at the end of the chunk
		}
		if atEOF {
			return -1, nil
		}
		carry = copy(buf, buf[i:end])
		off += int64(i)
	}
}

// gbTwoByteValid reports whether a two-byte GBK sequence maps to a character. The table is built once by asking
// the real decoder, so this check cannot drift from the decoding that follows it.
func gbTwoByteValid(c0, c1 byte) bool {
	return gbTwoByteTable()[int(c0-0x81)*256+int(c1)]
}

var gbTwoByteTable = sync.OnceValue(func() []bool {
	t := make([]bool, 126*256)
	dec := simplifiedchinese.GB18030.NewDecoder()
	out := make([]byte, 8)
	for c0 := 0x81; c0 <= 0xFE; c0++ {
		for c1 := 0x40; c1 <= 0xFE; c1++ {
			if c1 == 0x7F {
				continue
			}
			dec.Reset()
			n, _, err := dec.Transform(out, []byte{byte(c0), byte(c1)}, true)
			if err != nil {
				continue
			}
			c, _ := utf8.DecodeRune(out[:n])
			t[(c0-0x81)*256+c1] = c != utf8.RuneError
		}
	}
	return t
})

// byteAt reads the single byte at off, for error messages.
func byteAt(f *os.File, off int64) (byte, error) {
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		return 0, err
	}
	return b[0], nil
}
