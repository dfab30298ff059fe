// Package sheet reads spreadsheets (xlsx/xlsm and CSV/TSV) as a validated stream of rows and writes the result
// workbook as a stream, so that neither side holds a whole sheet in memory.
//
// Every problem with the input itself is reported as an *InputError whose message names the file, sheet, row,
// column and limit, because those messages go straight back to the person who uploaded the file.
//
// Unusual input reads as follows (testdata/odd pins each case down, testdata/bad each rejection):
//   - A formula gives its cached value; nothing is fetched, references to other workbooks ([1]Sheet1!A1) included. A
//     formula without a cached value (a workbook a program wrote) is computed with excelize's calculator when it
//     can be, and reads as "" when not; Summary.Uncached counts both by column.
//   - A merged region has its value in the top-left cell only; its other cells read as "". That is what the file
//     stores, and copying the value would invent data the sheet shows once. A header merged across columns
//     therefore leaves blank header cells, which are rejected.
//   - Hidden and very hidden sheets are skipped when Options.Sheet is empty; naming them selects them.
//   - Rich text reads as its runs joined; phonetic guides are dropped. Shared and inline strings read the same.
//   - A number reads as its number format shows it: dates (the 1904 date system included), percentages, currency,
//     fractions, scientific notation. The General format shows up to 15 significant digits in full, as the formula
//     bar does; the locale-dependent built-in date formats read as Chinese Excel shows them (2024/1/15). Text cells
//     read as stored, so "00123" and "12345678901234567890" stay exact. Booleans read as TRUE and FALSE, error cells
//     as their text (#DIV/0!, #N/A).
//   - Header cells are trimmed of white space at both ends (newlines, U+3000 and U+00A0 included); white space inside
//     stays. Headers are compared exactly after trimming, so "Name", "name" and "Ｎａｍｅ" are three columns. A header
//     cell has the same limit as any cell, MaxCellChars. Data values are not trimmed (a row of white space only is
//     a blank row).
//   - CSV: a byte-order mark is dropped; CRLF, LF and a lone CR each end a row; a NUL byte rejects the file, naming
//     its row and column. Without a byte-order mark or Options.Encoding, a file that is valid UTF-8 is UTF-8, and
//     otherwise the one of GB18030, Big5, Shift_JIS and Windows-1252 whose text reads plausibly (two close readings
//     are an error naming both). The delimiter is a first line "sep=X", else ",", ";" or tab as sniffed from the
//     first records; a quote inside an unquoted field is text, as in Excel.
//   - Rows without cells cost nothing: a sheet whose last row is 1,048,576 with three data rows reads three rows.
package sheet

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Default limits. They are generous for the motivating workload (a few thousand product rows) and small enough that
// one bad upload cannot exhaust a Lambda's memory or disk.
const (
	DefaultMaxFileBytes     int64 = 100 << 20
	DefaultMaxUnzippedBytes int64 = 1 << 30
	DefaultMaxRows                = 200_000
	DefaultMaxColumns             = 16_384
	DefaultMaxCellChars           = 32_767
)

// Limits bounds what an input may be. Zero (or negative) fields take the defaults.
type Limits struct {
	// MaxFileBytes is the largest on-disk size accepted. Defaults to 100 MiB.
	MaxFileBytes int64
	// MaxUnzippedBytes caps the sum of the uncompressed sizes of an xlsx's zip entries, the zip-bomb guard.
	// Defaults to 1 GiB.
	MaxUnzippedBytes int64
	// MaxRows caps the data rows (header excluded, blank rows in the middle included). Defaults to 200,000.
	MaxRows int
	// MaxColumns caps the header's columns. Defaults to 16,384 (Excel's limit).
	MaxColumns int
	// MaxCellChars caps one cell, header cells included, counted in characters (runes), not bytes. Defaults to
	// 32,767 (Excel's limit).
	MaxCellChars int
}

// withDefaults fills unset fields so the rest of the package never has to think about zero limits.
func (l Limits) withDefaults() Limits {
	l.MaxFileBytes = positiveOr(l.MaxFileBytes, DefaultMaxFileBytes)
	l.MaxUnzippedBytes = positiveOr(l.MaxUnzippedBytes, DefaultMaxUnzippedBytes)
	l.MaxRows = positiveOr(l.MaxRows, DefaultMaxRows)
	l.MaxColumns = positiveOr(l.MaxColumns, DefaultMaxColumns)
	l.MaxCellChars = positiveOr(l.MaxCellChars, DefaultMaxCellChars)
	return l
}

