package sheet

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/xuri/excelize/v2"
)

// This file corrects excelize's number formatting where it shows something other than Excel (the golden table
// testdata/numfmt/golden.tsv lists each case with the source of the expected text). It is a wrapper, not a second
// formatter: excelize still renders every cell, and for the format codes below the value is first adjusted, or the
// code rewritten, so that excelize's rendering is Excel's. Only engineering notation is rendered here, because
// excelize has no notion of it. The corrections belong upstream in excelize (v2.11.1 is pinned and cannot be
// patched from here):
//
//   - Rounding: Excel rounds the 15-significant-digit decimal value half away from zero, so 1.005 in "0.00" shows
//     1.01; excelize rounds the binary double (1.00499999999999989...) to 1.00.
//   - Fractional seconds (ss.0, ss.00, ss.000): Excel rounds the time to the displayed precision; excelize
//     truncates, and with a date in front it drops the fraction entirely.
//   - Negative elapsed time ([h]:mm, [mm]:ss, [s]): Excel shows the duration with a minus sign (-36:00); excelize
//     shows the raw serial number.
//   - Engineering notation (##0.0E+0): the exponent is a multiple of the integer digits; excelize prints the
//     number unformatted.
//   - Fractions without an integer part (??/??, 0/100): Excel folds the whole number into the numerator (12.3 is
//     123/10); excelize drops it (3/10), and misreads 0 placeholders. With a # integer part below one Excel leaves
//     the integer blank (" 2/7"); excelize writes "0 2/7".
//
// Colour codes ([Red]) and A/P, AM/PM are rendered correctly by excelize and are pinned by the golden table.

// numFmtFix is what a cell style's number format needs from the fixer; the zero value needs nothing.
type numFmtFix struct {
	id       int    // the style's number format id
	code     string // its code
	builtIn  bool   // id is a built-in format, which excelize renders by id (locale-dependent ones included)
	sections []string
}

// builtInCodes are the built-in formats (ECMA-376 Part 1, §18.8.30) whose codes the fixer must see.
var builtInCodes = map[int]string{
	2: "0.00", 4: "#,##0.00", 7: `"$"#,##0.00_);("$"#,##0.00)`, 8: `"$"#,##0.00_);[Red]("$"#,##0.00)`, 10: "0.00%",
	11: "0.00E+00", 39: "#,##0.00;(#,##0.00)", 40: "#,##0.00;[Red](#,##0.00)", 46: "[h]:mm:ss", 47: "mm:ss.0",
}

// numFormatter renders numbers with excelize's formatter through a scratch workbook, so the fixes can hand it an
// adjusted value or code. It is not safe for concurrent use.
type numFormatter struct {
	f        *excelize.File
	styles   map[string]int // scratch style per format id or code
	date1904 bool
	fixes    map[int]*numFmtFix // by the input workbook's cell style index; nil entries need nothing
}

// newNumFormatter prepares the fixes for the cell styles of xf. It returns nil when no style needs one.
func newNumFormatter(xf *excelize.File) *numFormatter {
	_, _ = xf.GetStyle(-1) // loads the style sheet
	st := xf.Styles
	if st == nil || st.CellXfs == nil {
		return nil
	}
	custom := map[int]string{}
	if st.NumFmts != nil {
		for _, nf := range st.NumFmts.NumFmt {
			code := nf.FormatCode
			if nf.FormatCode16 != "" {
				code = nf.FormatCode16
			}
			custom[nf.NumFmtID] = code
		}
	}
	fixes := map[int]*numFmtFix{}
	for i, x := range st.CellXfs.Xf {
		if x.NumFmtID == nil {
			continue
		}
		code, ok := custom[*x.NumFmtID]
		builtIn := !ok
		if builtIn {
			code = builtInCodes[*x.NumFmtID]
		}
		if code == "" {
			continue
		}
		sections := splitSections(code)
		if fixableSections(sections) {
			fixes[i] = &numFmtFix{id: *x.NumFmtID, code: code, builtIn: builtIn, sections: sections}
		}
	}
	if len(fixes) == 0 {
		return nil
	}
	n := &numFormatter{f: excelize.NewFile(excelize.Options{ShortDatePattern: shortDatePattern, CultureInfo: excelize.CultureNameZhCN}),
		styles: map[string]int{}, fixes: fixes}
	if props, err := xf.GetWorkbookProps(); err == nil && props.Date1904 != nil && *props.Date1904 {
		n.date1904 = true
		_ = n.f.SetWorkbookProps(&excelize.WorkbookPropsOptions{Date1904: props.Date1904})
	}
	return n
}

