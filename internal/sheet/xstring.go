package sheet

import (
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// hasXstringEscape reports whether s holds an _xHHHH_ escape.
func hasXstringEscape(s string) bool {
	for i := strings.Index(s, "_x"); i >= 0; {
		if xstringUnit(s[i:]) >= 0 {
			return true
		}
		next := strings.Index(s[i+2:], "_x")
		if next < 0 {
			return false
		}
		i += 2 + next
	}
	return false
}

// xstringUnit returns the UTF-16 code unit of the _xHHHH_ escape s starts with, or -1.
func xstringUnit(s string) int {
	if len(s) < 7 || s[0] != '_' || s[1] != 'x' || s[6] != '_' {
		return -1
	}
	u, err := strconv.ParseUint(s[2:6], 16, 16)
	if err != nil {
		return -1
	}
	return int(u)
}

// decodeXstring decodes the escapes of an ECMA-376 ST_Xstring (Part 1, §22.9.2.19): _xHHHH_ stands for the UTF-16
// code unit HHHH, which is how Excel stores characters XML cannot hold (_x000D_ is a carriage return). _x005F_ is
// an escaped underscore, so _x005F_x000D_ is the literal text "_x000D_". A surrogate pair written as two escapes
// becomes its one character; a lone surrogate becomes U+FFFD.
func decodeXstring(s string) string {
	if !strings.Contains(s, "_x") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		u := xstringUnit(s[i:])
		if u < 0 {
			b.WriteByte(s[i])
			i++
			continue
		}
		i += 7
		r := rune(u)
		if utf16.IsSurrogate(r) {
			r = utf8.RuneError
			if lo := xstringUnit(s[i:]); u < 0xDC00 && lo >= 0xDC00 && lo <= 0xDFFF {
				r = utf16.DecodeRune(rune(u), rune(lo))
				i += 7
			}
		}
		b.WriteRune(r)
	}
	return b.String()
}