// positiveOr returns v, or def when v is zero or negative (unset).
func positiveOr[T int | int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Options tells Open what to read and how strictly.
type Options struct {
	// Sheet is the worksheet to read. "" picks the first visible sheet whose name is not "prompt"
	// (case-insensitive). An exact name match wins; otherwise a unique case-insensitive match is used.
	// Ignored for CSV/TSV, which have no sheets.
	Sheet string
	// Limits bounds the input; zero fields take the defaults.
	Limits Limits
	// DisplayName is how the file is named in error messages, e.g. the original upload name when path is a
	// temporary file. Defaults to the base name of the path. Its extension ".tsv" also selects tab-separated input.
	DisplayName string
	// Encoding names the text encoding of CSV/TSV input ("windows-1252", "gb18030", "latin1", "sjis", ...: any
	// WHATWG encoding label or Windows code page name). "" detects it: a byte-order mark, else UTF-8 when the file
	// is valid UTF-8, else the plausible one of GB18030, Big5, Shift_JIS and Windows-1252. Ignored for xlsx.
	Encoding string
}

// Record is one data row.
type Record struct {
	// SheetRow is the 1-based row number in the sheet or CSV file, as Excel shows it (for messages).
	SheetRow int
	// Values holds exactly len(Header()) values, "" for missing cells. Values are not trimmed.
	Values []string
	// Blank is true when every cell is empty or white space; the pipeline keeps such rows in place without
	// calling the model. A blank record's Values are all "" (white space is not kept).
	Blank bool
}

// Summary describes a whole input that passed validation.
type Summary struct {
	// Sheet is the worksheet read ("" for CSV/TSV).
	Sheet string
	// Header is the trimmed header texts.
	Header []string
	// Encoding is the text encoding a CSV/TSV file was read with ("utf-8", "windows-1252", ...; "" for xlsx).
	Encoding string
	// Delimiter is the field separator a CSV/TSV file was read with (",", ";", "\t", ...; "" for xlsx).
	Delimiter string
	// Rows counts the data rows Next returns, blank rows in the middle included, trailing blank rows excluded.
	Rows int
	// Prompt is cell A1 of the "prompt" sheet; meaningful only when HasPrompt is true.
	Prompt string
	// HasPrompt reports whether the workbook has a non-blank prompt sheet cell A1.
	HasPrompt bool
	// Uncached counts, by column, the data rows' formulas the file holds no result for (it was written by a
	// program and never saved by a spreadsheet, which would have stored one), computed or not.
	Uncached []UncachedColumn
}

// FormulaCell is a formula cell the file holds no cached result for.
type FormulaCell struct {
	Row, Column int // sheet row, 1-based column
	// Computed is true when the reader computed its value (excelize's calculator); otherwise it reads as "".
	Computed bool
}

// UncachedColumn counts the formulas without a cached result of one column's data rows.
type UncachedColumn struct {
	Column int // 1-based
	// Computed and NotComputed count the cells the reader computed and could not compute; FirstNotComputed is the
	// sheet row of the first of the latter.
	Computed, NotComputed int
	FirstNotComputed      int
}

// rowSource yields the physical rows of one sheet or CSV file. Row numbers strictly increase; rows it skips are
// blank. Errors about the content are *InputError with only Row and Reason set: the Reader fills in the rest.
type rowSource interface {
	next() (row int, cells []string, err error)
	close() error
}

// Reader streams the validated data rows of one sheet. It is not safe for concurrent use.
type Reader struct {
	file      string // display name
	sheet     string
	lim       Limits
	src       rowSource
	header    []string
	headerRow int
	prompt    string
	hasPrompt bool
	// promptRows are the prompt sheet's rows below A1 (PromptRows).
	promptRows [][]string
	encoding   string // CSV/TSV text encoding; "" for xlsx
	delimiter  string // CSV/TSV field separator; "" for xlsx
	formulas   []FormulaCell

	lastRow   int     // sheet row of the last non-blank row read from src (header or data)
	blankNext int     // next blank row to return before held, when blankNext < held.SheetRow
	held      *Record // non-blank record read ahead, returned after the blank rows before it
	returned  int     // data records returned so far
	err       error   // sticky: once Next fails it keeps failing the same way
	closed    bool
}

// Open opens path, detects its format from its content, reads and validates the header and looks ahead to the
// first data row, so that a file with no header or no data rows is rejected here. Errors are *InputError for bad
// input and wrapped I/O errors otherwise. The caller must Close the Reader.
func Open(path string, opts Options) (*Reader, error) {
	name := opts.DisplayName
	if name == "" {
		name = filepath.Base(path)
	}
	lim := opts.Limits.withDefaults()
	r := &Reader{file: name, lim: lim}

	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open spreadsheet %q: %w", name, err)
	}
	src, err := r.openSource(f, opts)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	r.src = src
	if err := r.readHeader(); err != nil {
		_ = r.Close()
		return nil, err
	}
	if err := r.fill(); err != nil {
		_ = r.Close()
		if errors.Is(err, io.EOF) {
			return nil, r.inputErr(0, -1, fmt.Sprintf("the header row (row %d) has no data rows below it", r.headerRow))
		}
		return nil, err
	}
	return r, nil
}

