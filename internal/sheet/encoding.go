package sheet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/htmlindex"
	"golang.org/x/text/encoding/japanese"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/traditionalchinese"
	xunicode "golang.org/x/text/encoding/unicode"
)

// Encoding names, as the WHATWG Encoding Standard (golang.org/x/text/encoding/htmlindex) spells them. They are what
// Reader.Encoding reports and what Options.Encoding accepts, besides the aliases htmlindex knows (latin1, gbk,
// sjis, cp1252, ...).
const (
	EncodingUTF8        = "utf-8"
	EncodingUTF16LE     = "utf-16le"
	EncodingUTF16BE     = "utf-16be"
	EncodingGB18030     = "gb18030"
	EncodingBig5        = "big5"
	EncodingShiftJIS    = "shift_jis"
	EncodingWindows1252 = "windows-1252"
)

// detectedEncodings lists, for messages, what the detector weighs when a file has no byte-order mark.
const detectedEncodings = "UTF-8, GB18030, Big5, Shift_JIS, Windows-1252"

// extraAliases are Windows code page names that htmlindex does not know.
var extraAliases = map[string]string{
	"cp932": EncodingShiftJIS, "ms932": EncodingShiftJIS, "windows-31j": EncodingShiftJIS,
	"cp936": "gbk", "ms936": "gbk", "cp950": EncodingBig5, "ms950": EncodingBig5,
	"utf-16": EncodingUTF16LE,
}

// lookupEncoding resolves a user-given encoding name (any case, WHATWG labels and the common Windows code page
// names) to its canonical name and decoder.
func lookupEncoding(name string) (string, encoding.Encoding, error) {
	label := strings.ToLower(strings.TrimSpace(name))
	if alias, ok := extraAliases[label]; ok {
		label = alias
	}
	enc, err := htmlindex.Get(label)
	if err == nil {
		var canon string
		if canon, err = htmlindex.Name(enc); err == nil && canon != "replacement" && canon != "x-user-defined" {
			return canon, enc, nil
		}
	}
	return "", nil, fmt.Errorf("unknown encoding %q; use one of utf-8, utf-16le, utf-16be, gb18030, gbk, big5, shift_jis, windows-1252 (iso-8859-1), or another WHATWG encoding name", name)
}

// tier is how plausible one decoded character is in text of its candidate encoding's language.
type tier uint8

const (
	tierInvalid tier = iota // the bytes do not decode
	tierPoor                // decodes, but to a character real text in that language almost never has here
	tierFair                // a less common character
	tierGood                // a common character
)

// weight is a tier's contribution to a plausibility score.
func (t tier) weight() float64 {
	switch t {
	case tierGood:
		return 1
	case tierFair:
		return 0.5
	}
	return 0
}

// char describes one non-ASCII character of a candidate decoding.
type char struct {
	size         int // bytes
	tier         tier
	upper, lower bool // a cased letter (single-byte candidates only)
	r            rune // the decoded rune (single-byte candidates only)
}

// candidate is a legacy (non-Unicode) encoding the detector weighs.
type candidate struct {
	name string
	enc  encoding.Encoding
	// next describes the non-ASCII character at the start of b (b[0] >= 0x80). need reports that b ends inside
	// the character and more input is needed to tell.
	next func(b []byte, atEOF bool) (c char, need bool)
	// latin marks a single-byte encoding: its runs of non-ASCII characters are judged as accented Latin text.
	latin bool
}

// candidates are weighed in this order; on an exact tie of scores, the earlier one is reported first.
var candidates = sync.OnceValue(func() []*candidate {
	return []*candidate{
		{name: EncodingWindows1252, enc: charmap.Windows1252, next: windows1252Next, latin: true},
		{name: EncodingGB18030, enc: simplifiedchinese.GB18030, next: gb18030Next},
		{name: EncodingBig5, enc: traditionalchinese.Big5, next: dbcsNext(big5Table())},
		{name: EncodingShiftJIS, enc: japanese.ShiftJIS, next: dbcsNext(shiftJISTable())},
	}
})

