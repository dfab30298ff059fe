package sheet

import (
	"math"
	"strconv"
	"time"
	"unicode/utf16"
)

// Value is one cell a result adds beside the input: text, a number or a boolean. Numbers and booleans are written
// as Excel numbers and booleans, so a column of token counts sums and sorts without Excel flagging "number stored
// as text". The zero Value is an empty cell, which is not written at all.
type Value struct {
	kind valueKind
	text string
	num  float64
}

type valueKind uint8

const (
	emptyValue valueKind = iota
	textValue
	numberValue
	boolValue
	// dateValue holds the day's serial number (1900 date system) in num and its ISO 8601 text in text.
	dateValue
)

// Text is a text cell. It is always stored as text, never as a formula or a number: "=SUM(A1)", "+1" and "00123"
// read back as exactly that. "" is an empty cell.
func Text(s string) Value {
	if s == "" {
		return Value{}
	}
	return Value{kind: textValue, text: s}
}

// Number is a numeric cell. NaN and infinities, which a cell cannot hold, are written as their text.
func Number(f float64) Value {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return Text(strconv.FormatFloat(f, 'g', -1, 64))
	}
	return Value{kind: numberValue, num: f}
}

// Int is a numeric cell holding n.
func Int(n int64) Value { return Number(float64(n)) }

// Bool is a boolean cell (TRUE or FALSE in Excel).
func Bool(b bool) Value {
	if b {
		return Value{kind: boolValue, num: 1}
	}
	return Value{kind: boolValue}
}

// Date is a date cell: the day's serial number with DateFormat in a workbook, its ISO 8601 text (2026-12-01) in a
// CSV file and in String. The time of day is dropped. A date Excel cannot hold (before 1900 or after 9999) is
// written as its text.
func Date(t time.Time) Value {
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	text := day.Format(time.DateOnly)
	if day.Year() < 1900 || day.Year() > 9999 {
		return Text(text)
	}
	// Serial numbers count days from 1899-12-30, because Excel counts a 29 February 1900 that never was; the
	// two months before it are one day off that count.
	serial := day.Sub(time.Date(1899, 12, 30, 0, 0, 0, 0, time.UTC)).Hours() / 24
	if day.Before(time.Date(1900, 3, 1, 0, 0, 0, 0, time.UTC)) {
		serial--
	}
	return Value{kind: dateValue, num: serial, text: text}
}

// IsEmpty reports whether v is the empty cell.
func (v Value) IsEmpty() bool { return v.kind == emptyValue }

// String returns the value as a cell shows it in the General format: the text, the number (up to 15 significant
// digits, as Excel shows them) or TRUE/FALSE.
func (v Value) String() string {
	switch v.kind {
	case textValue, dateValue:
		return v.text
	case numberValue:
		return formatNumber(v.num)
	case boolValue:
		if v.num != 0 {
			return "TRUE"
		}
		return "FALSE"
	}
	return ""
}

// formatNumber writes a number as the shortest text that reads back as the same float64, in plain digits for
// integers up to 2^53 (Excel reads "1e+06" too, but a person opening the XML should not have to).
func formatNumber(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// MaxCellChars is the most characters (UTF-16 units, as Excel counts them) one cell can hold.
const MaxCellChars = 32_767

// truncateCell cuts s to Excel's cell limit at a character boundary; ok is false when it had to.
func truncateCell(s string) (string, bool) {
	if len(s) <= MaxCellChars { // bytes >= UTF-16 units, so short strings need no count
		return s, true
	}
	units := 0
	for i, r := range s {
		units += utf16.RuneLen(r)
		if units > MaxCellChars {
			return s[:i], false
		}
	}
	return s, true
}