// openSource sniffs the content and builds the matching row source. It owns f from here on: the source closes it,
// or it is closed on error by the caller.
func (r *Reader) openSource(f *os.File, opts Options) (rowSource, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat spreadsheet %q: %w", r.file, err)
	}
	size := fi.Size()
	if size == 0 {
		return nil, r.fileErr("file is empty (0 bytes)")
	}
	if size > r.lim.MaxFileBytes {
		ie := r.fileErr(fmt.Sprintf("file is %s; the limit is %s (configurable)", formatBytes(size), formatBytes(r.lim.MaxFileBytes)))
		ie.cause = ErrFileTooLarge
		return nil, ie
	}
	head := make([]byte, 512)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read spreadsheet %q: %w", r.file, err)
	}
	head = head[:n]
	switch kind := sniff(head); kind {
	case kindZip:
		return r.openXLSX(f, size, opts.Sheet)
	case kindOLE2:
		return nil, r.ole2Error(f)
	case kindText:
		tsv := strings.EqualFold(filepath.Ext(r.file), ".tsv")
		return r.openCSV(f, head, tsv, opts.Encoding)
	default:
		return nil, r.formatErr(kind.reason())
	}
}

// readHeader consumes rows up to the first non-blank one and validates it as the header.
func (r *Reader) readHeader() error {
	for {
		row, cells, err := r.src.next()
		if errors.Is(err, io.EOF) {
			what := "sheet"
			if r.sheet == "" {
				what = "file"
			}
			return r.inputErr(0, -1, "the "+what+" has no header row (every row is blank)")
		}
		if err != nil {
			return r.fixErr(err)
		}
		if IsBlank(cells) {
			continue
		}
		r.headerRow, r.lastRow = row, row
		return r.setHeader(row, cells)
	}
}

// setHeader trims and checks the header: trailing blank cells are dropped, every other cell needs a unique name.
func (r *Reader) setHeader(row int, cells []string) error {
	h := make([]string, len(cells))
	last := -1
	for i, c := range cells {
		h[i] = strings.TrimSpace(c)
		if h[i] != "" {
			last = i
		}
	}
	h = h[:last+1]
	if len(h) > r.lim.MaxColumns {
		return r.inputErr(row, -1, fmt.Sprintf("the header has %d columns; the limit is %d", len(h), r.lim.MaxColumns))
	}
	seen := make(map[string]int, len(h))
	for i, name := range h {
		if err := r.checkCell(row, i, cells[i]); err != nil {
			return err
		}
		if name == "" {
			return &InputError{File: r.file, Sheet: r.sheet, Row: row, Column: ColumnName(i + 1),
				Reason: "header cell is blank but a column to its right has a header; give every column a name"}
		}
		if j, dup := seen[name]; dup {
			return r.inputErr(row, -1, fmt.Sprintf("columns %s and %s are both named %q", ColumnName(j+1), ColumnName(i+1), shorten(name)))
		}
		seen[name] = i
	}
	r.header = h
	return nil
}

// Sheet returns the worksheet being read, or "" for CSV/TSV input (which has no sheets; callers that need a name
// for the result sheet should derive one from the file name).
func (r *Reader) Sheet() string { return r.sheet }

// Encoding returns the canonical name of the text encoding a CSV/TSV file is read with ("utf-8", "windows-1252",
// "gb18030", ...), detected or as asked for in Options.Encoding; "" for xlsx.
func (r *Reader) Encoding() string { return r.encoding }

// Delimiter returns the field separator a CSV/TSV file is read with (",", ";", "\t", ...; "" for xlsx).
func (r *Reader) Delimiter() string { return r.delimiter }

// Header returns the trimmed header texts: none blank, none duplicate. The slice must not be modified.
func (r *Reader) Header() []string { return r.header }