// verdict is the outcome of weighing one encoding over the whole file.
type verdict struct {
	name    string
	enc     encoding.Encoding
	bad     int64 // offset of the first byte that does not decode; -1 when the whole file decodes
	chars   int   // non-ASCII characters seen (up to bad)
	points  float64
	badByte byte
}

// score is the plausibility of the decoded text, 0 (garbage) to 1 (every non-ASCII character as expected).
func (v verdict) score() float64 {
	if v.chars == 0 {
		return 1
	}
	return v.points / float64(v.chars)
}

// Detection thresholds. A decoding is plausible when its score reaches minPlausible; the best one is chosen when
// the runner-up is implausible or trails by at least minMargin, otherwise the file is ambiguous.
const (
	minPlausible = 0.5
	minMargin    = 0.25
)

// AmbiguousEncodingError is the Reason detail of an *InputError for a file that reads plausibly in two encodings
// that disagree: the caller must name the encoding.
type AmbiguousEncodingError struct {
	// Encodings are the two plausible encodings, the better-scoring first.
	Encodings [2]string
	// Samples are the same stretch of the file decoded with each.
	Samples [2]string
}

// Error says what both readings look like and how to choose.
func (e *AmbiguousEncodingError) Error() string {
	return fmt.Sprintf("the encoding is ambiguous: the text reads plausibly both as %s (%q) and as %s (%q); name the encoding (batchgen run --encoding %s, or --encoding %s), or save the file as \"CSV UTF-8\"",
		e.Encodings[0], e.Samples[0], e.Encodings[1], e.Samples[1], e.Encodings[0], e.Encodings[1])
}

// detectEncoding settles the encoding of a text file without a byte-order mark: pure ASCII and valid UTF-8 are
// UTF-8; otherwise every legacy candidate that decodes the whole file is scored by how plausible its text is, and
// the clear winner is taken. It returns the name and decoder (nil for UTF-8).
func (r *Reader) detectEncoding(f *os.File) (string, encoding.Encoding, error) {
	u, err := scanUTF8(f)
	if err != nil {
		return "", nil, fmt.Errorf("read %q: %w", r.file, err)
	}
	if u.invalid == 0 {
		return EncodingUTF8, nil, nil
	}
	if u.valid >= 3 && u.valid >= 4*u.invalid {
		// Legacy text almost never forms valid multi-byte UTF-8 sequences by chance; this is UTF-8 with damage.
		return "", nil, r.fileErr(fmt.Sprintf("not valid UTF-8 text: invalid byte 0x%02X at offset %d (the rest of the file is UTF-8; fix that byte or save the file again as \"CSV UTF-8\")", u.firstBadByte, u.firstBad))
	}
	var valid []verdict
	furthest := verdict{name: EncodingUTF8, bad: u.firstBad, badByte: u.firstBadByte}
	for _, c := range candidates() {
		v, err := weigh(f, c)
		if err != nil {
			return "", nil, fmt.Errorf("read %q: %w", r.file, err)
		}
		if v.bad >= 0 {
			if v.bad > furthest.bad {
				furthest = v
			}
			continue
		}
		valid = append(valid, v)
	}
	if len(valid) == 0 {
		return "", nil, r.fileErr(fmt.Sprintf("not text in any encoding batchgen recognises (%s): invalid byte 0x%02X at offset %d (read as %s, the longest readable start); save the file as \"CSV UTF-8\"",
			detectedEncodings, furthest.badByte, furthest.bad, furthest.name))
	}
	// Stable sort by score, best first (the list is tiny).
	for i := 1; i < len(valid); i++ {
		for j := i; j > 0 && valid[j].score() > valid[j-1].score(); j-- {
			valid[j], valid[j-1] = valid[j-1], valid[j]
		}
	}
	best := valid[0]
	if len(valid) > 1 {
		second := valid[1]
		if second.score() >= minPlausible && best.score()-second.score() < minMargin {
			a, b, err := disagreement(f, best.enc, second.enc)
			if err != nil {
				return "", nil, fmt.Errorf("read %q: %w", r.file, err)
			}
			amb := &AmbiguousEncodingError{Encodings: [2]string{best.name, second.name}, Samples: [2]string{a, b}}
			return "", nil, &InputError{File: r.file, Reason: amb.Error(), cause: amb}
		}
	}
	return best.name, best.enc, nil
}

