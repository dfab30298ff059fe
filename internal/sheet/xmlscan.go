package sheet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// xmlScanner splits an XML part into character data and markup (tags, comments, CDATA sections, processing
// instructions) without decoding it, so a part can be copied byte for byte while a few elements are rewritten.
// encoding/xml cannot do that: it re-encodes what it reads, renaming namespace prefixes on the way out.
type xmlScanner struct {
	r   *bufio.Reader
	tag []byte // the markup last returned, '<' to '>'
	off int64  // bytes consumed, for messages
}

func newXMLScanner(r io.Reader) *xmlScanner {
	return &xmlScanner{r: bufio.NewReaderSize(r, 64<<10)}
}

// next copies the character data before the next markup to text (nil discards it) and returns that markup, valid
// until the next call. It returns io.EOF after the last markup (the part's trailing white space is copied).
func (s *xmlScanner) next(text io.Writer) ([]byte, error) {
	for {
		chunk, err := s.r.ReadSlice('<')
		n := len(chunk)
		if err == nil {
			n-- // the '<' starts the markup
		}
		s.off += int64(len(chunk))
		if text != nil && n > 0 {
			if _, werr := text.Write(chunk[:n]); werr != nil {
				return nil, werr
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err // io.EOF: no more markup
		}
		break
	}
	s.tag = append(s.tag[:0], '<')
	end := []byte(">")
	quoted := true // only a plain tag's '>' can sit inside a quoted attribute value
	if head, err := s.r.Peek(8); err == nil || len(head) > 0 {
		switch {
		case bytes.HasPrefix(head, []byte("!--")):
			end, quoted = []byte("-->"), false
		case bytes.HasPrefix(head, []byte("![CDATA[")):
			end, quoted = []byte("]]>"), false
		case bytes.HasPrefix(head, []byte("?")):
			end, quoted = []byte("?>"), false
		case bytes.HasPrefix(head, []byte("!")):
			quoted = false // <!DOCTYPE ...>, which no workbook part has
		}
	}
	// Read up to each '>' at once; the markup ends at the first one outside a quoted value that completes end.
	var quote byte
	for {
		chunk, err := s.r.ReadSlice('>')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("markup at byte %d is not closed", s.off)
			}
			return nil, err
		}
		from := len(s.tag)
		s.tag = append(s.tag, chunk...)
		s.off += int64(len(chunk))
		if quoted {
			for _, c := range s.tag[from:] {
				switch {
				case quote != 0:
					if c == quote {
						quote = 0
					}
				case c == '"' || c == '\'':
					quote = c
				}
			}
		}
		if err == nil && quote == 0 && bytes.HasSuffix(s.tag, end) && len(s.tag) > len(end) {
			return s.tag, nil
		}
	}
}

// markup describes a tag returned by xmlScanner.next.
type markup struct {
	raw    []byte
	local  string // element name without its prefix; "" for comments and the like
	prefix string // the namespace prefix with its colon ("x:"), or ""
	end    bool   // </name>
	empty  bool   // <name/>
}

func parseMarkup(raw []byte) markup {
	m := markup{raw: raw}
	if len(raw) < 3 || raw[1] == '!' || raw[1] == '?' {
		return m
	}
	i := 1
	if raw[1] == '/' {
		m.end, i = true, 2
	}
	j := i
	for j < len(raw) && !isXMLSpace(raw[j]) && raw[j] != '/' && raw[j] != '>' {
		j++
	}
	name := raw[i:j]
	if k := bytes.IndexByte(name, ':'); k >= 0 {
		m.prefix, name = string(name[:k+1]), name[k+1:]
	}
	m.local = string(name)
	m.empty = !m.end && bytes.HasSuffix(raw, []byte("/>"))
	return m
}

// is reports whether m opens (or self-closes) the element local.
func (m markup) is(local string) bool { return !m.end && m.local == local }

// closes reports whether m is the end tag of local.
func (m markup) closes(local string) bool { return m.end && m.local == local }

// attr returns the raw (still escaped) value of the attribute named name (as written, prefix included), and whether
// it is there. It allocates only the value it returns: it runs for every row and cell of a sheet.
func (m markup) attr(name string) (string, bool) {
	var value string
	found := false
	m.eachAttr(func(n, v []byte, _ byte) bool {
		if string(n) == name { // no allocation: the compiler compares in place
			value, found = string(v), true
			return false
		}
		return true
	})
	return value, found
}