// close releases the scratch workbook.
func (n *numFormatter) close() {
	if n != nil {
		_ = n.f.Close()
	}
}

// fixCell returns what Excel shows for the number cell raw in cell style s, when that differs from what excelize
// shows; ok is false when excelize is right (or the cell is not one the fixes know).
func (n *numFormatter) fixCell(s int, raw string) (string, bool) {
	if n == nil {
		return "", false
	}
	fix := n.fixes[s]
	if fix == nil {
		return "", false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return "", false
	}
	want, ok := n.display(fix, v)
	if !ok {
		return "", false
	}
	if got := n.render(fix, v); got == want {
		return "", false
	}
	return want, true
}

// display is Excel's text for v, or ok false when excelize's own rendering is the one to keep.
func (n *numFormatter) display(fix *numFmtFix, v float64) (string, bool) {
	idx, sign := pickSection(fix.sections, v)
	if idx < 0 {
		return "", false
	}
	sec := fix.sections[idx]
	body := stripBrackets(sec, false)
	switch {
	case isTimeSection(body):
		return n.displayTime(fix, sec, body, v, sign)
	case strings.ContainsAny(body, "Ee") && exponentSection(body):
		m, ok := engineering(body, math.Abs(v))
		if !ok {
			return "", false
		}
		return sign + m, true
	case strings.Contains(body, "/"):
		return n.displayFraction(sec, body, v, sign)
	default:
		dec, scale := decimalsOf(body)
		// Binary and decimal rounding disagree only next to a half (1.005 is 1.00499999...); everything else,
		// float noise included, is left to excelize without a second rendering.
		x := math.Abs(v*scale) * math.Pow10(dec)
		if math.Abs(x-math.Floor(x)-0.5) > 1e-6 {
			return "", false
		}
		fixed := roundDecimal(v*scale, dec) / scale
		if fixed == v {
			return "", false
		}
		return n.render(fix, fixed), true
	}
}

// displayTime handles fractional seconds and negative elapsed time; other time formats stay with excelize.
func (n *numFormatter) displayTime(fix *numFmtFix, sec, body string, v float64, sign string) (string, bool) {
	frac := fractionalSecondDigits(body)
	elapsed := strings.Contains(lowerASCII(sec), "[h") || strings.Contains(lowerASCII(sec), "[m") ||
		strings.Contains(lowerASCII(sec), "[s")
	if v < 0 && !elapsed {
		return "", false // Excel shows ##### for a negative date or time of day
	}
	if ampm := ampmToken(sec); ampm != "" && !strings.ContainsAny(lowerASCII(body), "h") && frac == 0 {
		// AM/PM or A/P without an hour: excelize decides the half of the day from the hour it did not render.
		secs := math.Mod(math.Round(math.Abs(v)*86400), 86400)
		text := ampmText(ampm, secs >= 12*3600)
		const marker = "\uE001"
		code := strings.Replace(sec, ampm, `"`+marker+`"`, 1)
		return sign + strings.Replace(n.excelize(-1, code, math.Abs(v)), marker, text, 1), true
	}
	if frac == 0 && !(v < 0 && elapsed) {
		return "", false
	}
	a := math.Abs(v)
	code := sec
	if v < 0 && len(fix.sections) > 1 {
		sign = "" // the negative section says how to show it
	} else if v < 0 {
		sign = "-"
	}
	if frac == 0 {
		return sign + n.excelize(-1, code, a), true
	}
	// Round to the displayed precision, hand excelize the whole seconds (which it shows right), and put the
	// rounded fraction where the code had its placeholder.
	unit := math.Pow10(frac)
	total := math.Round(a * 86400 * unit)
	whole, part := math.Floor(total/unit), math.Mod(total, unit)
	const marker = "\uE000"
	code = replaceFractionalSeconds(code, `"`+marker+`"`)
	out := n.excelize(-1, code, (whole+0.25)/86400) // a quarter second: never truncated below whole
	digits := fmt.Sprintf(".%0*d", frac, int64(part))
	return sign + strings.Replace(out, marker, digits, 1), true
}