// utf8Stats counts valid multi-byte sequences and invalid bytes of a file read as UTF-8.
type utf8Stats struct {
	valid, invalid int64
	firstBad       int64
	firstBadByte   byte
}

// scanUTF8 streams f and counts its valid multi-byte UTF-8 sequences and invalid bytes (resynchronising after each
// invalid byte, as a decoder does).
func scanUTF8(f *os.File) (utf8Stats, error) {
	st := utf8Stats{firstBad: -1}
	buf := make([]byte, scanChunk+utf8.UTFMax)
	var off int64 // file offset of buf[0]
	carry := 0
	for {
		n, err := f.ReadAt(buf[carry:carry+scanChunk], off+int64(carry))
		if err != nil && !errors.Is(err, io.EOF) {
			return st, err
		}
		end := carry + n
		atEOF := err != nil
		i := 0
		for i < end {
			c := buf[i]
			if c < utf8.RuneSelf {
				i++
				continue
			}
			if !atEOF && end-i < utf8.UTFMax && !utf8.FullRune(buf[i:end]) {
				break // the rest of this rune is in the next chunk
			}
			r, size := utf8.DecodeRune(buf[i:end])
			if r == utf8.RuneError && size <= 1 {
				if st.firstBad < 0 {
					st.firstBad, st.firstBadByte = off+int64(i), c
				}
				st.invalid++
				i++
				continue
			}
			st.valid++
			i += size
		}
		if atEOF {
			return st, nil
		}
		carry = copy(buf, buf[i:end])
		off += int64(i)
	}
}

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

// asciiClass is what kind of ASCII byte stands next to a run of non-ASCII characters.
type asciiClass uint8

const (
	asciiNone  asciiClass = iota // start or end of file, or a space, digit or punctuation
	asciiLower                   // a-z
	asciiUpper                   // A-Z
)

func classOf(b byte) asciiClass {
	switch {
	case 'a' <= b && b <= 'z':
		return asciiLower
	case 'A' <= b && b <= 'Z':
		return asciiUpper
	}
	return asciiNone
}

// run accumulates one maximal run of non-ASCII characters and judges it once the byte after it is known: what is
// plausible depends on the neighbours (a lone CJK character between two Latin letters, "Cat間orie", is what an
// accented letter misread as a double-byte encoding looks like; three accented letters in a row, "Ãû³Æ", are what
// Chinese misread as Windows-1252 looks like).
type run struct {
	n      int
	first  [2]char
	tiers  [4]int // count per tier
	same   bool   // every character is the same rune (single-byte candidates)
	before asciiClass
}

func (r *run) add(c char) {
	if r.n < len(r.first) {
		r.first[r.n] = c
	}
	if r.n == 0 {
		r.same = true
	} else if c.r != r.first[0].r || c.size != r.first[0].size {
		r.same = false
	}
	r.n++
	r.tiers[c.tier]++
}