type xmlAttr struct {
	name  string // as written, prefix included
	value string // raw, between the quotes
	quote byte
}

// attrs lists the tag's attributes in order.
func (m markup) attrs() []xmlAttr {
	var out []xmlAttr
	m.eachAttr(func(n, v []byte, q byte) bool {
		out = append(out, xmlAttr{name: string(n), value: string(v), quote: q})
		return true
	})
	return out
}

// eachAttr calls f with each attribute's name, raw value and quote, in order, until f returns false.
func (m markup) eachAttr(f func(name, value []byte, quote byte) bool) {
	raw := m.raw
	i := 1
	for i < len(raw) && !isXMLSpace(raw[i]) && raw[i] != '/' && raw[i] != '>' {
		i++
	}
	for {
		for i < len(raw) && isXMLSpace(raw[i]) {
			i++
		}
		if i >= len(raw) || raw[i] == '/' || raw[i] == '>' {
			return
		}
		j := i
		for j < len(raw) && raw[j] != '=' && !isXMLSpace(raw[j]) {
			j++
		}
		name := raw[i:j]
		for j < len(raw) && (raw[j] == '=' || isXMLSpace(raw[j])) {
			j++
		}
		if j >= len(raw) || (raw[j] != '"' && raw[j] != '\'') {
			return // not well-formed; the reader would have refused the part
		}
		q := raw[j]
		k := bytes.IndexByte(raw[j+1:], q)
		if k < 0 {
			return
		}
		if !f(name, raw[j+1:j+1+k], q) {
			return
		}
		i = j + 1 + k + 1
	}
}

// localName strips an attribute's prefix.
func localName(name string) string {
	if k := bytes.IndexByte([]byte(name), ':'); k >= 0 {
		return name[k+1:]
	}
	return name
}

// rebuild writes the tag again with attributes changed: set replaces (or adds, in order) attributes by local name,
// and drop removes the attributes of those local names. Everything else keeps its spelling and order.
func (m markup) rebuild(set [][2]string, drop ...string) []byte {
	var b bytes.Buffer
	b.WriteByte('<')
	b.WriteString(m.prefix)
	b.WriteString(m.local)
	done := make([]bool, len(set))
next:
	for _, a := range m.attrs() {
		ln := localName(a.name)
		for _, d := range drop {
			if ln == d {
				continue next
			}
		}
		v := a.value
		for i, s := range set {
			if s[0] == ln && !done[i] {
				v, done[i] = s[1], true
			}
		}
		fmt.Fprintf(&b, " %s=%c%s%c", a.name, a.quote, v, a.quote)
	}
	for i, s := range set {
		if !done[i] {
			fmt.Fprintf(&b, ` %s="%s"`, s[0], s[1])
		}
	}
	if m.empty {
		b.WriteString("/>")
	} else {
		b.WriteByte('>')
	}
	return b.Bytes()
}

func isXMLSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// cellColumn returns the 1-based column of a cell reference such as "AB12" ("$AB$12" too), or 0. It runs for
// every cell of a rewritten sheet, so it reads the letters in place.
func cellColumn(ref string) int {
	n, letters := 0, 0
	for i := 0; i < len(ref); i++ {
		c := ref[i]
		switch {
		case c == '$':
			continue
		case 'A' <= c && c <= 'Z':
			n = n*26 + int(c-'A') + 1
		case 'a' <= c && c <= 'z':
			n = n*26 + int(c-'a') + 1
		default:
			return n
		}
		if letters++; letters > 7 { // not a column: as columnIndex says of longer names
			return 0
		}
	}
	return n
}

// cellRow returns the row of a cell reference such as "AB12", or 0.
func cellRow(ref string) int {
	n := 0
	for i := 0; i < len(ref); i++ {
		c := ref[i]
		switch {
		case '0' <= c && c <= '9':
			n = n*10 + int(c-'0')
			if n > 1<<21 {
				return 0
			}
		case n > 0:
			return 0
		}
	}
	return n
}