// render is excelize's text for v in the style's own format.
func (n *numFormatter) render(fix *numFmtFix, v float64) string {
	if fix.builtIn {
		return n.excelize(fix.id, "", v)
	}
	return n.excelize(-1, fix.code, v)
}

// improperFraction is a fraction section without an integer part (??/??, 0/100); hashMixedFraction a mixed one
// whose integer part is only # (# ?/?).
var (
	improperFraction  = regexp.MustCompile(`^[#0?]+/(?:[#0?]+|[1-9][0-9]*)$`)
	hashMixedFraction = regexp.MustCompile(`^#+ +[#0?]+/(?:[#0?]+|[1-9][0-9]*)$`)
	mixedText         = regexp.MustCompile(`^(-?)(\d*)( +(\d+)/(\d+))? *$`)
)

// displayFraction corrects two fraction cases. Without an integer part Excel shows an improper fraction (12.3 in
// ??/?? is 123/10); excelize drops the whole part (3/10). With a # integer part Excel leaves it blank below one
// (0.3 in # ?/? is " 2/7"); excelize writes 0 2/7. Both are rendered through excelize's mixed fraction, which
// chooses the numerator and denominator as Excel does, and reshaped.
func (n *numFormatter) displayFraction(sec, body string, v float64, sign string) (string, bool) {
	a := math.Abs(v)
	if v < 0 && sign == "" {
		return "", false // an explicit negative section: left to excelize
	}
	switch {
	case improperFraction.MatchString(body):
		numPH, denPH, _ := strings.Cut(body, "/")
		// excelize mishandles 0 placeholders in fractions; ? chooses the same digits, and the padding is redone.
		mixed := "# " + strings.ReplaceAll(numPH, "0", "?") + "/"
		if fixedDenominator(denPH) {
			mixed += denPH
		} else {
			mixed += strings.ReplaceAll(denPH, "0", "?")
		}
		m := mixedText.FindStringSubmatch(n.excelize(-1, mixed, a))
		if m == nil {
			return "", false
		}
		whole, _ := strconv.ParseInt(m[2], 10, 64)
		num, den := int64(0), int64(1)
		if m[3] != "" {
			num, _ = strconv.ParseInt(m[4], 10, 64)
			den, _ = strconv.ParseInt(m[5], 10, 64)
		} else if fixedDenominator(denPH) {
			den, _ = strconv.ParseInt(denPH, 10, 64)
		}
		num += whole * den
		return sign + padPlaceholders(strconv.FormatInt(num, 10), numPH, true) + "/" +
			padPlaceholders(strconv.FormatInt(den, 10), denPH, false), true
	case hashMixedFraction.MatchString(body):
		out := n.excelize(-1, sec, a)
		m := mixedText.FindStringSubmatch(out)
		if m == nil || m[2] != "0" || m[3] == "" {
			return "", false
		}
		return sign + strings.TrimPrefix(out, "0"), true
	}
	return "", false
}