// judge returns the run's points, given the ASCII class after it.
func (r *run) judge(latin bool, after asciiClass) float64 {
	if r.n == 0 {
		return 0
	}
	sandwiched := r.before != asciiNone && after != asciiNone
	if !latin {
		pts := float64(r.tiers[tierGood]) + 0.5*float64(r.tiers[tierFair])
		switch {
		case r.n == 1 && sandwiched:
			return 0
		case r.n == 2 && sandwiched:
			return 0.5 * pts
		}
		return pts
	}
	// Windows-1252: accented letters stand alone or in pairs (ção, ões) inside words of ASCII letters.
	switch {
	case r.n >= 3:
		if r.same {
			return 0.5 * float64(r.n) // "°°°", "………": odd, but not a misreading
		}
		return 0
	case r.n == 2:
		a, b := r.first[0], r.first[1]
		switch {
		case (a.upper || a.lower) && (b.upper || b.lower):
			if a.lower && b.upper {
				return 0
			}
			return 2
		case (a.upper || a.lower) && b.tier == tierGood, a.tier == tierGood && (b.upper || b.lower):
			return 1 // a letter and common punctuation: “É
		}
		return 0
	}
	c := r.first[0]
	switch {
	case c.upper && r.before == asciiLower:
		return 0 // "aÉ" does not happen in words
	case c.upper || c.lower:
		return 1
	}
	return c.tier.weight()
}

// weigh decodes the whole file with c (without producing text) and scores it.
func weigh(f *os.File, c *candidate) (verdict, error) {
	v := verdict{name: c.name, enc: c.enc, bad: -1}
	buf := make([]byte, scanChunk+4)
	var off int64
	carry := 0
	var cur run
	for {
		n, err := f.ReadAt(buf[carry:carry+scanChunk], off+int64(carry))
		if err != nil && !errors.Is(err, io.EOF) {
			return v, err
		}
		end := carry + n
		atEOF := err != nil
		i := 0
		for i < end {
			b := buf[i]
			if b < 0x80 {
				cls := classOf(b)
				v.points += cur.judge(c.latin, cls)
				cur = run{before: cls}
				i++
				continue
			}
			ch, need := c.next(buf[i:end], atEOF)
			if need {
				break
			}
			if ch.tier == tierInvalid {
				v.bad, v.badByte = off+int64(i), b
				return v, nil
			}
			cur.add(ch)
			v.chars++
			i += ch.size
		}
		if atEOF {
			v.points += cur.judge(c.latin, asciiNone)
			return v, nil
		}
		carry = copy(buf, buf[i:end])
		off += int64(i)
	}
}

// windows1252Chars describes the bytes 0x80-0xFF of Windows-1252, from the real decoder.
var windows1252Chars = sync.OnceValue(func() *[128]char {
	t := new([128]char)
	common := "€‚„…‘’“”•–—™\u00a0¡£¥§©«®°²³µ·»¼½¾¿×"
	dec := charmap.Windows1252.NewDecoder()
	for b := 0x80; b <= 0xFF; b++ {
		out, err := dec.Bytes([]byte{byte(b)})
		r, _ := utf8.DecodeRune(out)
		c := char{size: 1, r: r, tier: tierFair}
		switch {
		case err != nil || r == utf8.RuneError:
			c.tier = tierInvalid // 0x81, 0x8D, 0x8F, 0x90, 0x9D are unassigned
		case unicode.IsUpper(r):
			c.upper, c.tier = true, tierGood
		case unicode.IsLower(r):
			c.lower, c.tier = true, tierGood
		case strings.ContainsRune(common, r):
			c.tier = tierGood
		}
		t[b-0x80] = c
	}
	return t
})

func windows1252Next(b []byte, _ bool) (char, bool) {
	return windows1252Chars()[b[0]-0x80], false
}

// gb18030Next reads one GB18030 character: one byte (0x80, the euro sign of code page 936), two bytes (GBK) or four
// bytes. It follows golang.org/x/text's decoder byte for byte.
func gb18030Next(b []byte, atEOF bool) (char, bool) {
	c0 := b[0]
	if c0 == 0x80 {
		return char{size: 1, tier: tierFair}, false
	}
	if c0 == 0xFF {
		return char{size: 1}, false
	}
	if len(b) < 2 {
		return char{size: 1}, !atEOF
	}
	c1 := b[1]
	switch {
	case (0x40 <= c1 && c1 < 0x7F) || (0x80 <= c1 && c1 < 0xFF):
		return char{size: 2, tier: gbTable()[int(c0-0x80)*256+int(c1)]}, false
	case 0x30 <= c1 && c1 < 0x40:
		if len(b) < 4 {
			return char{size: 1}, !atEOF
		}
		c2, c3 := b[2], b[3]
		if c2 < 0x81 || c2 == 0xFF || c3 < 0x30 || c3 >= 0x3A {
			return char{size: 1}, false
		}
		v := ((int(c0-0x81)*10+int(c1-0x30))*126+int(c2-0x81))*10 + int(c3-0x30)
		if v >= 39420 && (v < 189000 || v >= 189000+0x100000) {
			return char{size: 1}, false
		}
		return char{size: 4, tier: tierPoor}, false // characters outside GBK: rare in Chinese text
	}
	return char{size: 1}, false
}