// Prompt returns cell A1 of a sheet named "prompt" (case-insensitive), trimmed, when the workbook has one and the
// cell is not blank. CSV/TSV input never has a prompt.
func (r *Reader) Prompt() (string, bool) { return r.prompt, r.hasPrompt }

// PromptRows are the cells of the prompt sheet's rows below A1, row 2 first (blank rows as empty lists), as far as
// a declaration of output columns may reach; none for a CSV or a workbook without a prompt sheet.
func (r *Reader) PromptRows() [][]string { return r.promptRows }

// Next returns the next data row, io.EOF after the last one, or an *InputError for a bad row (after which every
// call returns the same error). Blank rows in the middle are returned with Blank set; blank rows at the end are
// dropped.
func (r *Reader) Next() (Record, error) {
	if r.err != nil {
		return Record{}, r.err
	}
	if r.closed {
		return Record{}, fmt.Errorf("read %q: reader is closed", r.file)
	}
	if r.held == nil {
		if err := r.fill(); err != nil {
			r.err = err
			return Record{}, err
		}
	}
	var rec Record
	if r.blankNext < r.held.SheetRow {
		rec = Record{SheetRow: r.blankNext, Values: make([]string, len(r.header)), Blank: true}
		r.blankNext++
	} else {
		rec, r.held = *r.held, nil
	}
	r.returned++
	if r.returned > r.lim.MaxRows {
		row, reason := rec.SheetRow, fmt.Sprintf("too many data rows: the limit is %d (configurable)", r.lim.MaxRows)
		if rec.Blank {
			// The limit ran out inside a run of blank rows (say data in rows 2-3 and 1,048,576): naming a blank row
			// would send the user looking at nothing, so name the row that makes the blank ones count.
			row = r.held.SheetRow
			reason += "; the blank rows above this row count too, because they are not at the end of the sheet"
		}
		r.err = r.inputErr(row, -1, reason)
		return Record{}, r.err
	}
	return rec, nil
}

// fill reads ahead to the next non-blank row and holds it, remembering the blank rows before it. It returns io.EOF
// when only blank rows (or nothing) remain, which is how trailing blank rows are dropped.
func (r *Reader) fill() error {
	for {
		row, cells, err := r.src.next()
		if err != nil {
			return r.fixErr(err)
		}
		if len(cells) == 0 {
			// An empty or absent row: a sheet whose last row is 1,048,576 has a million of these.
			continue
		}
		rec, err := r.record(row, cells)
		if err != nil {
			return err
		}
		if rec.Blank {
			continue
		}
		r.blankNext = r.lastRow + 1
		r.lastRow = row
		r.held = &rec
		return nil
	}
}

// record validates one physical data row and shapes it to the header.
func (r *Reader) record(row int, cells []string) (Record, error) {
	for i := len(r.header); i < len(cells); i++ {
		if strings.TrimSpace(cells[i]) != "" {
			return Record{}, &InputError{File: r.file, Sheet: r.sheet, Row: row, Column: ColumnName(i + 1),
				Reason: fmt.Sprintf("cell has a value but its column has no header (the header is row %d)", r.headerRow)}
		}
	}
	vals := make([]string, len(r.header))
	blank := true
	for i := range vals {
		if i >= len(cells) {
			break
		}
		if err := r.checkCell(row, i, cells[i]); err != nil {
			return Record{}, err
		}
		vals[i] = cells[i]
		if blank && strings.TrimSpace(cells[i]) != "" {
			blank = false
		}
	}
	return Record{SheetRow: row, Values: vals, Blank: blank}, nil
}

// checkCell enforces the per-cell limits. NUL bytes only reach here from CSV (XML cannot carry them) and mean the
// file is not really text.
func (r *Reader) checkCell(row, col int, v string) error {
	if len(v) > r.lim.MaxCellChars {
		if n := utf8.RuneCountInString(v); n > r.lim.MaxCellChars {
			limit := "the limit is " + strconv.Itoa(r.lim.MaxCellChars)
			if r.lim.MaxCellChars == DefaultMaxCellChars {
				limit = "Excel's limit is " + strconv.Itoa(DefaultMaxCellChars)
			}
			return r.inputErr(row, col, fmt.Sprintf("cell has %d characters; %s", n, limit))
		}
	}
	if strings.IndexByte(v, 0) >= 0 {
		return r.inputErr(row, col, "cell contains a NUL byte (0x00); the file may be binary, damaged, or UTF-16 text without a byte-order mark")
	}
	return nil
}