// fixedDenominator reports whether a fraction's denominator is a number (/100) rather than placeholders (/??).
func fixedDenominator(den string) bool {
	return den != "" && den[0] >= '1' && den[0] <= '9' && strings.Trim(den, "0123456789") == ""
}

// padPlaceholders pads digits to the width of its placeholders: ? pads with a space, 0 with a zero; numerators
// are aligned right, denominators left. A fixed denominator (100) is written as is.
func padPlaceholders(digits, ph string, right bool) string {
	if fixedDenominator(ph) {
		return digits
	}
	for len(digits) < len(ph) {
		pad := ph[len(ph)-len(digits)-1]
		if !right {
			pad = ph[len(digits)]
		}
		c := ""
		switch pad {
		case '?':
			c = " "
		case '0':
			c = "0"
		default:
			return digits
		}
		if right {
			digits = c + digits
		} else {
			digits += c
		}
	}
	return digits
}

// ampmToken returns the AM/PM or A/P token of a section as written (any case), or "".
func ampmToken(sec string) string {
	lower := lowerASCII(sec)
	for _, tok := range []string{"am/pm", "a/p"} {
		if i := strings.Index(lower, tok); i >= 0 {
			return sec[i : i+len(tok)]
		}
	}
	return ""
}

// ampmText is what an AM/PM or A/P token shows: the half of the day in the token's own letter case.
func ampmText(tok string, pm bool) string {
	am, p, _ := strings.Cut(tok, "/")
	if pm {
		return p
	}
	return am
}