// dbcsNext reads one character of a double-byte encoding from a table built by dbcsTable.
func dbcsNext(t *dbcs) func([]byte, bool) (char, bool) {
	return func(b []byte, atEOF bool) (char, bool) {
		c0 := b[0]
		if !t.lead[c0-0x80] {
			return char{size: 1, tier: t.single[c0-0x80]}, false
		}
		if len(b) < 2 {
			return char{size: 1}, !atEOF
		}
		return char{size: 2, tier: t.pair[int(c0-0x80)*256+int(b[1])]}, false
	}
}

// dbcs is a double-byte encoding's character table: which bytes stand alone, which lead a pair, and the tier of
// every byte pair (tierInvalid when it does not decode).
type dbcs struct {
	single [128]tier
	lead   [128]bool
	pair   []tier
}

// dbcsTable builds a table by asking the real decoder about every single byte and byte pair, so that detection
// cannot drift from the decoding that follows it. rank gives the tier of a pair that decodes to r.
func dbcsTable(enc encoding.Encoding, singleTier tier, rank func(c0, c1 byte, r rune) tier) *dbcs {
	t := &dbcs{pair: make([]tier, 128*256)}
	dec := enc.NewDecoder()
	for c0 := 0x80; c0 <= 0xFF; c0++ {
		if out, err := dec.Bytes([]byte{byte(c0)}); err == nil && len(out) > 0 {
			if r, _ := utf8.DecodeRune(out); r != utf8.RuneError {
				// A character on its own (half-width katakana in Shift_JIS), not a lead byte. C1 controls are
				// not text.
				if !unicode.IsControl(r) {
					t.single[c0-0x80] = singleTier
				}
				continue
			}
		}
		for c1 := 0x40; c1 <= 0xFE; c1++ {
			out, err := dec.Bytes([]byte{byte(c0), byte(c1)})
			if err != nil || len(out) == 0 || bytes.ContainsRune(out, utf8.RuneError) {
				continue
			}
			r, _ := utf8.DecodeRune(out)
			t.lead[c0-0x80] = true
			t.pair[(c0-0x80)*256+c1] = rank(byte(c0), byte(c1), r)
		}
	}
	return t
}

// isPUA reports a private-use character: what user-defined areas decode to, never in ordinary text.
func isPUA(r rune) bool { return 0xE000 <= r && r <= 0xF8FF }

// gbTable ranks GBK two-byte characters. GB2312's level-1 hanzi (rows 0xB0-0xD7) are the 3,755 most used
// characters and cover almost all simplified Chinese text; level 2 is rarer; the GBK extension (trail byte below
// 0xA1, or lead below 0xB0 outside the symbol rows) holds traditional and rare characters, which is where an
// accented Latin letter followed by an ASCII letter lands.
var gbTable = sync.OnceValue(func() []tier {
	return dbcsTable(simplifiedchinese.GB18030, tierInvalid, func(c0, c1 byte, r rune) tier {
		ext := c1 < 0xA1
		switch {
		case isPUA(r):
			return tierPoor
		case ext && unicode.Is(unicode.Han, r):
			return tierPoor
		case c0 >= 0xB0 && c0 <= 0xD7:
			return tierGood
		case c0 >= 0xD8 && c0 <= 0xF7:
			return tierFair
		case (c0 == 0xA1 || c0 == 0xA3) && !ext:
			return tierGood // punctuation and full-width forms: ，。：（）
		case c0 == 0xA4 || c0 == 0xA5:
			return tierPoor // kana
		}
		return tierFair
	}).pair
})