// IsBlank reports whether every cell is empty or white space: a blank row, which the pipeline keeps in place
// without calling the model.
func IsBlank(cells []string) bool {
	for _, c := range cells {
		if strings.TrimSpace(c) != "" {
			return false
		}
	}
	return true
}

// inputErr builds an *InputError at row (0 = none) and 0-based column col (-1 = none), naming the header when the
// column has one.
func (r *Reader) inputErr(row, col int, reason string) *InputError {
	e := &InputError{File: r.file, Sheet: r.sheet, Row: row, Reason: reason}
	if col >= 0 {
		e.Column = ColumnName(col + 1)
		if col < len(r.header) {
			e.Header = r.header[col]
		}
	}
	return e
}

// fileErr builds an *InputError about the file as a whole.
func (r *Reader) fileErr(reason string) *InputError {
	return &InputError{File: r.file, Reason: reason}
}

// formatErr is a fileErr for content that is not a format read here.
func (r *Reader) formatErr(reason string) *InputError {
	return &InputError{File: r.file, Reason: reason, cause: ErrUnsupportedFormat}
}

// fixErr completes a source's partial *InputError with the file, the sheet and the header of its column; other
// errors pass through.
func (r *Reader) fixErr(err error) error {
	var ie *InputError
	if errors.As(err, &ie) && !ie.whole {
		ie.File, ie.Sheet = r.file, r.sheet
		if col := columnIndex(ie.Column); ie.Header == "" && col >= 0 && col < len(r.header) {
			ie.Header = r.header[col]
		}
	}
	return err
}

// Close releases the file and any temporary files. It is safe to call more than once.
func (r *Reader) Close() error {
	if r.closed || r.src == nil {
		r.closed = true
		return nil
	}
	r.closed = true
	if err := r.src.close(); err != nil {
		return fmt.Errorf("close spreadsheet %q: %w", r.file, err)
	}
	return nil
}

// uncached summarises the data rows' formulas without a cached result by column, in column order.
func (r *Reader) uncached() []UncachedColumn {
	by := map[int]int{} // column -> index in out
	var out []UncachedColumn
	for _, f := range r.formulas {
		if f.Row <= r.headerRow {
			continue
		}
		i, ok := by[f.Column]
		if !ok {
			i = len(out)
			by[f.Column] = i
			out = append(out, UncachedColumn{Column: f.Column})
		}
		c := &out[i]
		if f.Computed {
			c.Computed++
		} else if c.NotComputed++; c.FirstNotComputed == 0 || f.Row < c.FirstNotComputed {
			c.FirstNotComputed = f.Row
		}
	}
	slices.SortFunc(out, func(a, b UncachedColumn) int { return a.Column - b.Column })
	return out
}

// Validate reads the whole input once (streaming) and returns its summary or the first *InputError, so that a bad
// file is rejected before anything is written.
func Validate(path string, opts Options) (Summary, error) {
	r, err := Open(path, opts)
	if err != nil {
		return Summary{}, err
	}
	for {
		_, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			_ = r.Close()
			return Summary{}, err
		}
	}
	sum := r.Summary()
	if err := r.Close(); err != nil {
		return Summary{}, err
	}
	return sum, nil
}

// Summary describes what was read: the whole input once Next has returned io.EOF (Rows counts the records Next
// returned).
func (r *Reader) Summary() Summary {
	sum := Summary{Sheet: r.Sheet(), Header: r.Header(), Encoding: r.Encoding(), Delimiter: r.Delimiter(), Rows: r.returned, Uncached: r.uncached()}
	sum.Prompt, sum.HasPrompt = r.Prompt()
	return sum
}

// sheetExtensions are the file name extensions of the formats Open reads, lower-case.
var sheetExtensions = []string{".xlsx", ".xlsm", ".csv", ".tsv"}

// IsSheetName reports whether name (a file name, path or object key) ends in the extension of a format Open reads,
// in any letter case: Windows and Excel users save REPORT.XLSX and Data.Csv. Open itself goes by the content (and
// takes ".tsv" in any case as tab-separated); this is for places that must decide from the name alone, such as the
// drop folder.
func IsSheetName(name string) bool {
	base := name[strings.LastIndexAny(name, `/\`)+1:] // a bare extension (".csv") names no file
	for _, ext := range sheetExtensions {
		if len(base) > len(ext) && strings.EqualFold(base[len(base)-len(ext):], ext) {
			return true
		}
	}
	return false
}