// excelize formats v with the built-in format id, or with code when id is negative.
func (n *numFormatter) excelize(id int, code string, v float64) string {
	key := "code:" + code
	if id >= 0 {
		key = "id:" + strconv.Itoa(id)
	}
	style, ok := n.styles[key]
	if !ok {
		s := &excelize.Style{NumFmt: max(id, 0)}
		if id < 0 {
			s.CustomNumFmt = &code
		}
		var err error
		if style, err = n.f.NewStyle(s); err != nil {
			return strconv.FormatFloat(v, 'f', -1, 64)
		}
		n.styles[key] = style
	}
	_ = n.f.SetCellStyle("Sheet1", "A1", "A1", style)
	_ = n.f.SetCellFloat("Sheet1", "A1", v, -1, 64)
	out, err := n.f.GetCellValue("Sheet1", "A1")
	if err != nil {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return out
}

// splitSections splits a format code at the semicolons outside quotes, brackets and escapes.
func splitSections(code string) []string {
	var out []string
	start, inQuote, inBracket := 0, false, false
	for i := 0; i < len(code); i++ {
		switch c := code[i]; {
		case c == '\\' && !inQuote:
			i++
		case c == '"':
			inQuote = !inQuote
		case c == '[' && !inQuote:
			inBracket = true
		case c == ']' && !inQuote:
			inBracket = false
		case c == ';' && !inQuote && !inBracket:
			out = append(out, code[start:i])
			start = i + 1
		}
	}
	return append(out, code[start:])
}

// fixableSections reports whether a code is one the fixes may change: no conditions, no text section only, and
// at least one section of a kind excelize gets wrong for some values.
func fixableSections(sections []string) bool {
	any := false
	for _, s := range sections {
		if strings.Contains(s, "[<") || strings.Contains(s, "[>") || strings.Contains(s, "[=") {
			return false
		}
		body := stripBrackets(s, false)
		switch {
		case strings.Contains(lowerASCII(body), "general"), strings.Contains(body, "@"):
		case isTimeSection(body):
			lower := lowerASCII(s)
			if fractionalSecondDigits(body) > 0 || strings.Contains(lower, "[h") || strings.Contains(lower, "[m") || strings.Contains(lower, "[s") ||
				(ampmToken(s) != "" && !strings.Contains(lowerASCII(body), "h")) {
				any = true
			}
		case strings.ContainsAny(body, "Ee") && exponentSection(body):
			any = true
		case strings.Contains(body, "/"):
			if improperFraction.MatchString(body) || hashMixedFraction.MatchString(body) {
				any = true
			}
		default:
			if dec, _ := decimalsOf(body); dec > 0 {
				any = true
			}
		}
	}
	return any
}

// pickSection chooses the section Excel uses for v and the sign to put in front; idx is -1 for a text-only code.
func pickSection(sections []string, v float64) (int, string) {
	switch {
	case v > 0 || (v == 0 && len(sections) < 3):
		return 0, ""
	case v == 0:
		return 2, ""
	case len(sections) >= 2:
		return 1, ""
	default:
		return 0, "-"
	}
}

// stripBrackets removes quoted text, escaped characters and bracketed codes ([Red], [$-409]) from a section,
// leaving the placeholders and date tokens. Elapsed-time brackets ([h], [mm], [ss]) are kept when keepElapsed.
func stripBrackets(s string, keepElapsed bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			i++
		case '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
			}
		case '_', '*':
			i++ // _x is a space as wide as x, *x fills with x
		case '[':
			j := strings.IndexByte(s[i:], ']')
			if j < 0 {
				return b.String()
			}
			inner := lowerASCII(s[i+1 : i+j])
			if keepElapsed && inner != "" && strings.Trim(inner, "hms") == "" {
				b.WriteString(s[i : i+j+1])
			} else if inner != "" && strings.Trim(inner, "hms") == "" {
				b.WriteString(inner[:1]) // an elapsed field still makes it a time
			}
			i += j
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// isTimeSection reports whether a stripped section is a date or time format.
func isTimeSection(body string) bool {
	lower := lowerASCII(body)
	if strings.Contains(lower, "e+") || strings.Contains(lower, "e-") {
		return false
	}
	return strings.ContainsAny(lower, "ymdhs") || strings.Contains(lower, "am/pm") || strings.Contains(lower, "a/p")
}

// fractionalSecondDigits counts the 0s after "s." in a time section (ss.000 has 3).
func fractionalSecondDigits(body string) int {
	lower := lowerASCII(body)
	i := strings.LastIndex(lower, "s.")
	if i < 0 {
		return 0
	}
	n := 0
	for _, c := range lower[i+2:] {
		if c != '0' {
			break
		}
		n++
	}
	return min(n, 3)
}

// replaceFractionalSeconds replaces the ".0" run after the seconds in code with repl.
func replaceFractionalSeconds(code, repl string) string {
	lower := lowerASCII(code)
	i := strings.LastIndex(lower, "s.")
	if i < 0 {
		return code
	}
	j := i + 2
	for j < len(code) && code[j] == '0' {
		j++
	}
	return code[:i+1] + repl + code[j:]
}

// exponentSection reports whether a stripped section is scientific notation (E+ or E-).
func exponentSection(body string) bool {
	return strings.Contains(body, "E+") || strings.Contains(body, "E-") || strings.Contains(body, "e+") || strings.Contains(body, "e-")
}

// decimalsOf returns the decimal places a plain number section shows and the factor it scales the value by
// (100 per %, 1/1000 per comma right after the last digit placeholder).
func decimalsOf(body string) (int, float64) {
	scale := 1.0
	scale *= math.Pow(100, float64(strings.Count(body, "%")))
	dec := 0
	if i := strings.IndexByte(body, '.'); i >= 0 {
		for _, c := range body[i+1:] {
			if c == '0' || c == '#' || c == '?' {
				dec++
			} else if c != ',' {
				break
			}
		}
	}
	last := strings.LastIndexAny(body, "0#?")
	for i := last + 1; last >= 0 && i < len(body) && body[i] == ','; i++ {
		scale /= 1000
	}
	return dec, scale
}

// roundDecimal rounds v to dec decimal places the way Excel does: the 15-significant-digit decimal value of v,
// rounded half away from zero, so 1.005 (stored as 1.00499999999999989...) becomes 1.01.
func roundDecimal(v float64, dec int) float64 {
	s := strconv.FormatFloat(math.Abs(v), 'e', 14, 64) // d.dddddddddddddde±x: 15 significant digits
	mant, exp, _ := strings.Cut(s, "e")
	e, _ := strconv.Atoi(exp)
	digits := strings.Replace(mant, ".", "", 1) // 15 digits, the first one before the point
	keep := e + 1 + dec                         // digits left of the rounding position
	if keep < 0 {
		return 0
	}
	if keep >= len(digits) {
		return v
	}
	head := digits[:keep]
	if digits[keep] >= '5' {
		head = incrementDigits(head)
	}
	if head == "" {
		head = "0"
	}
	r, err := strconv.ParseFloat(head+"e"+strconv.Itoa(e+1-keep), 64)
	if err != nil {
		return v
	}
	return math.Copysign(r, v)
}

// incrementDigits adds one to a decimal digit string ("199" -> "200", "" -> "1").
func incrementDigits(d string) string {
	b := []byte(d)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < '9' {
			b[i]++
			return string(b)
		}
		b[i] = '0'
	}
	return "1" + string(b)
}