// big5Table ranks Big5 characters. Big5 orders its 5,401 frequently used hanzi (rows 0xA4-0xC6) by stroke count,
// and the characters that fill most of running text are the simple ones: rows 0xA4-0xAF (up to about nine strokes)
// are common, the rest of that block and the 7,652 less frequent hanzi (rows 0xC9-0xF9) fair. Row 0xA1 is
// punctuation. Bopomofo and Greek (row 0xA3) and everything else (the HKSCS and ETEN extensions, kana) are rare in
// Traditional Chinese text, and are where Simplified Chinese punctuation (，：（）) lands when GBK is misread.
var big5Table = sync.OnceValue(func() *dbcs {
	return dbcsTable(traditionalchinese.Big5, tierInvalid, func(c0, c1 byte, r rune) tier {
		code := int(c0)<<8 | int(c1)
		switch {
		case isPUA(r):
			return tierPoor
		case code >= 0xA440 && code <= 0xAFFE, c0 == 0xA1:
			return tierGood
		case code >= 0xB040 && code <= 0xC67E, code >= 0xC940 && code <= 0xF9D5, c0 == 0xA2:
			return tierFair
		}
		return tierPoor
	})
})

// shiftJISTable ranks Shift_JIS characters: punctuation, kana, full-width forms and JIS level-1 kanji (0x889F-
// 0x9872) are common; level-2 kanji, Greek, Cyrillic and the NEC/IBM extensions less so; half-width katakana
// (single bytes 0xA1-0xDF) are fair, since old systems still write them.
var shiftJISTable = sync.OnceValue(func() *dbcs {
	return dbcsTable(japanese.ShiftJIS, tierFair, func(c0, c1 byte, r rune) tier {
		code := int(c0)<<8 | int(c1)
		switch {
		case isPUA(r):
			return tierPoor
		case c0 == 0x81, c0 == 0x82, code >= 0x8340 && code <= 0x8396, code >= 0x889F && code <= 0x9872:
			return tierGood
		case code >= 0x989F && code <= 0xEAA4, c0 >= 0x83 && c0 <= 0x87, c0 >= 0xED:
			return tierFair
		}
		return tierPoor
	})
})

// disagreement decodes, with both encodings, the word around the first non-ASCII byte of f, for the ambiguity
// message. Words end at bytes below 0x30 and at ';', which are never part of a multi-byte character in any
// candidate encoding.
func disagreement(f *os.File, a, b encoding.Encoding) (string, string, error) {
	buf := make([]byte, 64<<10)
	var off int64
	for {
		n, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return "", "", err
		}
		if i := bytes.IndexFunc(buf[:n], func(r rune) bool { return r >= utf8.RuneSelf }); i >= 0 {
			start := i
			for start > 0 && i-start < 24 && !isWordEnd(buf[start-1]) {
				start--
			}
			end := i
			for end < n && end-i < 24 && !isWordEnd(buf[end]) {
				end++
			}
			word := buf[start:end]
			sa, _ := a.NewDecoder().Bytes(word)
			sb, _ := b.NewDecoder().Bytes(word)
			return string(sa), string(sb), nil
		}
		if err != nil {
			return "", "", nil
		}
		off += int64(n)
	}
}

func isWordEnd(b byte) bool { return b < 0x30 || b == ';' }

// utf16Decoder is the decoder for a file that starts with a UTF-16 byte-order mark.
func utf16Decoder(big bool) encoding.Encoding {
	if big {
		return xunicode.UTF16(xunicode.BigEndian, xunicode.ExpectBOM)
	}
	return xunicode.UTF16(xunicode.LittleEndian, xunicode.ExpectBOM)
}