// engineering renders a non-negative v in a scientific section whose integer part has more than one placeholder:
// Excel then makes the exponent a multiple of that count (##0.0E+0 shows 12345 as 12.3E+3). Sections with one
// integer placeholder (0.00E+00) are left to excelize, which renders them right.
func engineering(body string, v float64) (string, bool) {
	ePos := strings.IndexAny(body, "Ee")
	if ePos < 0 || ePos+2 > len(body) {
		return "", false
	}
	mant, expPart := body[:ePos], body[ePos+1:]
	intPart, fracPart, _ := strings.Cut(mant, ".")
	intPH := strings.Count(intPart, "0") + strings.Count(intPart, "#") + strings.Count(intPart, "?")
	if intPH < 2 || strings.ContainsAny(strings.Trim(intPart, "0#?,"), "0123456789") {
		return "", false
	}
	fracZeros, fracPH := 0, 0
	for _, c := range fracPart {
		switch c {
		case '0':
			fracZeros, fracPH = fracPH+1, fracPH+1
		case '#', '?':
			fracPH++
		}
	}
	minInt := strings.Count(intPart, "0")
	expSign := expPart[0]
	expDigits := strings.Count(expPart, "0")
	if expDigits == 0 || strings.Trim(expPart[1:], "0") != "" {
		return "", false
	}
	exp := 0
	m := v
	if v != 0 {
		exp = int(math.Floor(math.Log10(v)))
		exp = int(math.Floor(float64(exp)/float64(intPH))) * intPH
		m = v / math.Pow10(exp)
		m = roundDecimal(m, fracPH)
		if m >= math.Pow10(intPH) { // rounding carried into another group
			exp += intPH
			m = roundDecimal(v/math.Pow10(exp), fracPH)
		}
	}
	text := strconv.FormatFloat(m, 'f', fracPH, 64)
	ip, fp, _ := strings.Cut(text, ".")
	if ip == "0" && minInt == 0 {
		ip = ""
	}
	for len(ip) < minInt {
		ip = "0" + ip
	}
	for len(fp) > fracZeros && strings.HasSuffix(fp, "0") {
		fp = fp[:len(fp)-1]
	}
	out := ip
	if strings.Contains(mant, ".") {
		out += "." + fp
	}
	es := strconv.Itoa(int(math.Abs(float64(exp))))
	for len(es) < expDigits {
		es = "0" + es
	}
	switch {
	case exp < 0:
		es = "-" + es
	case expSign == '+':
		es = "+" + es
	}
	return out + body[ePos:ePos+1] + es, true
}

// lowerASCII lower-cases ASCII letters only, so indexes into the result are indexes into s (strings.ToLower may
// change the length of text that is not valid UTF-8).
func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
